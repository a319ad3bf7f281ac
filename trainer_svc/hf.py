"""Hugging Face checkpoint files: the model fingerprint and writing an exported checkpoint.

No torch.distributed here: these run on rank 0 over plain full tensors.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from trainer_svc.config import ModelHead

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5")
SHARD_BYTES = 5 << 30  # as save_pretrained's default max_shard_size


def eos_token_ids(model_dir: str | Path) -> frozenset[int]:
    """The tokens that end a completion: `eos_token_id` of generation_config.json, else of
    config.json (an int or a list), as vLLM reads them; empty if neither names one."""
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        value = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
        if value is not None:
            return frozenset([value] if isinstance(value, int) else value)
    return frozenset()


def model_fingerprint(model_dir: str | Path, fallback_shapes: Mapping[str, tuple[int, ...]]) -> str:
    """sha256 of config.json's bytes and the checkpoint's tensor names and shapes (sorted).

    Names/shapes come from the safetensors headers (cheap: no tensor is read); a checkpoint
    without safetensors files uses `fallback_shapes` (the model's state-dict shapes).
    """
    root = Path(model_dir)
    digest = hashlib.sha256((root / "config.json").read_bytes())
    shapes: dict[str, list[int]] = {}
    for file in sorted(root.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = list(f.get_slice(name).get_shape())
    if not shapes:
        shapes = {n: list(s) for n, s in fallback_shapes.items()}
    digest.update(json.dumps(sorted(shapes.items())).encode())
    return digest.hexdigest()


def classifier_config(model_dir: str | Path):  # -> transformers.PretrainedConfig
    """`model_dir`'s config as a scalar-head sequence classifier: num_labels 1, the architecture
    renamed (LlamaForCausalLM -> LlamaForSequenceClassification), and a pad token id, which HF's
    pooling needs to find each row's last real token (the config's, else the EOS id)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        raise ValueError(f"{model_dir}: model type {config.model_type!r} has no sequence-classification class in "
                         "transformers; reward-model training needs one")
    config.num_labels = 1
    config.architectures = [MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES[config.model_type]]
    if not isinstance(config.pad_token_id, int):
        eos = config.eos_token_id
        eos = eos[0] if isinstance(eos, list) else eos
        if not isinstance(eos, int):
            raise ValueError(f"{model_dir}: config.json has neither pad_token_id nor eos_token_id; set pad_token_id")
        config.pad_token_id = eos
    return config


def value_model_config(model_dir: str | Path):  # -> transformers.PretrainedConfig
    """`model_dir`'s config as a PPO critic: a one-output token classifier (LlamaForCausalLM ->
    LlamaForTokenClassification: every position's hidden state through a linear layer) without
    the classifier dropout HF adds by default (0.1), so a value is the same in training and scoring."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES

    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES:
        raise ValueError(f"{model_dir}: model type {config.model_type!r} has no token-classification class in "
                         "transformers; a PPO critic needs one")
    config.num_labels = 1
    config.architectures = [MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES[config.model_type]]
    config.classifier_dropout = 0.0
    return config


def head_config(model_dir: str | Path, head: ModelHead):  # -> transformers.PretrainedConfig | None
    """The config an export of a model with `head` writes: the classifier's for a reward model or a
    critic, None (the source's own) for a causal LM."""
    if head is ModelHead.SEQUENCE_SCORE:
        return classifier_config(model_dir)
    return value_model_config(model_dir) if head is ModelHead.TOKEN_VALUE else None


def write_hf_checkpoint(
state: Mapping[str, torch.Tensor], out_dir: str | Path, *, source_dir: str | Path,
                        dtype: torch.dtype, config=None) -> int:
    """Write `state` as safetensors in `dtype` plus the source's non-weight files (config,
    tokenizer, generation config; `config`, if given, replaces the source's config.json);
    returns the number of tensors written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = Path(source_dir)
    for file in source.iterdir():
        if file.is_file() and not file.name.endswith(WEIGHT_SUFFIXES) and not file.name.endswith(".index.json"):
            shutil.copy2(file, out / file.name)
    if config is not None:
        config.save_pretrained(out)
    tensors = {name: t.detach().to(dtype=dtype, device="cpu").contiguous() for name, t in state.items()}
    shards = _split(tensors)
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return len(tensors)
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update({tensor_name: name for tensor_name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return len(tensors)


def _split(tensors: Mapping[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards
