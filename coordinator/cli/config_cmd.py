"""`tandem config [CONFIG] [overrides]`: the config a run would use, as YAML, each key followed
by where its value comes from: `default` (the schema), `file` (the YAML), `override` (the
command line), or `derived: ...` (a default that depends on the model or other keys,
coordinator/config/defaults.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from coordinator.config import ExperimentConfig
from coordinator.config.loading import parse_override


def _paths(node: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every key path in a nested dict (sections and leaves)."""
    if not isinstance(node, dict):
        return set()
    found = set()
    for key, value in node.items():
        path = (*prefix, str(key))
        found.add(path)
        found |= _paths(value, path)
    return found


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def annotated_config(cfg: ExperimentConfig, path: str | Path | None, overrides: list[str]) -> str:
    """The resolved config as YAML with a `# source` comment on every leaf."""
    from_file = _paths(yaml.safe_load(Path(path).read_text()) or {}) if path else set()
    overridden = {tuple(parse_override(text)[0]) for text in overrides}
    derived = {tuple(key.split(".")): reason for key, reason in cfg.derived.items()}

    def source(key: tuple[str, ...]) -> str:
        if any(key[:n] in overridden for n in range(1, len(key) + 1)):
            return "override"
        if key in derived:
            return f"derived: {derived[key]}"
        return "file" if key in from_file else "default"

    extra = f" + {len(overrides)} override(s)" if overrides else ""
    lines = [f"# tandem config: {path or 'the embedded demo'}{extra}",
             (f"# algorithm {cfg.algorithm.value}, training backend {cfg.policy.backend.value}; "
              "after each key: default | file | override | derived: why")]

    def walk(node: dict, prefix: tuple[str, ...], indent: int) -> None:
        for key, value in node.items():
            path_ = (*prefix, str(key))
            pad = "  " * indent
            if isinstance(value, dict) and value:
                lines.append(f"{pad}{key}:")
                walk(value, path_, indent + 1)
            else:
                lines.append(f"{pad}{key}: {_scalar(value)}  # {source(path_)}")

    walk(cfg.model_dump(mode="json"), (), 0)
    return "\n".join(lines) + "\n"
