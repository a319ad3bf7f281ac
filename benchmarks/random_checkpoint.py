"""A random-init Hugging Face checkpoint of a real model's shape, built locally (nothing is
downloaded): Qwen2.5-0.5B's or Qwen2.5-1.5B's architecture (their published config values),
bf16 safetensors, with the embedded tiny model's character-level tokenizer so that Tandem's
arithmetic task runs on it (the embedding keeps the real vocabulary size: the weights, the
refit bytes and the logits have the real shapes; only the tokenizer's ids are few).

    .venv/bin/python benchmarks/random_checkpoint.py qwen2.5-0.5b OUT_DIR [--device cuda]

`tiny` is the same architecture at a size a CPU builds in a second (benchmarks/gpu_check.sh
--dry-run). Prints the directory, parameter count and bytes as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

# Qwen2.5 configs as published (hidden, intermediate, layers, heads, kv heads); all tie the
# embeddings, have q/k/v biases, vocab 151936, rope theta 1e6, RMSNorm eps 1e-6.
SHAPES = {
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "vocab_size": 151936},
    "qwen2.5-1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "vocab_size": 151936},
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 2, "vocab_size": 512},  # head size 64 as 0.5B's (vLLM-CPU needs >= 32)
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def qwen2_config(shape: str, tokenizer_dir: Path):
    from transformers import Qwen2Config

    ids = json.loads((tokenizer_dir / "config.json").read_text())
    return Qwen2Config(**SHAPES[shape], architectures=["Qwen2ForCausalLM"], max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, hidden_act="silu", bos_token_id=ids["bos_token_id"],
                       eos_token_id=ids["eos_token_id"], pad_token_id=ids["pad_token_id"], dtype="bfloat16")


def build(shape: str, out: Path, *, device: str = "cpu", seed: int = 0) -> dict:
    """Write the checkpoint to `out` (replaced if there); returns what it wrote."""
    from transformers import AutoModelForCausalLM

    from coordinator.embedded.cache import cache_root
    from coordinator.embedded.tiny_model import ensure_tiny_model

    started = time.perf_counter()
    tokenizer_dir = ensure_tiny_model(cache_root())
    config = qwen2_config(shape, tokenizer_dir)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    for name in _TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out / name)
    params = sum(p.numel() for p in model.parameters())
    return {"shape": shape, "dir": str(out), "parameters": params,
            "bytes": sum(f.stat().st_size for f in out.glob("*.safetensors")),
            "build_s": round(time.perf_counter() - started, 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cpu", help="where to initialise (cuda: much faster for 1.5B)")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.shape, args.out, device=args.device)))


if __name__ == "__main__":
    main()
