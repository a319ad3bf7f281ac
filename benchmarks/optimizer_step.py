"""The DTensor backend's train step with AdamW's fused implementation (what the backend builds)
against foreach and the per-parameter loop (what torch picks by itself on CPU), on the embedded
tiny Llama, in a world of one rank (no torchrun), interleaved.

    PYTHONPATH=. .venv/bin/python benchmarks/optimizer_step.py --reps 5 --steps 20

Three backends load the same checkpoint and train on the same batch (16 samples of 12-17 tokens,
the embedded SFT's sizes), one with the backend's optimizer, the others with that optimizer
switched to `foreach=True` / `foreach=False`; each rep times `--steps` train steps of each, in
turn. Prints the median ms per train step and per optimizer step alone, and checks that foreach
and the loop end with bitwise the same weights (the same update, only in fewer calls) and fused
within fp32 rounding of them.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from backend_variants import make_samples

from coordinator.embedded.tiny_model import ensure_tiny_model
from trainer_svc.backends.dtensor import DTensorBackend
from trainer_svc.backends.dtensor.parallel import local_value
from trainer_svc.config import TrainerSettings
from trainer_svc.distributed import close_distributed, init_distributed
from trainer_svc.types import NllLossConfig


def timed(call, steps: int) -> float:
    """Median ms of `steps` calls."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_dir = str(ensure_tiny_model(Path(tempfile.gettempdir()) / "tandem-optimizer-step"))
    env = init_distributed(600)
    settings = TrainerSettings(model_name=model_dir)
    backends = {name: DTensorBackend(settings, env) for name in ("fused", "foreach", "loop")}
    for name in ("foreach", "loop"):  # read at each step: the same AdamW, another implementation
        for group in backends[name]._optimizer.param_groups:
            group["fused"], group["foreach"] = False, name == "foreach"
    samples = make_samples({"num_samples": 16, "min_length": 12, "max_length": 17}, backends["fused"].vocab_size)
    loss = NllLossConfig()
    step_ms: dict[str, list[float]] = {name: [] for name in backends}
    optimizer_ms: dict[str, list[float]] = {name: [] for name in backends}
    for backend in backends.values():  # warm-up
        backend.train_step(samples, loss, len(samples), len(samples), None)
    for _ in range(args.reps):
        for name, backend in backends.items():
            step_ms[name].append(timed(lambda: backend.train_step(samples, loss, len(samples), len(samples), None),
                                       args.steps))
            for param in backend._params:  # the train step frees its gradients once applied: the same zeros for both
                param.grad = torch.zeros_like(param)
            optimizer_ms[name].append(timed(backend._optimizer.step, args.steps))
    same = all(torch.equal(local_value(a), local_value(b))
               for a, b in zip(backends["foreach"]._params, backends["loop"]._params))
    for name in backends:
        print(f"{name:8s} train step {statistics.median(step_ms[name]):6.1f} ms   optimizer step "
              f"{statistics.median(optimizer_ms[name]):5.1f} ms   (medians of {args.reps} reps x {args.steps} steps)")
    close = all(torch.allclose(local_value(a), local_value(b), rtol=1e-5, atol=1e-6)
                for a, b in zip(backends["fused"]._params, backends["foreach"]._params))
    print(f"train step ratio loop/fused: {statistics.median(step_ms['loop']) / statistics.median(step_ms['fused']):.2f}x, "
          f"foreach/fused: {statistics.median(step_ms['foreach']) / statistics.median(step_ms['fused']):.2f}x; "
          f"foreach and loop weights bitwise equal after {args.reps * args.steps * 2 + 1} steps each: {same}; "
          f"fused within fp32 rounding of foreach: {close}")
    close_distributed()


if __name__ == "__main__":
    main()
