"""`analysis` stays pure: no module of it imports torch, ray, mlflow or fastapi, even lazily."""

import ast
from pathlib import Path

import analysis

FORBIDDEN = {"torch", "ray", "mlflow", "fastapi"}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_analysis_imports_no_heavy_framework():
    modules = sorted(Path(analysis.__file__).parent.glob("*.py"))
    assert len(modules) >= 8
    offenders = {p.name: _imported_roots(p) & FORBIDDEN for p in modules}
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_public_api_is_exported():
    assert all(hasattr(analysis, name) for name in analysis.__all__)
