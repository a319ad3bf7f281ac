"""How a generator with W vLLM workers (tensor/pipeline parallel) should take a weight version:
one weight-sync receiver per worker (the trainer's group grows by W per generator, and the
coordinator must know W), or one receiver that fans the buckets out to the other workers over
their own gloo group (generator_svc/fanout.py, what Tandem does: the group keeps one rank per
generator). Both are timed end to end (send start -> every worker holds the version) with the
real WeightSender / WeightReceiver over loopback gloo, in processes of their own.

    PYTHONPATH=. .venv/bin/python benchmarks/vllm_tp_weight_fanout.py --megabytes 25 100 --workers 2 --repeats 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from generator_svc.fanout import fan_out
from tandem.weight_sync import GroupSpec, WeightReceiver, WeightSender, iter_plan_tensors, plan_for_state_dict


def _worker(address: str, index: int, workers: int, plan, repeats: int, store: str, done) -> None:
    """Worker `index` of one generator: the first receives and fans out, the others take the fan-out."""
    dist.init_process_group("gloo", store=dist.FileStore(store, workers), rank=index, world_size=workers)
    receiver = WeightReceiver() if index == 0 else None
    for version in range(1, repeats + 1):
        fan_out(lambda v=version: receiver.receive(GroupSpec(address, 0, "bench", 2), 1, v, plan), plan,
                dist.group.WORLD, 0, index == 0)
        done.put((index, version, time.perf_counter()))
    if receiver is not None:
        receiver.close()
    dist.destroy_process_group()


def run_fanout(megabytes: int, workers: int, repeats: int, bucket_mb: int) -> list[float]:
    state = _state(megabytes)
    plan = plan_for_state_dict(state, bucket_bytes=bucket_mb << 20)
    sender = WeightSender()
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_worker, args=(sender.address, i, workers, plan, repeats, str(Path(tmp) / "s"),
                                                   done)) for i in range(workers)]
        for p in procs:
            p.start()
        seconds = []
        for version in range(1, repeats + 1):
            start = time.perf_counter()
            sender.send(GroupSpec(sender.address, 0, "bench", 2), version, plan, iter_plan_tensors(plan, state))
            seconds.append(max(done.get(timeout=300)[2] for _ in range(workers)) - start)
        for p in procs:
            p.join(timeout=60)
    sender.close()
    return seconds


def _state(megabytes: int) -> dict[str, torch.Tensor]:
    numel = megabytes * (1 << 20) // 4
    return {f"layer{i}.weight": torch.randn(numel // 8) for i in range(8)}


def main() -> None:
    from benchmarks.weight_sync import run as run_per_worker

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, nargs="+", default=[25, 100])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, default=64)
    args = parser.parse_args()
    for megabytes in args.megabytes:
        per_worker = statistics.median(run_per_worker(megabytes, args.workers, args.repeats, args.bucket_mb))
        fanned = statistics.median(run_fanout(megabytes, args.workers, args.repeats, args.bucket_mb))
        print(f"{megabytes} MB to {args.workers} workers: one receiver per worker {per_worker:.3f} s, "
              f"one receiver + fan-out {fanned:.3f} s")


if __name__ == "__main__":
    main()
