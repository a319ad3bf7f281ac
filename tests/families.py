"""Tiny random-init checkpoints of the model families people post-train, built locally.

Each family is a real transformers config class (so the real HF architecture class and vLLM's
model class for it load it) at a small size, with a real tokenizer type built here, no
downloads: a byte-level BPE trained with `tokenizers` on a small corpus (Llama-3, Qwen2,
Qwen3: the type those families ship), or the embedded character tokenizer (Mistral, Gemma;
their own sentencepiece-style tokenizers are not what this checks).

Sizes: hidden 128, 4 query heads of head_dim 32 (the smallest head size vLLM-CPU's attention
supports: 32, 64, 80, 96, ... ; 16 crashes it), 2 KV heads (GQA), 2 layers. Weights are drawn
with initializer_range 0.1, so the logits are far from uniform and a wrong output head shows
in the logprobs at once.

Gemma: Gemma-3 (text) is the Gemma family here. Gemma-2 loads and generates in both
transformers and vLLM-CPU 0.32, but vLLM-CPU's attention logit soft-capping (Gemma-2's
`attn_logit_softcapping: 50`) differs from transformers' by up to 1.2e-3 in the logprobs of
these random weights (without soft-capping: 1e-6), above the suite's 1e-4, whatever the
weight transport does.

    path = ensure_family(FAMILIES["qwen2"], cache_root)   # built once per spec, atomically
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from coordinator.embedded.cache import ensure_entry, short_hash
from coordinator.embedded.tiny_model import build_char_tokenizer

BUILD_FORMAT = 1  # bump when a recipe changes so cached builds are not reused
BPE_VOCAB_SIZE = 384
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, FFN = 128, 4, 2, 32, 2, 256
MAX_POSITIONS = 256


@dataclass(frozen=True)
class TokenizerSpec:
    """A tokenizer of the family's type: `bpe` (byte-level BPE) or `char` (the embedded one)."""

    kind: str
    bos: str | None = None
    eos: str = "<|endoftext|>"
    pad: str = "<|endoftext|>"
    extra_special: tuple[str, ...] = ()
    tokenizer_class: str = "PreTrainedTokenizerFast"


@dataclass(frozen=True)
class Family:
    """One model family: its config recipe, tokenizer, and which Tandem backends train it."""

    name: str
    architecture: str
    tied: bool
    tokenizer: TokenizerSpec
    megatron: bool
    """The Megatron converter (trainer_svc/backends/megatron/convert.py) supports it."""
    make_config: Callable[[dict], object]
    """Called with the token ids and sizes (vocab_size, bos/eos/pad_token_id); returns the HF config."""

    def cache_key(self) -> str:
        return short_hash({"name": self.name, "tied": self.tied, "tok": self.tokenizer.__dict__,
                           "format": BUILD_FORMAT})


def _common(ids: dict) -> dict:
    return dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS, max_position_embeddings=MAX_POSITIONS, initializer_range=0.1,
                dtype="float32", **ids)


def _llama3(ids: dict):
    from transformers import LlamaConfig

    return LlamaConfig(**_common(ids), tie_word_embeddings=False, rope_parameters={"rope_type": "default",
                                                                                   "rope_theta": 500000.0})


def _qwen2(ids: dict):
    from transformers import Qwen2Config

    return Qwen2Config(**_common(ids), tie_word_embeddings=True, use_sliding_window=False)


def _qwen3(tied: bool) -> Callable[[dict], object]:
    def make(ids: dict):
        from transformers import Qwen3Config

        return Qwen3Config(**_common(ids), head_dim=HEAD_DIM, tie_word_embeddings=tied, use_sliding_window=False)
    return make


def _mistral(ids: dict):
    from transformers import MistralConfig

    return MistralConfig(**_common(ids), head_dim=HEAD_DIM, tie_word_embeddings=False, sliding_window=None)


def _gemma3(ids: dict):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**_common(ids), head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM, sliding_window=32,
                            tie_word_embeddings=True)


