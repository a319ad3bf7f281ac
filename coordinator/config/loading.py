"""Reading an experiment: a YAML file (or a dict), dotted overrides, one validation. Every
mistake is a ConfigError whose message names the key and what to change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from coordinator.config.experiment import ExperimentConfig


class ConfigError(ValueError):
    """A user's configuration mistake; the message says which key and what to change."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], YAML-parsed value)."""
    key, sep, value = text.partition("=")
    if not sep or not key or "" in key.split("."):
        raise ConfigError(f"override {text!r} must look like section.key=value")
    try:
        return key.split("."), yaml.safe_load(value) if value else None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"override {text!r}: the value of {key} is not valid YAML ({problem}); quote it to pass "
                          f"a string ({key}='\"{value}\"') or fix it (lists: [1, 2])") from None


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return raw


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                raw: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load YAML (or a dict), apply dotted overrides, validate. Raises ConfigError."""
    data: dict[str, Any] = dict(raw or {})
    if path is not None:
        loaded = _read_yaml(Path(path))
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections")
        data.update(loaded)
    data = apply_overrides(data, overrides or [])
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def _read_yaml(path: Path) -> Any:
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; give the path of an experiment YAML file")
    try:
        return yaml.safe_load(path.read_bytes().decode("utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}): give an "
                          "experiment YAML file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown key {key}: remove it or fix its spelling")
        else:
            lines.append(f"{key}: {message}" if key else message)
    return "invalid config: " + "; ".join(lines)
