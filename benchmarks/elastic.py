"""What failures and restarts cost, measured on real local services (the embedded tiny model,
1 trainer rank, 2 vLLM generators, 1 reward service):

    .venv/bin/python benchmarks/elastic.py --repeats 3

Prints, each over --repeats tries (min / median / max):
- detect (kill -9): a generator's process group killed mid-rollout -> the rollout reports it failed;
- detect (hang): a generator stopped with SIGSTOP mid-rollout (its connection stays open) ->
  membership drops it (heartbeat timeout) and the rollout re-sends its prompts;
- re-form: a publish that forms a new weight-sync epoch (the membership changed) against one
  to the same group;
- checkpoint save / load: the trainer's DCP state (model, optimizer, RNG) plus the loop state;
- trainer restart-to-resume: kill -9 of the trainer -> relaunched, registered, the checkpoint
  loaded and the restored weights published to the generators.
A spawned replacement generator's start-up (process start -> registered) is printed too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import structlog

from coordinator.algorithms.grpo import grpo_step
from coordinator.config import load_config
from coordinator.data.examples import read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import ensure_tiny_model
from coordinator.launch.launcher import ServiceSpec, python_module
from coordinator.launch.local import LocalCluster
from coordinator.launch.specs import generator_settings, scratch_root
from coordinator.loop.context import LoopContext


def _figure(name: str, values: list[float]) -> None:
    print(f"{name:<34} {min(values):7.3f}  {statistics.median(values):7.3f}  {max(values):7.3f} s  (n={len(values)})",
          flush=True)


def _spawn(ctx, cluster, index: int) -> float:
    """Start generator-<index>; returns seconds until it registered."""
    name = f"generator-{index}"
    settings = generator_settings(ctx.cfg, cluster.model_dir, index, scratch_root(cluster.run_dir) / name)
    path = cluster.run_dir / "services" / f"{name}.json"
    path.write_text(settings.model_dump_json())
    before = {m.member_id for m in cluster.registry.live("generator")}
    started = time.monotonic()
    cluster.launcher.start(ServiceSpec(name, python_module(
        "generator_svc", "--settings", str(path), "--host", ctx.cfg.cluster.host, "--coordinator", cluster.address),
        essential=False))
    cluster.registry.wait_for(lambda ms: any(m.kind == "generator" and m.member_id not in before for m in ms), 600)
    return time.monotonic() - started


def _fail_one_mid_rollout(ctx, cluster, sig: int, step: int) -> float:
    """Send `sig` to a busy generator during a step; seconds until the rollout reports it failed."""
    victim = ctx.generators()[-1]
    pid = next(m.pid for m in cluster.registry.live("generator") if m.member_id == victim.member_id)
    seen, hit = [], []
    original = ctx.services.generator_failed
    ctx.services.generator_failed = lambda h, e: (seen.append(time.monotonic()), original(h, e))

    def hit_when_busy() -> None:
        while victim.client.info(timeout_s=5).num_running == 0:
            time.sleep(0.01)
        os.killpg(pid, sig)
        hit.append(time.monotonic())

    thread = threading.Thread(target=hit_when_busy, daemon=True)
    thread.start()
    grpo_step(ctx, step)
    thread.join(timeout=30)
    del ctx.services.generator_failed  # back to the method
    if sig == signal.SIGSTOP:
        os.killpg(pid, signal.SIGKILL)
    return seen[0] - hit[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tandem-elastic-"))
    cfg = load_config(overrides=["cluster.num_generators=2", "cluster.trainer_ranks=1", f"logger.log_dir={root}",
                                 "logger.tensorboard_enabled=false", "policy.generation.max_new_tokens=24",
                                 "cluster.max_service_restarts=0"])  # it kills and spawns generators itself
    model_dir = str(ensure_tiny_model(cache_root()))
    train_path, _ = ensure_arithmetic_dataset(cache_root(), 0, 500, 16)
    run_dir = root / "run"
    (run_dir / "logs").mkdir(parents=True)
    log = structlog.get_logger()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings and up
    figures: dict[str, list[float]] = {k: [] for k in ("kill", "hang", "spawn", "reform", "same", "save", "load",
                                                       "restart")}
    cluster = LocalCluster(cfg, model_dir, run_dir, "bench-token", log)
    with cluster as services:
        tokens = Tokens(model_dir)
        ctx = LoopContext.connect(cfg, services, tokens, read_examples(train_path, cfg.data, tokens), 0, log,
                                  op_timeout_s=10.0)
        ctx.publish()
        step, index = 0, 2
        for _ in range(args.repeats):
            for sig, key in ((signal.SIGKILL, "kill"), (signal.SIGSTOP, "hang")):
                step += 1
                figures[key].append(_fail_one_mid_rollout(ctx, cluster, sig, step))
                figures["spawn"].append(_spawn(ctx, cluster, index))
                index += 1
                ctx.generators()  # the newcomer is caught up by a publish to it alone
                figures["reform"].append(ctx.publish().duration_s)  # a new epoch: the membership changed
                figures["same"].append(ctx.publish().duration_s)
            started = time.perf_counter()
            ctx.services.trainer.save_checkpoint(str(root / "ckpt"))
            figures["save"].append(time.perf_counter() - started)
            started = time.perf_counter()
            ctx.services.trainer.load_checkpoint(str(root / "ckpt"))
            figures["load"].append(time.perf_counter() - started)
            figures["restart"].append(_restart_trainer(ctx, cluster, root / "ckpt"))
    shutil.rmtree(root, ignore_errors=True)
    print(f"\nembedded model, 1 trainer rank, 2 generators ({os.cpu_count()} cores)   min  median  max")
    names = {"kill": "detect dead generator (kill -9)", "hang": "detect hung generator (SIGSTOP)",
             "spawn": "generator start -> registered", "reform": "publish forming a new epoch",
             "same": "publish to the same group", "save": "checkpoint save (trainer DCP)",
             "load": "checkpoint load (trainer DCP)", "restart": "trainer restart-to-resume"}
    for key, name in names.items():
        _figure(name, figures[key])


def _restart_trainer(ctx, cluster, checkpoint: Path) -> float:
    """kill -9 the trainer; seconds until the new one serves the checkpoint and the generators have it."""
    os.killpg(cluster.launcher.pids()["trainer"], signal.SIGKILL)
    started = time.perf_counter()
    cluster.restart_trainer()
    fresh = LoopContext.connect(ctx.cfg, ctx.services, ctx.tokens, [], 0, ctx.log, op_timeout_s=10.0)
    fresh.publisher.version = ctx.publisher.version
    ctx.publisher = fresh.publisher
    ctx.services.trainer.load_checkpoint(str(checkpoint))
    ctx.publish()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
