"""Step time of the DTensor backend's options on the same data: padded vs packed micro-batches,
and tp=1 (FSDP over 2 ranks) vs tp=2 (with and without sequence parallel).

    .venv/bin/python benchmarks/dtensor_options.py --steps 4 --num-samples 64

Builds a random Llama (hidden 256, 4 layers, vocab 512) in a temporary directory, runs
benchmarks/backend_variants.py under `torchrun --nproc-per-node 2` and prints, per variant, the
median optimizer-call time (after one warm-up call), the first loss and the grad norm. Lengths
are drawn uniformly from [min, max], so padded micro-batches carry much padding.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_model(out_dir: Path, hidden: int, layers: int, vocab: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--num-samples", type=int, default=64)
    parser.add_argument("--min-length", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--mb-tokens", type=int, default=1024, help="train_mb_tokens / logprob_mb_tokens when packed")
    args = parser.parse_args()
    packing = {"enabled": True, "train_mb_tokens": args.mb_tokens, "logprob_mb_tokens": args.mb_tokens}
    tp2 = {"tensor_parallel_size": 2}
    variants = {"tp1 padded": {}, "tp1 packed": {"sequence_packing": packing},
                "tp2 padded": {"dtensor_cfg": tp2}, "tp2+sp padded": {"dtensor_cfg": {**tp2, "sequence_parallel": True}},
                "tp2 packed": {"dtensor_cfg": tp2, "sequence_packing": packing}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_model(work / "model", hidden=256, layers=4, vocab=512)
        spec = {"model_dir": str(work / "model"), "base": {"optimizer": {"lr": 1e-4}}, "variants": variants,
                "num_samples": args.num_samples, "min_length": args.min_length, "max_length": args.max_length,
                "global_batch_size": args.num_samples, "micro_batch_size": args.micro_batch_size,
                "num_steps": args.steps + 1, "loss": {"kind": "grpo"}}
        (work / "spec.json").write_text(json.dumps(spec))
        torchrun = Path(sys.executable).with_name("torchrun")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
               "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(ROOT / "benchmarks" / "backend_variants.py"),
                        str(work / "spec.json"), str(work / "out.json")], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        results = json.loads((work / "out.json").read_text())
    print(f"{args.num_samples} samples of {args.min_length}-{args.max_length} tokens, 2 ranks, "
          f"micro_batch_size {args.micro_batch_size} (padded) / {args.mb_tokens} tokens (packed)")
    print(f"{'variant':<16}{'median step s':>14}{'first loss':>12}{'grad norm':>11}")
    for name, r in results.items():
        print(f"{name:<16}{statistics.median(r['step_times_s'][1:]):>14.3f}{r['losses'][0]:>12.6f}"
              f"{r['grad_norms'][0]:>11.5f}")


if __name__ == "__main__":
    main()
