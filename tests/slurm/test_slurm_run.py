"""`tandem slurm` on a real Slurm (tests/slurm/cluster.py: munged, slurmctld, three slurmd
nodes on network-namespace hosts). One short GRPO run is submitted from the login host:

    n1 (batch host)   coordinator, reward service, trainer node A  } torchrun, c10d rendezvous on n1,
    n2                trainer node B                               } one rank per node
    n3                generators 0 and 1

then, once the run's coordinator is up, a second job of one more generator (`--join 1`). Once
that generator has served a rollout and the run has a checkpoint, the run's job is requeued
(`scontrol requeue`, what a preemption does): it must come back, resume from that checkpoint
and finish all its steps. Checked: the steps and samples, where each service ran, that every
generator (the joined one included) served rollouts, that the joined generator drains when the
run ends (the run's script signals the join job's script, which sends SIGTERM to the
generator's own process), and that nothing is left (no job, no daemon, no process in the
namespaces). The requeued run's old coordinator dismisses the joined generator as it goes, so
the new incarnation runs without it. Needs root (namespaces) and Debian's slurm-wlm and munge,
which scripts/setup.sh installs when run as root.
"""

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.slurm.cluster import SUBNET, SlurmCluster

ROOT = Path(__file__).resolve().parents[2]
STEPS = 24  # steps take ~0.3 s: the run must still be going when the requeue comes
SHORT_JOB = ["sft.max_num_steps=0", f"grpo.max_num_steps={STEPS}", "grpo.num_prompts_per_step=8",
             "grpo.num_generations_per_prompt=4", "grpo.max_val_samples=16", "grpo.val_period=0",
             "policy.train_global_batch_size=32", "policy.train_micro_batch_size=32", "data.num_train=500",
             "data.num_val=16", "checkpointing.save_period=2", "logger.tensorboard_enabled=false",
             "logger.plot_enabled=false", "logger.run_name=slurm", "cluster.num_nodes=2", "cluster.trainer_ranks=2",
             "cluster.num_generators=2", "cluster.startup_timeout_s=600"]

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.timeout(1500),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons on network-namespace hosts")]