_QWEN_TOKENS = TokenizerSpec("bpe", extra_special=("<|im_start|>", "<|im_end|>"), tokenizer_class="Qwen2Tokenizer")
_LLAMA3_TOKENS = TokenizerSpec("bpe", bos="<|begin_of_text|>", eos="<|end_of_text|>", pad="<|finetune_right_pad|>")
_CHAR_TOKENS = TokenizerSpec("char")

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama3", "LlamaForCausalLM", False, _LLAMA3_TOKENS, True, _llama3),
    Family("qwen2", "Qwen2ForCausalLM", True, _QWEN_TOKENS, True, _qwen2),
    Family("qwen3", "Qwen3ForCausalLM", False, _QWEN_TOKENS, False, _qwen3(False)),
    Family("qwen3-tied", "Qwen3ForCausalLM", True, _QWEN_TOKENS, False, _qwen3(True)),
    Family("mistral", "MistralForCausalLM", False, _CHAR_TOKENS, True, _mistral),
    Family("gemma3", "Gemma3ForCausalLM", True, _CHAR_TOKENS, False, _gemma3),
)}


def corpus() -> list[str]:
    """A small deterministic training text: the arithmetic task's rows and some plain prose."""
    sums = [f"{a}+{b}={a + b}" for a in range(10, 100, 3) for b in range(10, 100, 7)]
    prose = ("The quick brown fox jumps over the lazy dog. A model learns to add two numbers, "
             "then to explain the answer step by step: first the ones, then the tens. "
             "Question: what is twelve plus thirty four? Answer: forty six.").split(". ")
    return sums + prose * 20


def build_bpe_tokenizer(spec: TokenizerSpec):  # -> transformers.PreTrainedTokenizerFast
    """A byte-level BPE (GPT-2/Llama-3/Qwen style) trained on `corpus()`; BOS prepended when the spec has one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys([t for t in (spec.bos, spec.eos, spec.pad) if t] + list(spec.extra_special)))
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB_SIZE, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(corpus(), trainer)
    if spec.bos:
        bos_id = core.token_to_id(spec.bos)
        core.post_processor = processors.TemplateProcessing(single=f"{spec.bos} $A", pair=f"{spec.bos} $A $B:1",
                                                            special_tokens=[(spec.bos, bos_id)])
    else:
        core.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=spec.bos, eos_token=spec.eos,
                                   pad_token=spec.pad, model_max_length=MAX_POSITIONS,
                                   clean_up_tokenization_spaces=False)


def build_family(family: Family, out_dir: Path, seed: int = 0) -> Path:
    """Write `family`'s tiny random checkpoint (safetensors, config, tokenizer, generation config) into out_dir."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = build_char_tokenizer() if family.tokenizer.kind == "char" else build_bpe_tokenizer(family.tokenizer)
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    config = family.make_config(ids)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if type(model).__name__ != family.architecture:
        raise AssertionError(f"{family.name}: built {type(model).__name__}, expected {family.architecture}")
    model.generation_config = GenerationConfig(bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"],
                                               pad_token_id=ids["pad_token_id"])
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    settings = out_dir / "tokenizer_config.json"
    raw = json.loads(settings.read_text())
    raw["tokenizer_class"] = family.tokenizer.tokenizer_class
    settings.write_text(json.dumps(raw, indent=1))
    return out_dir


def ensure_family(family: Family, cache_root: Path) -> Path:
    """`family`'s checkpoint under cache_root/families, built once (atomic, safe across processes)."""
    entry = Path(cache_root) / "families" / f"{family.name}-{family.cache_key()}"
    return ensure_entry(entry, lambda tmp: build_family(family, tmp))


def num_parameters(model_dir: Path) -> int:
    """Parameters of a checkpoint as the trainer counts them (tied tensors once)."""
    from safetensors import safe_open

    total = 0
    for path in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                total += _numel(f.get_slice(name).get_shape())
    return total


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
