"""A tiny mixture-of-experts model built locally (no downloads): a Qwen2-MoE (shared expert with
its sigmoid gate, softmax-then-top-k routing) or a Mixtral (top-k-then-softmax, no shared
expert), randomly initialised, with the embedded character tokenizer, saved as an ordinary HF
checkpoint that AutoModelForCausalLM, vLLM (CPU) and the Megatron converter read.

    python -m coordinator.embedded.tiny_moe OUT_DIR [qwen2_moe|mixtral]
    tandem run examples/configs/grpo_moe_megatron.yaml policy.model_name=OUT_DIR

head_dim is 32 (vLLM's CPU attention has no kernel for 16). `init_std` > HF's 0.02 draws every
weight from N(0, init_std): decisive routing and logits, for tests that compare
implementations (near-tied router scores could pick different experts under rounding).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from coordinator.embedded.cache import ensure_entry, short_hash
from coordinator.embedded.tiny_model import build_char_tokenizer, vocabulary

BUILD_FORMAT = 1


@dataclass(frozen=True)
class TinyMoeSpec:
    family: Literal["qwen2_moe", "mixtral"] = "qwen2_moe"
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    num_experts: int = 4
    experts_per_token: int = 2
    expert_intermediate_size: int = 64
    shared_intermediate_size: int = 128
    """Qwen2-MoE only."""
    max_position_embeddings: int = 64
    router_aux_loss_coef: float = 0.01
    init_std: float | None = None
    """None: HF's initialisation; else every weight matrix from N(0, init_std)."""
    seed: int = 0

    def cache_key(self) -> str:
        return short_hash({"spec": asdict(self), "vocab": vocabulary(), "format": BUILD_FORMAT})


def build_config(spec: TinyMoeSpec, tokenizer):
    from transformers import MixtralConfig, Qwen2MoeConfig

    common = dict(vocab_size=len(tokenizer), hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
                  num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
                  max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=False,
                  router_aux_loss_coef=spec.router_aux_loss_coef, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype="float32")
    if spec.family == "mixtral":
        return MixtralConfig(**common, intermediate_size=spec.expert_intermediate_size,
                             num_local_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token)
    return Qwen2MoeConfig(**common, intermediate_size=spec.shared_intermediate_size,
                          moe_intermediate_size=spec.expert_intermediate_size,
                          shared_expert_intermediate_size=spec.shared_intermediate_size, num_experts=spec.num_experts,
                          num_experts_per_tok=spec.experts_per_token, norm_topk_prob=False, decoder_sparse_step=1,
                          mlp_only_layers=[])


def build_tiny_moe(out_dir: Path, spec: TinyMoeSpec = TinyMoeSpec()) -> Path:
    """Write the seeded model and its tokenizer into `out_dir` (safetensors, per-expert HF names)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = build_char_tokenizer()
    config = build_config(spec, tokenizer)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if spec.init_std is not None:
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() > 1:
                    param.normal_(0.0, spec.init_std)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def ensure_tiny_moe(cache_root: Path, spec: TinyMoeSpec = TinyMoeSpec()) -> Path:
    """Build once under `cache_root/models` and return the directory."""
    entry = Path(cache_root) / "models" / f"tiny-{spec.family.replace('_', '-')}-{spec.cache_key()}"
    return ensure_entry(entry, lambda tmp: build_tiny_moe(tmp, spec))


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m coordinator.embedded.tiny_moe OUT_DIR [qwen2_moe|mixtral]")
    family = sys.argv[2] if len(sys.argv) > 2 else "qwen2_moe"
    print(build_tiny_moe(Path(sys.argv[1]), TinyMoeSpec(family=family)))
