"""Random-init checkpoints with the exact shape of a real model people post-train, built locally.

`ensure_real_size_model("qwen2.5-0.5b")` writes (once, cached under the Tandem cache's
`benchmarks/` folder, coordinator/embedded/cache.py) a Qwen2ForCausalLM with Qwen2.5-0.5B's
shape: hidden 896, 24 layers, 14 query / 2 KV heads, intermediate 4864, vocabulary 151,936,
tied embeddings, saved in bfloat16 as that model ships. "qwen2.5-1.5b" is the next size.
No weights are downloaded: the weights are transformers' random init (seeded) and the
tokenizer is the embedded character tokenizer (coordinator/embedded/tiny_model.py), whose
ids all lie in the model's larger vocabulary (as a real checkpoint's padded vocabulary does).

    PYTHONPATH=. .venv/bin/python benchmarks/real_size_model.py qwen2.5-0.5b   # prints the path
"""

from __future__ import annotations

import sys
from pathlib import Path

BUILD_FORMAT = 1  # bump when the recipe changes so cached builds are not reused

SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                     "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True},
    "qwen2.5-1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                     "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True},
}
_COMMON = {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "use_sliding_window": False,
           "hidden_act": "silu", "initializer_range": 0.02, "attention_dropout": 0.0}


def build_real_size_model(name: str, out_dir: Path, seed: int = 0) -> Path:
    """Write `name`'s random-init checkpoint (bf16 safetensors, config, tokenizer) into out_dir."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    from coordinator.embedded.tiny_model import build_char_tokenizer

    tok = build_char_tokenizer()
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    config = Qwen2Config(**SHAPES[name], **_COMMON, **ids, dtype="bfloat16")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(torch.bfloat16)
    model.generation_config = GenerationConfig(**ids)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    settings = out_dir / "tokenizer_config.json"  # keep the character tokenizer for a qwen2 model type
    raw = json.loads(settings.read_text())
    raw["tokenizer_class"] = "PreTrainedTokenizerFast"
    settings.write_text(json.dumps(raw, indent=1))
    return out_dir


def ensure_real_size_model(name: str = "qwen2.5-0.5b", cache_root: Path | None = None) -> Path:
    """`name`'s checkpoint under <cache>/benchmarks/real-size, built once (atomic across processes)."""
    from coordinator.embedded.cache import cache_root as default_root
    from coordinator.embedded.cache import ensure_entry, short_hash

    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}: one of {sorted(SHAPES)}")
    key = short_hash({"name": name, "shape": SHAPES[name], "common": _COMMON, "format": BUILD_FORMAT})
    entry = Path(cache_root or default_root()) / "benchmarks" / "real-size" / f"{name}-{key}"
    return ensure_entry(entry, lambda tmp: build_real_size_model(name, tmp))


if __name__ == "__main__":
    print(ensure_real_size_model(sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-0.5b"))
