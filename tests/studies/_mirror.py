"""Read the workers' config dataclasses from their source (no torch import): names and defaults."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FACTORY = object()  # the default of a field(default_factory=...)


def dataclass_defaults(relpath: str, class_name: str) -> dict[str, object]:
    """`{field: default}` of dataclass `class_name` in `ROOT/relpath`, in declaration order."""
    tree = ast.parse((ROOT / relpath).read_text(encoding="utf-8"))
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name]
    fields: dict[str, object] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            value = node.value
            if isinstance(value, ast.Call):
                fields[node.target.id] = FACTORY
            else:
                fields[node.target.id] = ast.literal_eval(value) if value is not None else None
    return fields


def module_constant(relpath: str, name: str) -> object:
    """The literal value of module-level `name = ...` in `ROOT/relpath`."""
    tree = ast.parse((ROOT / relpath).read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return ast.literal_eval(node.value)
    raise LookupError(f"{relpath} defines no module-level {name}")


def local_constant(relpath: str, function: str, name: str) -> object:
    """The literal value of `name = ...` inside function or method `function` in `ROOT/relpath`."""
    tree = ast.parse((ROOT / relpath).read_text(encoding="utf-8"))
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == function:
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                        for t in node.targets):
                    return ast.literal_eval(node.value)
    raise LookupError(f"{relpath}: no {name} = ... in {function}")
