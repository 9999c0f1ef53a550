"""The service imports no Ray: every Ray call it makes is a function of `workers.ray.actors`, and no module hands it
`ray` or `ray._private` (the Ray version ptctl pins is `workers.ray`'s concern alone)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import service
import workers.ray

SERVICE = Path(service.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, lazily or not, by its full dotted name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _ray_modules(module: ModuleType) -> list[str]:
    return sorted(name for name, value in vars(module).items()
                  if isinstance(value, ModuleType) and value.__name__.split(".")[0] == "ray")


def test_no_service_module_imports_ray():
    files = sorted(SERVICE.rglob("*.py"))
    assert len(files) >= 20
    offenders = {p.relative_to(SERVICE).as_posix(): sorted(n for n in _imports(p) if n.split(".")[0] == "ray")
                 for p in files}
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_no_service_module_holds_ray_and_workers_ray_exports_none():
    """At run time too: no service module holds a Ray module under any name (a re-export imported from elsewhere),
    and no module of `workers.ray` names one in its `__all__`."""
    import service.execution  # the one module that calls Ray

    held = {m.__name__: _ray_modules(m) for m in (importlib.import_module(f"service.{i.name}")
                                                 for i in pkgutil.iter_modules(service.__path__))}
    assert "service.execution" in held and {name: bad for name, bad in held.items() if bad} == {}
    assert service.execution.actors.__name__ == "workers.ray.actors"
    exported = {}
    for info in pkgutil.iter_modules(workers.ray.__path__):
        module = importlib.import_module(f"workers.ray.{info.name}")
        exported[info.name] = [n for n in getattr(module, "__all__", [])
                               if isinstance(getattr(module, n), ModuleType)]
    assert _ray_modules(workers.ray) == [] and workers.ray.__all__ == ["keep_loopback"]
    assert {name: bad for name, bad in exported.items() if bad} == {}
