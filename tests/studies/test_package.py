"""`studies` stays light (no torch, ray, mlflow, fastapi); the workers use its configs as they are."""

import ast
from pathlib import Path

import studies

FORBIDDEN = {"torch", "ray", "mlflow", "fastapi", "workers", "service"}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_studies_imports_no_heavy_framework():
    modules = sorted(Path(studies.__file__).parent.glob("*.py"))
    assert len(modules) >= 3
    offenders = {p.name: _imported_roots(p) & FORBIDDEN for p in modules}
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_public_api_is_exported():
    assert all(hasattr(studies, name) for name in studies.__all__)
