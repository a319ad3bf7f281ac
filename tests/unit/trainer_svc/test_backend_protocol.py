"""The engine reaches a backend only through the TrainerBackend Protocol, and both backends
implement all of it (read from the source: the backends need torch.distributed / megatron to import)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _tree(path: str) -> ast.Module:
    return ast.parse((ROOT / path).read_text())


def _class(path: str, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(_tree(path)) if isinstance(n, ast.ClassDef) and n.name == name)


def _protocol() -> tuple[set[str], set[str]]:
    """(attributes, methods) that TrainerBackend declares."""
    body = _class("trainer_svc/interfaces.py", "TrainerBackend").body
    attributes = {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    methods = {n.name for n in body if isinstance(n, ast.FunctionDef)}
    return attributes, methods


def _is_backend(node: ast.expr) -> bool:
    return ((isinstance(node, ast.Name) and node.id == "backend")
            or (isinstance(node, ast.Attribute) and node.attr == "_backend"))


def test_engine_uses_only_the_protocol() -> None:
    attributes, methods = _protocol()
    tree = _tree("trainer_svc/engine.py")
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and _is_backend(n.value)}
    assert used, "the engine's backend accesses were not found"
    assert used <= attributes | methods, f"not in TrainerBackend: {sorted(used - attributes - methods)}"
    dynamic = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id in ("getattr", "hasattr") and n.args and _is_backend(n.args[0])]
    assert not dynamic, "the engine looks up backend members outside the Protocol"


@pytest.mark.parametrize(("path", "name"), [("trainer_svc/backends/dtensor/backend.py", "DTensorBackend"),
                                            ("trainer_svc/backends/megatron/backend.py", "MegatronBackend")])
def test_backend_implements_the_protocol(path: str, name: str) -> None:
    attributes, methods = _protocol()
    cls = _class(path, name)
    defined = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    targets = [t for n in ast.walk(cls) for t in (n.targets if isinstance(n, ast.Assign) else
                                                  [n.target] if isinstance(n, ast.AnnAssign) else [])]
    targets += [e for t in targets if isinstance(t, ast.Tuple) for e in t.elts]
    assigned = {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                and t.value.id == "self"}
    assigned |= {t.id for n in cls.body if isinstance(n, ast.Assign | ast.AnnAssign)
                 for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    assert methods <= defined, f"{name} lacks {sorted(methods - defined)}"
    assert attributes <= assigned | defined, f"{name} lacks {sorted(attributes - assigned - defined)}"
