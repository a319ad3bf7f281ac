"""kill -9 of what a local `tandem run` launched, one after another during GRPO, on real processes
(2 torchrun trainer ranks, 1 vLLM generator, 1 reward service):

1. the only generator (its whole process group): it is relaunched, the rollout waits for it and
   goes on; meanwhile the console says every few seconds that the run waits for a generator;
2. the reward service: relaunched, its calls retried on the new one;
3. trainer rank 1 (a torchrun child other than rank 0): the trainer is relaunched and the loop
   resumes from the last checkpoint, as for rank 0.

The run finishes with every step and every sample; `tandem status` and the step metrics count
the relaunches. Prints how long each fault took to recover (pytest -s shows it).
"""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests import procs
from tests.integration import run_files as run

pytestmark = pytest.mark.integration

STEPS = 40  # a quiet box runs a step in ~0.2 s: enough that all three faults land before the end
ARGS = ["run", "sft.max_num_steps=0", f"grpo.max_num_steps={STEPS}", "grpo.val_period=0", "grpo.max_val_samples=8",
        "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=16",
        "policy.train_micro_batch_size=8", "checkpointing.save_period=1", "data.num_train=200", "data.num_val=8",
        "cluster.trainer_ranks=2", "cluster.num_generators=1", "cluster.restart_backoff_s=0.5",
        "logger.plot_enabled=false", "logger.tensorboard_enabled=false", "logger.log_dir=runs",
        "logger.run_name=faults"]


class Output:
    """The run's console output, read as it comes."""

    def __init__(self, proc: subprocess.Popen):
        self.text = ""
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.text += line


def _wait(proc, out: Output, condition, what: str, timeout_s: float = 600) -> float:
    return procs.wait_until(proc, condition, what, timeout_s=timeout_s, output=lambda: out.text)


def _back(run_dir: Path, name: str, kind: str) -> bool:
    """The launcher relaunched service `name` and a service of `kind` registered after that (a
    quick comeback is covered by the callers' retries, so the run need not notice it missing)."""
    found = run.events(run_dir)
    relaunched = [i for i, e in enumerate(found) if e["event"] == "service_relaunched" and e.get("name") == name]
    return bool(relaunched) and any(e["event"] == "member_joined" and e.get("kind") == kind
                                    for e in found[relaunched[0]:])


def _kill_and_recover(proc, out, run_dir: Path, kill, done, what: str) -> str:
    """Kill something after the next step, wait for `done` and one more step; returns a timing line."""
    steps = len(run.grpo_steps(run_dir))
    _wait(proc, out, lambda: len(run.grpo_steps(run_dir)) > steps, f"a step before killing {what}")
    killed_after = len(run.grpo_steps(run_dir))
    kill()
    recovered = _wait(proc, out, done, f"{what} to come back")
    _wait(proc, out, lambda: len(run.grpo_steps(run_dir)) > killed_after, f"a step after {what} came back")
    return f"{what}: killed after step {killed_after}, back in {recovered:.1f}s"


def test_each_killed_service_comes_back_and_the_run_finishes_every_step_and_sample(tmp_path):
    run_dir = tmp_path / "runs" / "faults"
    env = {**os.environ, "TANDEM_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    env.pop("TANDEM_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli.main", *ARGS], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    out, timings = Output(proc), []
    try:
        _wait(proc, out, lambda: len(run.grpo_steps(run_dir)) >= 1, "GRPO step 1", timeout_s=900)
        timings.append(_kill_and_recover(
            proc, out, run_dir, lambda: os.killpg(run.services(run_dir)["generator-0"], signal.SIGKILL),
            lambda: _back(run_dir, "generator-0", "generator"), "the only generator"))
        timings.append(_kill_and_recover(
            proc, out, run_dir, lambda: os.killpg(run.services(run_dir)["reward-arithmetic"], signal.SIGKILL),
            lambda: _back(run_dir, "reward-arithmetic", "reward"), "the reward service"))
        status = subprocess.run([sys.executable, "-m", "coordinator.cli.main", "status", "--run-dir", str(run_dir)],
                                check=False, capture_output=True, text=True, timeout=60, env=env)
        assert "relaunched: generator-0 x1, reward-arithmetic x1" in status.stdout, status.stdout + status.stderr
        timings.append(_kill_and_recover(
            proc, out, run_dir, lambda: os.kill(run.torchrun_rank(run.services(run_dir)["trainer"], 1), signal.SIGKILL),
            lambda: any(e["event"] == "trainer_restarted" for e in run.events(run_dir)), "trainer rank 1"))
        _wait(proc, out, lambda: proc.poll() is not None, "the end of the run")
        assert proc.returncode == 0, out.text[-5000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        run.kill_services(run_dir)
    print("\n" + "\n".join(timings))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["grpo_steps"] == STEPS and summary["samples"] == STEPS * 16
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if r["phase"] == "grpo"]
    assert [r["step"] for r in grpo] == list(range(1, STEPS + 1))  # every step once
    # The step-0 check sampled the weights the generator loaded; step 1's publish was the first.
    assert next(r["step"] for r in rows if r["phase"] == "val") == 0
    assert (grpo[0]["generation_weight_version"], grpo[0]["weight_version"]) == (0, 1), grpo[0]
    assert all(r["num_samples"] == 16 for r in grpo)  # every sample
    assert grpo[-1]["service_restarts"] == 3  # generator, reward service, trainer
    assert out.text.count("waiting for a generator") >= 2  # said on the console every few seconds
    assert "waiting for the trainer" in out.text  # (a reward service is back within its callers' retries, ~1 s)
    relaunched = [e["name"] for e in run.events(run_dir) if e["event"] == "service_relaunched"]
    assert relaunched == ["generator-0", "reward-arithmetic"]  # the trainer is the loop's to restart
    restarted = next(e for e in run.events(run_dir) if e["event"] == "trainer_restarted")
    print(f"trainer rank 1 -> resumed from step {restarted['step']}: restart-to-resume "
          f"{restarted['restart_to_resume_s']:.1f}s")
