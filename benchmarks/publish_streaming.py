"""Weight publish from a Megatron TP=2 trainer: whole state dict vs streamed bucket by bucket.

    python benchmarks/publish_streaming.py [--repeats 3] [--bucket-mb 64 256]

For the embedded tiny model and a larger synthetic Llama (random weights, a few hundred MB
in fp32), one torchrun of 2 ranks (Megatron TP=2, CPU, gloo) publishes to one receiver
process over the real weight-sync group, alternating the two ways:
- whole: `gather_hf_state_dict()` on every rank, then rank 0 sends the dict (the old path);
- streamed: `trainer_svc.publish.publish_weights` over `iter_hf_tensors()` (the new path).
Printed side by side, per bucket size: rank 0's publish time (median), the time until the
receiver holds the whole version, the peak bytes of gathered weights rank 0 held
(`held_bytes.peak`), the sender's two bucket buffers (the same both ways) and their sum.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

MB = 1 << 20


def make_synthetic_model(directory: Path) -> Path:
    """A random Llama of about 94 M parameters (376 MB in fp32), saved as an HF checkpoint."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if (directory / "config.json").is_file():
        return directory
    config = LlamaConfig(vocab_size=16000, hidden_size=768, intermediate_size=3072, num_hidden_layers=8,
                         num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=128,
                         tie_word_embeddings=False, dtype="float32")
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def _receive(address: str, plans: list, queue) -> None:
    from tandem.weight_sync import GroupSpec, WeightReceiver

    receiver = WeightReceiver()
    for version, plan in enumerate(plans, start=1):
        receiver.receive(GroupSpec(address, 0, "bench", 2, op_timeout_s=300), 1, version, plan)
        queue.put(time.perf_counter())  # CLOCK_MONOTONIC: comparable across processes here
    receiver.close()


def worker(settings_path: str, out_path: str, repeats: int, bucket_mbs: list[int]) -> None:
    """One torchrun rank: build the backend, publish `repeats` times each way per bucket size;
    rank 0 writes the medians as JSON."""
    from tandem.weight_sync import GroupSpec, WeightSender, iter_plan_tensors, make_bucket_plan, send_buffer_sizes
    from trainer_svc.backends import build_backend
    from trainer_svc.config import TrainerSettings
    from trainer_svc.distributed import close_distributed, init_distributed
    from trainer_svc.publish import publish_weights

    env = init_distributed(600)
    backend = build_backend(TrainerSettings.model_validate_json(Path(settings_path).read_text()), env)
    shapes = backend.hf_tensor_shapes
    plans = {mb: make_bucket_plan(((n, s, torch.float32) for n, s in shapes.items()), mb * MB) for mb in bucket_mbs}
    runs = [(mb, mode) for mb in bucket_mbs for _ in range(repeats) for mode in ("whole", "streamed")]
    sender = proc = queue = None
    if env.rank == 0:
        sender = WeightSender()
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=_receive, args=(sender.address, [plans[mb] for mb, _ in runs], queue))
        proc.start()
    group = GroupSpec(sender.address if sender else "", 0, "bench", 2, op_timeout_s=300)
    results: dict[tuple[int, str], dict[str, list[float]]] = {}
    for version, (mb, mode) in enumerate(runs, start=1):
        plan = plans[mb]
        backend.held_bytes.reset()
        start = time.perf_counter()
        if mode == "whole":
            state = backend.gather_hf_state_dict()
            if sender is not None:
                sender.send(group, version, plan, iter_plan_tensors(plan, state))
            del state
        else:
            publish_weights(backend.iter_hf_tensors(), sender, group, version, plan)
        sent = time.perf_counter()
        received = queue.get(timeout=600) if queue is not None else sent
        figures = {"publish_s": sent - start, "end_to_end_s": max(received, sent) - start,
                   "peak_held_bytes": backend.held_bytes.peak}
        for key, value in figures.items():
            results.setdefault((mb, mode), {}).setdefault(key, []).append(value)
    if env.rank == 0:
        proc.join(timeout=60)
        sender.close()
        rows = [{"bucket_mb": mb, "mode": mode, "model_bytes": plans[mb].total_bytes,
                 "num_buckets": len(plans[mb].bucket_sizes_bytes),
                 "sender_buffer_bytes": sum(send_buffer_sizes(plans[mb])),
                 **{k: statistics.median(v) for k, v in r.items()}} for (mb, mode), r in results.items()]
        Path(out_path).write_text(json.dumps(rows))
    backend.close()
    close_distributed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--worker", nargs=2, metavar=("SETTINGS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args.repeats, args.bucket_mb)
        return
    from coordinator.embedded.tiny_model import ensure_tiny_model

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        models = {"tiny": ensure_tiny_model(root / "tiny"), "synthetic": make_synthetic_model(root / "synthetic")}
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TANDEM_MEGATRON_CHECKPOINT_DIR": str(root / "cache")}
        print(f"Megatron TP=2 (2 ranks, CPU, gloo) -> 1 receiver process; median of {args.repeats}; MB = MiB; "
              "rank-0 total = peak held + sender buffers", flush=True)
        print(f"{'model':9s} {'MB':>6s} {'bucket':>6s} {'n':>3s} | {'mode':8s} {'publish s':>9s} {'end-to-end s':>12s} "
              f"{'peak held':>9s} {'buffers':>7s} {'rank-0 total':>12s}", flush=True)
        for name, model_dir in models.items():
            settings = root / f"{name}.json"
            settings.write_text(json.dumps({"model_name": str(model_dir),
                                            "megatron_cfg": {"enabled": True, "tensor_model_parallel_size": 2}}))
            out = root / f"{name}.out.json"
            run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                                  __file__, "--repeats", str(args.repeats), "--bucket-mb", *map(str, args.bucket_mb),
                                  "--worker", str(settings), str(out)], env=env, capture_output=True, text=True,
                                  check=False)
            if not out.is_file():
                raise SystemExit(f"the {name} run failed:\n{(run.stdout + run.stderr)[-4000:]}")
            for r in json.loads(out.read_text()):
                held, buffers = r["peak_held_bytes"] / MB, r["sender_buffer_bytes"] / MB
                print(f"{name:9s} {r['model_bytes'] / MB:6.1f} {r['bucket_mb']:6d} {r['num_buckets']:3d} | "
                      f"{r['mode']:8s} {r['publish_s']:9.3f} {r['end_to_end_s']:12.3f} {held:9.1f} {buffers:7.1f} "
                      f"{held + buffers:12.1f}", flush=True)


if __name__ == "__main__":
    main()
