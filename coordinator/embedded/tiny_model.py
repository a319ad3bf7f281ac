"""Embedded default policy: a tiny character-level Llama built locally, no downloads.

Builds a character tokenizer and a randomly initialised ``LlamaForCausalLM``
and saves both as one ordinary Hugging Face checkpoint directory that
``AutoModelForCausalLM``, ``AutoTokenizer`` and vLLM load. ``ensure_tiny_model``
caches the directory under ``cache_root/models`` keyed by a hash of the spec.

The llama model type is deliberate: transformers 5 swaps qwen2-typed
tokenizers for a byte-level BPE one, which silently drops spaces from this
character vocabulary.
"""

from __future__ import annotations

import os
import string
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from coordinator.embedded.cache import ensure_entry, short_hash

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
PUNCTUATION = "+-*/=().,?:!'\""
BUILD_FORMAT = 1  # bump when the build recipe changes so old cache entries are not reused


def vocabulary() -> list[str]:
    """The ordered token list; the id of a token is its index."""
    chars = string.digits + PUNCTUATION + " \n" + string.ascii_lowercase + string.ascii_uppercase
    return [*SPECIAL_TOKENS, *chars]


def char_tokenizer():  # -> tokenizers.Tokenizer
    """The character-level tokenizer on the `tokenizers` library alone: prepends BOS, never
    appends EOS, and the four special tokens are marked special (decoding can skip them)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(vocabulary())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B:1", special_tokens=[(BOS, vocab[BOS])]
    )
    core.add_special_tokens([AddedToken(token, special=True) for token in SPECIAL_TOKENS])
    return core


def build_char_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    """`char_tokenizer` as a transformers tokenizer (what the checkpoint saves)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=char_tokenizer(),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture and init seed of the tiny Llama.

    The default (4 layers, ~1 M parameters) comes from ``benchmarks/calibrate_embedded.py``:
    from an SFT warm start at ~50% held-out accuracy, GRPO gains more on it (+18 points in
    60 steps of 16 x 8 samples) than on the 2-layer 0.5 M variant.
    """

    hidden_size: int = 128
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 64
    seed: int = 0

    def cache_key(self) -> str:
        """Short hash identifying this spec and the build recipe."""
        return short_hash({"spec": asdict(self), "vocab": vocabulary(), "format": BUILD_FORMAT})


DEFAULT_SPEC = TinyModelSpec()
DEFAULT = DEFAULT_SPEC


def build_config(spec: TinyModelSpec, vocab_size: int, bos_id: int, eos_id: int, pad_id: int):
    """``LlamaConfig`` for ``spec`` (fp32, untied embeddings)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )


def init_tiny_model(spec: TinyModelSpec = DEFAULT_SPEC):
    """Seeded random fp32 ``LlamaForCausalLM`` for ``spec`` and its tokenizer, in memory."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer()
    config = build_config(
        spec, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model, tokenizer


def build_tiny_model(out_dir: Path, spec: TinyModelSpec = DEFAULT_SPEC) -> Path:
    """Write a seeded random tiny Llama and its tokenizer into ``out_dir`` (safetensors)."""
    out_dir = Path(out_dir)
    model, tokenizer = init_tiny_model(spec)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def tiny_model_dir(cache_root: Path, spec: TinyModelSpec = DEFAULT_SPEC) -> Path:
    """Where ``ensure_tiny_model`` keeps the checkpoint for ``spec``."""
    return Path(cache_root) / "models" / f"tiny-llama-{spec.cache_key()}"


def ensure_tiny_model(cache_root: Path, spec: TinyModelSpec = DEFAULT_SPEC) -> Path:
    """Build the tiny model once under ``cache_root/models`` and return its directory."""
    return ensure_entry(tiny_model_dir(cache_root, spec), lambda tmp: build_tiny_model(tmp, spec))


def count_parameters(model) -> int:
    """Number of parameters of a torch module."""
    return sum(p.numel() for p in model.parameters())


def expected_parameter_count(spec: TinyModelSpec, vocab_size: int) -> int:
    """Parameter count of the Llama ``spec`` describes (untied, no biases)."""
    head_dim = spec.hidden_size // spec.num_heads
    attn = 2 * spec.hidden_size * spec.hidden_size + 2 * spec.hidden_size * spec.num_kv_heads * head_dim
    mlp = 3 * spec.hidden_size * spec.intermediate_size
    per_layer = attn + mlp + 2 * spec.hidden_size
    return spec.num_layers * per_layer + 2 * vocab_size * spec.hidden_size + spec.hidden_size


def _hf_greedy_ids(model_dir: Path, prompt: str, max_tokens: int) -> list[int]:
    """Greedy continuation ids from transformers, for comparison with vLLM."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([tok(prompt).input_ids])
    with torch.no_grad():
        for _ in range(max_tokens):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[0, -max_tokens:].tolist()


def _vllm_smoke_check(model_dir: Path) -> None:
    """Load ``model_dir`` in vLLM on CPU, greedy-generate, and check the text is intact."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model_dir), dtype="float32", max_model_len=64, enforce_eager=True, seed=0)
    ours = build_char_tokenizer()
    text = " a b  12+34=46 \n(x, y)? "
    engine_tok = llm.get_tokenizer()
    print("engine tokenizer:", type(engine_tok).__name__,
          "| ids match:", engine_tok(text).input_ids == ours(text).input_ids,
          "| round trip:", engine_tok.decode(ours(text).input_ids, skip_special_tokens=True) == text)
    prompts = ["12+34=", "Hello world, 7*8 = ?"]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for out in llm.generate(prompts, params, use_tqdm=False):
        gen = out.outputs[0]
        ids = list(gen.token_ids)
        print(repr(out.prompt), "->", repr(gen.text),
              "| prompt ids ok:", list(out.prompt_token_ids) == ours(out.prompt).input_ids,
              "| text == char decode:", gen.text == ours.decode(ids, skip_special_tokens=True),
              "| ids == HF greedy:", ids == _hf_greedy_ids(model_dir, out.prompt, len(ids)))
    # The random model samples near-uniformly, so sampled text exercises spaces and newlines too.
    sampled = llm.generate(prompts, SamplingParams(n=8, temperature=1.0, max_tokens=48, seed=1), use_tqdm=False)
    outs = [c for o in sampled for c in o.outputs]
    intact = sum(c.text == ours.decode(list(c.token_ids), skip_special_tokens=True) for c in outs)
    print(f"sampled: {intact}/{len(outs)} texts equal the char decode of their ids;",
          "spaces generated:", sum(c.text.count(" ") for c in outs), "| e.g.", repr(outs[0].text))


if __name__ == "__main__":
    import sys

    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="tandem-embedded-"))
    built = ensure_tiny_model(root)
    print("model dir:", built)
    _vllm_smoke_check(built)
