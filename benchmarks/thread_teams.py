"""The cost of running torch from two threads of one process (trainer rank 0's old layout: the
model built on the main thread, every command run on an executor thread), against one thread.

    PYTHONPATH=. .venv/bin/python benchmarks/thread_teams.py [--steps 20] [--rounds 3]

Each thread that runs torch ops gets an OpenMP team of its own (libgomp). Once the process holds
more OpenMP threads than the machine has cores, libgomp stops spinning between parallel regions
and parks its threads instead, which a small model, with many short regions, pays for at every
op. Two processes, each a DTensor backend of the embedded tiny model training the tiny task's
GRPO step (128 samples of ~12 tokens, KL to the reference): "one" runs everything on its main
thread, "two" also runs a few torch ops on a second thread first, as rank 0 did. They run one
after the other, interleaved (one, two, one, two, ...), and the median step times are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def _samples(vocab_size: int):
    import torch

    from trainer_svc.types import Sample

    gen = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(128):  # the tiny task: a 7-9 token prompt, 4 new tokens
        prompt = int(torch.randint(7, 10, (), generator=gen))
        ids = tuple(torch.randint(3, vocab_size, (prompt + 4,), generator=gen).tolist())
        samples.append(Sample(ids, prompt, generation_logprobs=(-1.0,) * 4,
                              advantage=float(torch.randn((), generator=gen))))
    return samples


def child(layout: str, steps: int) -> None:
    """One measurement in this process: prints {"layout", "median_step_s"}."""
    import torch

    from coordinator.embedded.cache import cache_root
    from coordinator.embedded.tiny_model import ensure_tiny_model
    from trainer_svc.backends.dtensor import DTensorBackend
    from trainer_svc.config import TrainerSettings
    from trainer_svc.distributed import init_distributed
    from trainer_svc.types import GrpoLossConfig

    backend = DTensorBackend(TrainerSettings(model_name=str(ensure_tiny_model(cache_root()))), init_distributed(600))
    other = ThreadPoolExecutor(1)  # alive to the end: its thread keeps its OpenMP team
    if layout == "two":  # a second thread that has run torch ops
        other.submit(lambda: torch.ones(1 << 16).add_(1).sum()).result()
    samples, loss = _samples(backend.vocab_size), GrpoLossConfig(reference_policy_kl_penalty=0.04)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        backend.train_step(samples, loss, 128, 128, None)
        times.append(time.perf_counter() - started)
    print(json.dumps({"layout": layout, "median_step_s": statistics.median(times[3:])}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", choices=["one", "two"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    results: dict[str, list[float]] = {"one": [], "two": []}
    for round_index in range(args.rounds):
        for layout in ("one", "two"):
            out = subprocess.run([sys.executable, __file__, "--child", layout, "--steps", str(args.steps)],
                                 capture_output=True, text=True, check=True).stdout
            step = json.loads(out.strip().splitlines()[-1])["median_step_s"]
            results[layout].append(step)
            print(f"round {round_index + 1}: {layout} thread(s) running torch: {step:.3f} s/step", flush=True)
    one, two = statistics.median(results["one"]), statistics.median(results["two"])
    print(f"median s/step: one thread {one:.3f}, two threads {two:.3f}; two/one {two / one:.2f}x")


if __name__ == "__main__":
    main()
