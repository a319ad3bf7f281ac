"""Weight-sync throughput: trainer-side WeightSender -> N WeightReceiver processes over
loopback gloo, for a payload of a given size, against a plain memcpy of the same bytes.

    .venv/bin/python benchmarks/weight_sync.py --megabytes 100 --receivers 1 2 --repeats 3

Prints, per receiver count, the median end-to-end seconds (send start -> every receiver
holds the staged state dict) and GB/s, beside the memcpy figure measured in the same run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import torch

from tandem.weight_sync import GroupSpec, WeightReceiver, WeightSender, iter_plan_tensors, plan_for_state_dict


def _receiver(address: str, rank: int, world: int, plan, repeats: int, done) -> None:
    receiver = WeightReceiver()
    for version in range(1, repeats + 1):
        receiver.receive(GroupSpec(address, 0, "bench", world), rank, version, plan)
        done.put((rank, version, time.perf_counter()))
    receiver.close()


def run(megabytes: int, receivers: int, repeats: int, bucket_mb: int) -> list[float]:
    numel = megabytes * (1 << 20) // 4
    state = {f"layer{i}.weight": torch.randn(numel // 8) for i in range(8)}
    plan = plan_for_state_dict(state, bucket_bytes=bucket_mb << 20)
    sender = WeightSender()
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(sender.address, r, receivers + 1, plan, repeats, done))
             for r in range(1, receivers + 1)]
    for p in procs:
        p.start()
    seconds = []
    for version in range(1, repeats + 1):
        start = time.perf_counter()
        sender.send(GroupSpec(sender.address, 0, "bench", receivers + 1), version, plan,
                    iter_plan_tensors(plan, state))
        finished = max(done.get(timeout=300)[2] for _ in range(receivers))
        seconds.append(finished - start)
    for p in procs:
        p.join(timeout=60)
    sender.close()
    return seconds


def memcpy_seconds(megabytes: int) -> float:
    src = torch.randn(megabytes * (1 << 20) // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages first
    start = time.perf_counter()
    dst.copy_(src)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--receivers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, default=64)
    args = parser.parse_args()
    gigabytes = args.megabytes / 1024
    copy = memcpy_seconds(args.megabytes)
    print(f"payload {args.megabytes} MB, buckets {args.bucket_mb} MB; memcpy {copy:.4f} s ({gigabytes / copy:.1f} GB/s)")
    for count in args.receivers:
        seconds = statistics.median(run(args.megabytes, count, args.repeats, args.bucket_mb))
        print(f"{count} receiver(s): {seconds:.3f} s end to end, {gigabytes / seconds:.2f} GB/s "
              f"({seconds / copy:.0f}x memcpy)")


if __name__ == "__main__":
    main()
