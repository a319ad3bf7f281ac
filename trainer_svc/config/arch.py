"""What the Megatron backend takes from a Hugging Face config: the families its converter knows
(backends/megatron/convert.py) and the architecture facts the conversion and the model need.
Pure Python (no torch), so a config can be checked before anything starts."""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class Arch:
    """What the conversion and the Megatron model need from an HF config."""

    family: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    norm_eps: float
    qkv_bias: bool
    tie_word_embeddings: bool

    @classmethod
    def from_hf_config(cls, config) -> Arch:
        family = getattr(config, "model_type", "")
        if family not in SUPPORTED_FAMILIES:
            raise ValueError(f"the Megatron backend converts {', '.join(SUPPORTED_FAMILIES)} checkpoints; "
                             f"this one is {family!r}: use policy.dtensor_cfg for it")
        window = getattr(config, "sliding_window", None)
        if family == "mistral" and window is not None and window < config.max_position_embeddings:
            raise ValueError(f"sliding_window {window} is not supported by the Megatron converter (full attention "
                             "only): use policy.dtensor_cfg for this checkpoint")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported by the converter (silu only)")
        if getattr(config, "mlp_bias", False):
            raise ValueError("mlp_bias: true is not supported by the Megatron converter")
        heads = config.num_attention_heads
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        scaling = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if scaling != "default":
            raise ValueError(f"rope scaling {scaling!r} is not supported by the Megatron converter")
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        return cls(
            family=family, num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
            ffn_hidden_size=config.intermediate_size, num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            vocab_size=config.vocab_size, max_position_embeddings=config.max_position_embeddings,
            rope_theta=float(theta or getattr(config, "rope_theta", 10000.0)), norm_eps=config.rms_norm_eps,
            qkv_bias=family == "qwen2" or bool(getattr(config, "attention_bias", False)),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)))

    def padded_vocab(self, tp: int) -> int:
        return -(-self.vocab_size // tp) * tp
