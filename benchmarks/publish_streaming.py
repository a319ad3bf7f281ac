"""Weight publish from a Megatron TP=2 trainer: whole state dict vs streamed bucket by bucket.

    python benchmarks/publish_streaming.py [--repeats 3] [--bucket-mb 64]

For the embedded tiny model and a larger synthetic Llama (random weights, a few hundred MB
in fp32), one torchrun of 2 ranks (Megatron TP=2, CPU, gloo) publishes to one receiver
process over the real weight-sync group, alternating the two ways:
- whole: `gather_hf_state_dict()` on every rank, then rank 0 sends the dict (the old path);
- streamed: `trainer_svc.publish.publish_weights` over `iter_hf_tensors()` (the new path).
Printed side by side: rank 0's publish time (median), the time until the receiver holds the
whole version, and the peak bytes of gathered weights rank 0 held (`held_bytes.peak`), beside
the sender's two bucket buffers, which both ways allocate.
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


def _receive(address: str, plan, versions: int, queue) -> None:
    from tandem.weight_sync import GroupSpec, WeightReceiver

    receiver = WeightReceiver()
    for version in range(1, versions + 1):
        receiver.receive(GroupSpec(address, 0, "bench", 2, op_timeout_s=300), 1, version, plan)
        queue.put(time.perf_counter())  # CLOCK_MONOTONIC: comparable across processes here
    receiver.close()


def worker(settings_path: str, out_path: str, repeats: int, bucket_mb: int) -> None:
    """One torchrun rank: build the backend, publish `repeats` times each way, rank 0 writes JSON."""
    from tandem.weight_sync import GroupSpec, WeightSender, iter_plan_tensors, make_bucket_plan
    from trainer_svc.backends import build_backend
    from trainer_svc.config import TrainerSettings
    from trainer_svc.distributed import close_distributed, init_distributed
    from trainer_svc.publish import publish_weights

    env = init_distributed(600)
    backend = build_backend(TrainerSettings.model_validate_json(Path(settings_path).read_text()), env)
    plan = make_bucket_plan(((n, s, torch.float32) for n, s in backend.hf_tensor_shapes.items()), bucket_mb * MB)
    sender = proc = queue = None
    if env.rank == 0:
        sender = WeightSender()
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=_receive, args=(sender.address, plan, 2 * repeats, queue))
        proc.start()
    group = GroupSpec(sender.address if sender else "", 0, "bench", 2, op_timeout_s=300)
    results: dict[str, dict[str, list[float]]] = {"whole": {}, "streamed": {}}
    version = 0
    for _ in range(repeats):
        for mode in ("whole", "streamed"):
            version += 1
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
                results[mode].setdefault(key, []).append(value)
    if env.rank == 0:
        proc.join(timeout=60)
        sender.close()
        summary = {"model_bytes": plan.total_bytes, "num_buckets": len(plan.bucket_sizes_bytes),
                   "sender_buffer_bytes": 2 * max(plan.bucket_sizes_bytes),
                   **{mode: {k: statistics.median(v) for k, v in r.items()} for mode, r in results.items()}}
        Path(out_path).write_text(json.dumps(summary))
    backend.close()
    close_distributed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, default=64)
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
        print(f"Megatron TP=2 (2 ranks, CPU, gloo) -> 1 receiver; buckets {args.bucket_mb} MB; "
              f"median of {args.repeats}", flush=True)
        print(f"{'model':10s} {'MB':>6s} {'buckets':>7s} | {'mode':8s} {'publish s':>9s} {'end-to-end s':>12s} "
              f"{'peak held MB':>12s} | sender buffers MB", flush=True)
        for name, model_dir in models.items():
            settings = root / f"{name}.json"
            settings.write_text(json.dumps({"model_name": str(model_dir),
                                            "megatron_cfg": {"enabled": True, "tensor_model_parallel_size": 2}}))
            out = root / f"{name}.out.json"
            run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                                  __file__, "--repeats", str(args.repeats), "--bucket-mb", str(args.bucket_mb),
                                  "--worker", str(settings), str(out)], env=env, capture_output=True, text=True,
                                  check=False)
            if not out.is_file():
                raise SystemExit(f"the {name} run failed:\n{(run.stdout + run.stderr)[-4000:]}")
            r = json.loads(out.read_text())
            for mode in ("whole", "streamed"):
                m = r[mode]
                print(f"{name:10s} {r['model_bytes'] / MB:6.1f} {r['num_buckets']:7d} | {mode:8s} "
                      f"{m['publish_s']:9.3f} {m['end_to_end_s']:12.3f} {m['peak_held_bytes'] / MB:12.1f} | "
                      f"{r['sender_buffer_bytes'] / MB:.1f}", flush=True)


if __name__ == "__main__":
    main()
