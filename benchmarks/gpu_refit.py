"""Colocated refit on one GPU: the trainer (1 rank) and one vLLM generator share cuda:0, the
generator sleeps while the trainer would train, and each publish wakes its weights, passes the
trainer's weights by CUDA IPC handles and wakes its KV cache (the loop's own calls:
LoopContext.release_generators / publish, as tests/integration/test_grpo_colocated_gpu.py).

    .venv/bin/python benchmarks/gpu_refit.py MODEL_DIR --repeats 3 --out refit.json

Writes, as JSON: per repeat sleep s, wake s (weights + KV cache), refit s (the CUDA IPC
transfer: export, load, release), bytes and GB/s, the device memory freed by sleep; medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def _free_bytes() -> int | None:
    """Free memory of cuda:0 (None without CUDA: on CPU the script checks its own logic only,
    with shared-memory weights and no sleep)."""
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize(0)
    return torch.cuda.mem_get_info(0)[0]


def measure(model_dir: str, repeats: int, work: Path) -> dict:
    import structlog

    from coordinator.config import load_config
    from coordinator.data.examples import read_examples
    from coordinator.data.tokens import Tokens
    from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
    from coordinator.launch.local import LocalCluster
    from coordinator.loop.context import LoopContext

    cfg = load_config(overrides=[
        f"policy.model_name={model_dir}", "cluster.num_generators=1", "cluster.trainer_ranks=1",
        f"logger.log_dir={work}", "logger.tensorboard_enabled=false", "policy.generation.colocated.enabled=true"])
    train_path, _ = ensure_arithmetic_dataset(work / "cache", 0, 200, 16)
    run_dir = work / "run"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    log = structlog.get_logger()
    rows = []
    started = time.perf_counter()
    with LocalCluster(cfg, model_dir, run_dir, "gpu-refit", log) as services:
        up_s = time.perf_counter() - started
        tokens = Tokens(model_dir)
        loop = LoopContext.connect(cfg, services, tokens, read_examples(train_path, cfg.data, tokens), 0, log)
        transport, sleeps = loop.phases.colocation.transport.value, loop.phases.colocation.sleeps  # cuda_ipc, True on GPU
        loop.publish()  # the first version (the generators start awake)
        for _ in range(repeats):
            awake = _free_bytes()
            t0 = time.perf_counter()
            loop.release_generators()
            sleep_s = time.perf_counter() - t0
            asleep = _free_bytes()
            t0 = time.perf_counter()
            report = loop.publish()
            total_s = time.perf_counter() - t0
            rows.append({"sleep_s": sleep_s, "wake_s": total_s - report.duration_s, "refit_s": report.duration_s,
                         "bytes": report.bytes_sent, "gb_per_s": report.bytes_sent / report.duration_s / 1e9,
                         "sleep_freed_gib": None if awake is None else (asleep - awake) / (1 << 30)})
    medians = {k: statistics.median(r[k] for r in rows) if rows[0][k] is not None else None for k in rows[0]}
    return {"model_dir": model_dir, "transport": transport, "sleeps": sleeps, "services_up_s": up_s, "repeats": rows,
            "median": medians}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpu-refit-") as work:
        result = measure(args.model_dir, args.repeats, Path(work))
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["median"]))


if __name__ == "__main__":
    main()
