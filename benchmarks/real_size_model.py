"""Random-init checkpoints of a real model family at a real size, built locally (no downloads):
Qwen2.5-0.5B's and Qwen2.5-1.5B's exact shapes (Qwen2ForCausalLM, tied embeddings, q/k/v
biases, a 151,936-word vocabulary, bf16 on disk as they ship), and a small shape of the same
family for a quick check. The tokenizer is Tandem's embedded character tokenizer
(coordinator/embedded/tiny_model.py): its ids fit any of these vocabularies; the model, random,
samples any of the vocabulary's ids, and ids past the tokenizer's decode to nothing. (Under a
qwen2 config transformers loads it as a Qwen2Tokenizer, which drops spaces; the arithmetic task
has none.)

    python benchmarks/real_size_model.py OUT_DIR [--size 0.5b|1.5b|quick] [--seed 0] [--device cuda]

prints one JSON line: the parameter count, the bytes on disk and the seconds the build took
(benchmarks/real_size.py runs it in a subprocess, so the benchmark process never holds the model;
benchmarks/gpu_check.py builds on the GPU, much faster for 1.5B). `ensure_real_size_model` keeps one
build per size under the Tandem cache (benchmarks/train_step_real_size.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

QWEN_VOCAB = 151_936


@dataclass(frozen=True)
class Shape:
    """A Qwen2 decoder's shape (the fields of its config.json that size it)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int = QWEN_VOCAB
    max_position_embeddings: int = 32_768
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def parameter_count(self) -> int:
        """Parameters of Qwen2ForCausalLM of this shape: q/k/v carry biases, o and the MLP do not."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attention = (h * h + h) + 2 * (h * kv + kv) + h * h
        per_layer = attention + 3 * h * self.intermediate_size + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embeddings + h


SHAPES = {
    "0.5b": Shape("Qwen2.5-0.5B", hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                  num_kv_heads=2),
    "1.5b": Shape("Qwen2.5-1.5B", hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                  num_kv_heads=2, max_position_embeddings=131_072),
    "quick": Shape("quick Qwen2", hidden_size=128, intermediate_size=512, num_layers=2, num_heads=2,
                   num_kv_heads=1),
}
"""--size choices. Qwen2.5-0.5B and -1.5B as their config.json state them; "quick" keeps the family,
the vocabulary and a head size vLLM's CPU attention has a kernel for (64), at ~20M parameters."""


def build_config(shape: Shape, tokenizer):
    """The Qwen2Config of `shape` with the tokenizer's special ids, bf16."""
    from transformers import Qwen2Config

    if len(tokenizer) > shape.vocab_size:
        raise ValueError(f"the tokenizer's {len(tokenizer)} ids do not fit a vocabulary of {shape.vocab_size}")
    config = Qwen2Config(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads, max_position_embeddings=shape.max_position_embeddings,
        rope_theta=shape.rope_theta, rms_norm_eps=shape.rms_norm_eps, tie_word_embeddings=shape.tie_word_embeddings,
        use_sliding_window=False, hidden_act="silu", bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype="bfloat16")
    config.architectures = ["Qwen2ForCausalLM"]
    return config


def build_checkpoint(out_dir: Path, shape: Shape, seed: int = 0, device: str = "cpu") -> dict:
    """Write a seeded random-init model of `shape` (transformers' own initialisation, bf16
    safetensors) and the character tokenizer into `out_dir`. Returns what `main` prints."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from coordinator.embedded.tiny_model import build_char_tokenizer

    started = time.perf_counter()
    tokenizer = build_char_tokenizer()
    config = build_config(shape, tokenizer)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    if params != shape.parameter_count():
        raise AssertionError(f"{shape.name}: built {params} parameters, the shape says {shape.parameter_count()}")
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {"shape": shape.name, "parameters": params, "bytes": directory_bytes(out_dir),
            "seconds": round(time.perf_counter() - started, 2)}


BUILD_FORMAT = 1
"""Bump when the recipe changes, so that cached builds are not reused."""


def ensure_real_size_model(size: str = "0.5b", cache_root: Path | None = None, seed: int = 0) -> Path:
    """The checkpoint of SHAPES[size], built once under the Tandem cache (its real-size folder)."""
    import shutil

    from coordinator.embedded.cache import cache_root as tandem_cache

    out = (cache_root or tandem_cache()) / "benchmarks" / "real-size" / f"{size}-seed{seed}-v{BUILD_FORMAT}"
    if (out / "config.json").is_file():
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    build_checkpoint(partial, SHAPES[size], seed)
    partial.rename(out)
    return out


def directory_bytes(path: Path) -> int:
    """Bytes of the files under `path` (0 if it does not exist)."""
    path = Path(path)
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--size", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where to initialise (cuda: much faster for 1.5B)")
    args = parser.parse_args(argv)
    print(json.dumps(build_checkpoint(args.out_dir, SHAPES[args.size], args.seed, args.device)))


if __name__ == "__main__":
    main()
