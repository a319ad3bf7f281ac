"""A trainer and then the coordinator killed during one `tandem run`, on real processes:

- kill -9 of the trainer's rank 0 mid-run: the coordinator notices, relaunches the trainer,
  loads the last checkpoint into it and goes on; the generator keeps running (same pid);
- kill -9 of the coordinator: running the same command again resumes the run by itself
  (it has a checkpoint and did not finish); the services that outlived the coordinator
  re-register with the new one and are adopted, not restarted (same pids);
- the run ends with every GRPO step logged once and the expected samples; `tandem status`
  showed each service with its kind, weight version, load and health meanwhile.
Prints the measured trainer restart-to-resume time (pytest -s shows it).
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests import procs
from tests.integration import run_files as run

pytestmark = pytest.mark.integration

STEPS = 12  # enough that the coordinator is killed mid-GRPO even on a quiet, fast box
ARGS = ["run", "sft.max_num_steps=0", f"grpo.max_num_steps={STEPS}", "grpo.val_period=0", "grpo.max_val_samples=8",
        "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=16",
        "policy.train_micro_batch_size=16", "checkpointing.save_period=1", "data.num_train=200", "data.num_val=8",
        "cluster.trainer_ranks=1", "cluster.num_generators=1", "logger.plot_enabled=false",
        "logger.tensorboard_enabled=false", "logger.log_dir=runs", "logger.run_name=restarts"]


def _wait(proc: subprocess.Popen, condition, what: str, timeout_s: float = 400) -> None:
    procs.wait_until(proc, condition, what, timeout_s=timeout_s, output=lambda: proc.stdout.read())


def test_a_killed_trainer_and_a_killed_coordinator_are_restarted_and_the_run_resumes(tmp_path):
    run_dir = tmp_path / "runs" / "restarts"
    first = procs.tandem_cli(*ARGS, cwd=tmp_path, home=tmp_path / "home")
    second = None
    try:
        _wait(first, lambda: len(run.grpo_steps(run_dir)) >= 2, "GRPO step 2")
        status = subprocess.run([sys.executable, "-m", "coordinator.cli.main", "status", "--run-dir", str(run_dir)],
                                capture_output=True, text=True, timeout=60,
                                env={**{k: v for k, v in os.environ.items() if k != "TANDEM_TOKEN"}, "COLUMNS": "200"})
        assert status.returncode == 0, status.stdout + status.stderr
        for word in ("trainer", "generator", "reward", "healthy", "/256"):  # kinds, health, load in-flight/capacity
            assert word in status.stdout, status.stdout

        before = run.services(run_dir)
        rank0 = run.torchrun_rank(before["trainer"], 0)
        os.kill(rank0, signal.SIGKILL)
        killed_at = len(run.grpo_steps(run_dir))
        _wait(first, lambda: any(e["event"] == "trainer_restarted" for e in run.events(run_dir)), "the trainer restart")
        restarted = next(e for e in run.events(run_dir) if e["event"] == "trainer_restarted")
        assert restarted["step"] <= killed_at  # back to the last checkpoint
        after_trainer = run.services(run_dir)
        assert after_trainer["trainer"] != before["trainer"]
        assert after_trainer["generator-0"] == before["generator-0"]  # the generator kept running
        print(f"\ntrainer kill -9 -> resumed: relaunch {restarted['relaunch_s']:.1f}s, "
              f"restart-to-resume {restarted['restart_to_resume_s']:.1f}s")

        _wait(first, lambda: len(run.grpo_steps(run_dir)) >= restarted["step"] + 1, "a step after the restart")
        os.kill(first.pid, signal.SIGKILL)  # the coordinator dies; its services live on in their own sessions
        first.wait(timeout=30)
        assert len(run.grpo_steps(run_dir)) < STEPS, "the run finished before the coordinator was killed"
        sessions_before = sum(e["event"] == "registered" for e in run.events(run_dir, "generator-0"))

        second = procs.tandem_cli(*ARGS, cwd=tmp_path, home=tmp_path / "home")  # no --resume: it resumes by itself
        out, _ = second.communicate(timeout=600)
        assert second.returncode == 0, out
        assert "resumed from" in out
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["grpo_steps"] == STEPS and summary["samples"] == STEPS * 16
        assert run.grpo_steps(run_dir) == list(range(1, STEPS + 1))  # every step once, none lost or repeated
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert all(r["num_samples"] == 16 for r in rows if r["phase"] == "grpo")
        events = run.events(run_dir)
        adopted = next(e for e in events if e["event"] == "services_adopted" and e["names"])
        assert set(adopted["names"]) == {"trainer", "generator-0", "reward-arithmetic"}
        assert adopted["pids"] == after_trainer  # the same processes, not restarted
        assert not [e for e in events[events.index(adopted):] if e["event"] == "service_started"]
        generator_events = [e["event"] for e in run.events(run_dir, "generator-0")]
        # it noticed the new coordinator: a heartbeat failed meanwhile (lost, then back), or the new
        # one was up within a heartbeat interval and did not know it (forgot_member)
        assert (("coordinator_lost" in generator_events and "coordinator_back" in generator_events)
                or "coordinator_forgot_member" in generator_events), generator_events
        assert generator_events.count("registered") > sessions_before  # it re-registered, without restarting
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
        run.kill_services(run_dir)