@pytest.fixture
def cluster():
    missing = [tool for tool in ("slurmctld", "slurmd", "munged", "nsenter") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{missing} not installed: run scripts/setup.sh as root (it installs slurm-wlm and munge)")
    started = time.perf_counter()
    slurm = SlurmCluster(num_nodes=3).start()
    print(f"\nslurm cluster up in {time.perf_counter() - started:.1f}s")
    try:
        yield slurm
    finally:
        clock = time.perf_counter()
        leftovers = slurm.stop()
        print(f"slurm cluster down in {time.perf_counter() - clock:.1f}s")
        assert not leftovers, f"left behind after the test: {leftovers}"
        assert not slurm.base.exists() and not any(ns in os.listdir("/run/netns") for ns in slurm.namespaces)


def _wait(what: str, ready, timeout_s: float, slurm: SlurmCluster, run_dir: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"{what} within {timeout_s:.0f}s\n{_logs(run_dir)}\n{slurm.logs_tail()}")


def _logs(run_dir: Path) -> str:
    parts = []
    for path in sorted((run_dir / "slurm" / "logs").glob("*.log")) + [run_dir / "logs" / "coordinator.log"]:
        if path.exists():
            parts.append(f"== {path.name}\n{path.read_text(errors='replace')[-2500:]}")
    return "\n".join(parts)


def _events(run_dir: Path, event: str) -> list[dict]:
    path = run_dir / "logs" / "coordinator.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if f'"{event}"' in line]


def _submit(slurm: SlurmCluster, env: dict, *args: str) -> str:
    done = slurm.login([sys.executable, "-m", "coordinator.cli", "slurm", *SHORT_JOB, *args, "--submit"],
                       env=env, cwd=ROOT)
    match = re.search(r"submitted job (\d+)", done.stdout)
    assert match, done.stdout + done.stderr
    return match.group(1)


def test_run_as_slurm_jobs_with_a_joining_generator_and_a_requeue(cluster, tmp_path):
    from coordinator.embedded.tiny_model import ensure_tiny_model

    started = time.perf_counter()
    env = {"TANDEM_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT), "TANDEM_TOKEN": ""}
    ensure_tiny_model(tmp_path / "cache")  # once, before every node would build it
    runs = tmp_path / "runs"
    run_dir = runs / "slurm"
    job = _submit(cluster, env, f"logger.log_dir={runs}")
    assert (run_dir / "token").stat().st_mode & 0o777 == 0o600
    _wait("the run's coordinator up", lambda: (run_dir / "slurm" / "coordinator").exists(), 120, cluster, run_dir)
    joined = _submit(cluster, env, f"logger.log_dir={runs}", "--join", "1")

    join_logs = run_dir / "slurm" / "logs"
    _wait("the joined generator serving", lambda: any('"generate_served"' in p.read_text(errors="replace")
                                                      for p in join_logs.glob(f"generator-join-{joined}-*")),
          900, cluster, run_dir)  # before the requeue, which ends its part in the run (see the module's note)
    checkpoint = run_dir / "checkpoints" / "latest"
    _wait("a first checkpoint", checkpoint.exists, 900, cluster, run_dir)
    cluster.login(["scontrol", "requeue", job])  # what a preemption does: the job starts over
    batch = run_dir / "slurm" / "logs" / f"batch-{job}.log"
    state = _wait("the job requeued", lambda: ("pending" if f"{job} PENDING" in cluster.jobs() else
                                               "started" if "restart 1" in batch.read_text() else None),
                  120, cluster, run_dir)
    if state == "pending":  # a requeued job may start again only after a delay (two minutes here): start it now
        cluster.login(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)
    _wait("the run finished", lambda: (run_dir / "summary.json").exists() and not cluster.jobs(), 900, cluster, run_dir)
    print(f"slurm run: {time.perf_counter() - started:.1f}s from submission to the last job's end")

    batch = batch.read_text()
    assert "restart 1" in batch and "tandem: coordinator exited 0" in batch, _logs(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["grpo_steps"] == STEPS and summary["samples"] == STEPS * 8 * 4
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["phase"] == "grpo"]
    assert steps == list(range(1, STEPS + 1)), steps  # each step once: the requeued job went on, not over
    resumed = _events(run_dir, "resumed")
    assert len(resumed) == 1 and resumed[0]["step"] in range(2, STEPS, 2), resumed

    members = _events(run_dir, "member_joined")
    hosts = {(m["kind"], m["address"].split(":")[0]) for m in members}
    n1, n2, n3 = (f"{SUBNET}.{10 + i}" for i in (1, 2, 3))
    assert ("reward", n1) in hosts and ("generator", n3) in hosts, hosts
    assert {h for k, h in hosts if k == "trainer"} <= {n1, n2}, hosts
    logs = run_dir / "slurm" / "logs"
    generator_logs = sorted(logs.glob(f"generator-[01]-{job}.[01].log")) + sorted(logs.glob(f"generator-join-{joined}-*"))
    assert len(generator_logs) == 5, sorted(p.name for p in logs.iterdir())  # 2 in each incarnation, 1 joined
    for path in generator_logs:
        assert '"generate_served"' in path.read_text(errors="replace"), f"{path.name} served no rollout:\n{_logs(run_dir)}"
    for restart in (0, 1):
        ranks = [_ranks(path.read_text(errors="replace")) for path in sorted(logs.glob(f"trainer-{job}.{restart}-n*"))]
        assert sorted(ranks, key=sorted) == [{0}, {1}], ranks  # one rank of the trainer on each of n1, n2
    joined_log = generator_logs[-1].read_text(errors="replace")  # ended by the run: `scancel --batch --signal=TERM`
    assert '"service_draining"' in joined_log and '"exit_code": 0, "event": "service_stopping"' in joined_log
    assert "CANCELLED" not in joined_log  # Slurm signalled no process of its step: the drain's SIGTERM went to
    # the generator's own process only, so vLLM's engine stayed up until the generator closed it


def _ranks(log: str) -> set[int]:
    """The torch ranks that logged in a trainer node's output (structured lines carry `rank`)."""
    found = set()
    for line in log.splitlines():
        if line.startswith("{") and '"rank"' in line:
            found.add(json.loads(line)["rank"])
    return found
