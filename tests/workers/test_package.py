"""`workers` imports neither fastapi nor `service`; Ray in one package (`ray/`), MLflow in one module
(`mlflow_tracker`)."""

import ast
import subprocess
import sys
from pathlib import Path

import workers

ROOT = Path(workers.__file__).parent
RAY = {f"ray/{name}.py" for name in ("__init__", "actors", "callback", "cluster", "experiment", "trainable")}
HOMES = {"ray": RAY, "mlflow": {"mlflow_tracker.py"}, "fastapi": set(), "service": set()}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_ray_and_mlflow_have_one_module_each_and_fastapi_and_service_none():
    modules = sorted(ROOT.rglob("*.py"))
    assert len(modules) >= 10
    imported = {p.relative_to(ROOT).as_posix(): _imported_roots(p) for p in modules}
    assert {root: {name for name, roots in imported.items() if root in roots} for root in HOMES} == HOMES


def test_a_trial_actors_imports_leave_the_phases_and_matplotlib_to_the_driver():
    """A phase's trial actors import `workers.ray.trainable` (and through it `workers.train`): the tune search
    they need is the spec's (`StudySpec.asha_rungs`), so no module of `studies.phases` (nor the analysis report
    they pull in) loads in a trial process; and matplotlib (≈ 0.17 s of a process's start) is loaded where a
    figure is drawn, not by the phases the driver imports."""
    code = ("import sys, workers.ray.trainable; print(sorted(m for m in sys.modules if m.startswith("
            "('studies.phases', 'analysis.report')))); import studies.phases; print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "False"]
