"""The files of a Hugging Face checkpoint directory, opened and checked before any service loads
it: config.json (JSON, an object naming its model_type), the weights (every safetensors file's
header parses and its tensors fit in the file, so a truncated download is caught here and not
in a trainer rank or a vLLM engine process), and a tokenizer. Each problem is a ConfigError
naming the file, the config key that points at the directory, and what to change.

Only files and their structure: whether the architecture is one the services support is not
decided here.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from coordinator.config import ConfigError

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
_MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header


def check_model_dir(model_dir: str | Path, key: str = "policy.model_name", *, tokenizer: bool = True) -> None:
    """Raise ConfigError if `model_dir` is not a loadable-looking HF checkpoint."""
    root = Path(model_dir)
    if not root.is_dir():
        raise ConfigError(f"{key}: {root} is not a directory; give a Hugging Face checkpoint directory")
    _check_config(root, key)
    for path in _weight_files(root, key):
        check_safetensors(path, key)
    if tokenizer:
        _check_tokenizer(root, key)


def check_chat_template(model_dir: str | Path, key: str) -> None:
    """Raise ConfigError if the checkpoint's tokenizer has no chat template (the rollout gateway
    renders an agent's messages with it): neither chat_template.jinja nor a chat_template in
    tokenizer_config.json."""
    root = Path(model_dir)
    if (root / "chat_template.jinja").is_file():
        return
    config = root / "tokenizer_config.json"
    settings = _read_json(config, key, "tokenizer_config.json") if config.is_file() else {}
    if not (isinstance(settings, dict) and settings.get("chat_template")):
        raise ConfigError(f"{key}: agent tasks need a chat model, and {root} has no chat template (no "
                          "chat_template.jinja, no chat_template in tokenizer_config.json); set policy.model_name "
                          "to an instruct/chat checkpoint")


def _read_json(path: Path, key: str, what: str) -> object:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{key}: {path} is missing ({what})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{key}: {path} is not valid JSON ({exc}); {what} must be a JSON file: restore it "
                          "from the original checkpoint") from None
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path} ({exc.strerror})") from None


def _check_config(root: Path, key: str) -> None:
    config = _read_json(root / "config.json", key, "the model's configuration")
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str) or not config["model_type"]:
        raise ConfigError(f"{key}: {root / 'config.json'} names no model_type (e.g. \"llama\"), so no model class "
                          "can be chosen for it: restore the checkpoint's config.json")


def _weight_files(root: Path, key: str) -> list[Path]:
    """The safetensors files the checkpoint loads (its index's shards, else every *.safetensors)."""
    index_path = root / "model.safetensors.index.json"
    if index_path.is_file():
        index = _read_json(index_path, key, "the index of the weight shards")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(f"{key}: {index_path} has no weight_map of tensor -> shard file")
        shards = sorted({str(v) for v in weight_map.values()})
        missing = [s for s in shards if not (root / s).is_file()]
        if missing:
            raise ConfigError(f"{key}: {index_path} names shards that are missing: {missing[:3]}")
        return [root / s for s in shards]
    files = sorted(root.glob("*.safetensors"))
    if not files and not any((root / n).is_file() for n in ("pytorch_model.bin", "model.pt")):
        raise ConfigError(f"{key}: {root} holds no weights (model.safetensors or pytorch_model.bin)")
    return files


def check_safetensors(path: Path, key: str) -> None:
    """The header parses and every tensor's bytes lie inside the file (a truncated or corrupt
    file fails here)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ConfigError(f"{key}: {path} is truncated ({size} bytes, not even a safetensors header): "
                              "download or copy it again")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise ConfigError(f"{key}: {path} is truncated or not a safetensors file (its header claims "
                              f"{header_len} bytes, the file has {size}): download or copy it again")
        try:
            header = json.loads(f.read(header_len).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ConfigError(f"{key}: {path} has a corrupt safetensors header: download or copy it again") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{key}: {path} has a corrupt safetensors header: download or copy it again")
    data_bytes = size - 8 - header_len
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        problem = _tensor_problem(entry, data_bytes)
        if problem:
            raise ConfigError(f"{key}: {path}: tensor {name!r} {problem}: the file is truncated or corrupt; "
                              "download or copy it again")


def _tensor_problem(entry: object, data_bytes: int) -> str | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("data_offsets"), list | tuple):
        return "has no data_offsets"
    offsets, shape = entry["data_offsets"], entry.get("shape", [])
    if len(offsets) != 2 or not all(isinstance(o, int) for o in offsets) or not 0 <= offsets[0] <= offsets[1]:
        return f"has bad data_offsets {offsets}"
    if offsets[1] > data_bytes:
        return f"ends at byte {offsets[1]} of the data, but the file holds {data_bytes}"
    itemsize = _DTYPE_BYTES.get(str(entry.get("dtype")))
    if itemsize is not None and isinstance(shape, list) and all(isinstance(d, int) for d in shape):
        count = 1
        for d in shape:
            count *= d
        if count * itemsize != offsets[1] - offsets[0]:
            return f"has shape {shape} but {offsets[1] - offsets[0]} bytes"
    return None


def _check_tokenizer(root: Path, key: str) -> None:
    present = [n for n in _TOKENIZER_FILES if (root / n).is_file()]
    if not present:
        raise ConfigError(f"{key}: {root} holds no tokenizer (none of {', '.join(_TOKENIZER_FILES)}): copy the "
                          "tokenizer files of the checkpoint beside config.json")
    if "tokenizer.json" in present:
        _read_json(root / "tokenizer.json", key, "the tokenizer")
    if (root / "tokenizer_config.json").is_file():
        _read_json(root / "tokenizer_config.json", key, "the tokenizer's configuration")
