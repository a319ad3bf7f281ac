"""Embedded default reward model: a tiny character-level LlamaForSequenceClassification
(one scalar output, randomly initialised) built locally, no downloads.

Same character tokenizer as the embedded policy (coordinator/embedded/tiny_model.py), so it
reads the policy's prompts and completions as they are. Untrained, its scores are noise: it is
the default so that configs and tests run without a download; train it (or point
env.<task>.reward_model.model_name at a real one) to get a meaningful reward. Cached under
``cache_root/models`` keyed by a hash of the spec.
"""

from __future__ import annotations

from pathlib import Path

from coordinator.embedded.cache import ensure_entry, short_hash
from coordinator.embedded.tiny_model import TinyModelSpec, build_char_tokenizer, build_config

DEFAULT_RM_SPEC = TinyModelSpec(hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                                max_position_embeddings=128, seed=0)
"""About 0.1 M parameters: enough to learn toy preferences in a few dozen steps on CPU."""
BUILD_FORMAT = 1  # bump when the build recipe changes so old cache entries are not reused


def init_tiny_reward_model(spec: TinyModelSpec = DEFAULT_RM_SPEC):
    """Seeded random fp32 ``LlamaForSequenceClassification`` (num_labels=1, pad id set) and its tokenizer."""
    import torch
    from transformers import LlamaForSequenceClassification

    tokenizer = build_char_tokenizer()
    config = build_config(spec, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id,
                          tokenizer.pad_token_id)
    config.num_labels = 1
    torch.manual_seed(spec.seed)
    return LlamaForSequenceClassification(config).to(torch.float32), tokenizer


def build_tiny_reward_model(out_dir: Path, spec: TinyModelSpec = DEFAULT_RM_SPEC) -> Path:
    """Write the seeded tiny reward model and its tokenizer into ``out_dir`` (safetensors)."""
    out_dir = Path(out_dir)
    model, tokenizer = init_tiny_reward_model(spec)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def tiny_reward_model_dir(cache_root: Path, spec: TinyModelSpec = DEFAULT_RM_SPEC) -> Path:
    key = short_hash({"spec": spec.cache_key(), "kind": "reward_model", "format": BUILD_FORMAT})
    return Path(cache_root) / "models" / f"tiny-reward-llama-{key}"


def ensure_tiny_reward_model(cache_root: Path, spec: TinyModelSpec = DEFAULT_RM_SPEC) -> Path:
    """Build the tiny reward model once under ``cache_root/models`` and return its directory."""
    return ensure_entry(tiny_reward_model_dir(cache_root, spec), lambda tmp: build_tiny_reward_model(tmp, spec))
