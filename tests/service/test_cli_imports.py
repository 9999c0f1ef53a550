"""`ptctl --help` and `ptctl report ID` load none of the heavy stacks: they parse arguments or print a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
HEAVY = {"torch", "ray", "mlflow", "matplotlib", "scipy", "pandas", "optuna"}
PROBE = """
import atexit, json, sys
atexit.register(lambda: print("MODULES " + json.dumps(sorted({m.split(".")[0] for m in sys.modules}))))
from service.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _ptctl(data: Path, *args: str) -> tuple[int, str, set[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PTCTL_DATA_DIR": str(data), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=120)
    out, _, modules = done.stdout.rpartition("MODULES ")
    return done.returncode, out + done.stderr, set(json.loads(modules or "[]"))


@pytest.mark.parametrize("args", [["--help"], ["study", "--help"], ["report", "--help"]])
def test_help_imports_nothing_heavy(tmp_path, args):
    rc, out, modules = _ptctl(tmp_path, *args)
    assert rc == 0 and "usage: ptctl" in out, out
    assert modules and not modules & HEAVY, sorted(modules & HEAVY)


def test_report_prints_the_file_and_imports_nothing_heavy(tmp_path):
    art = tmp_path / "studies" / "s-1" / "artifacts"
    art.mkdir(parents=True)
    (art / "report.md").write_text("# Study s-1\n\nthe centre is certified\n")
    for render in ([], ["--render"]):
        rc, out, modules = _ptctl(tmp_path, "report", "s-1", *render)
        assert rc == 0 and "Study s-1" in out and "certified" in out, out
        assert modules and not modules & HEAVY, sorted(modules & HEAVY)


def test_report_of_an_unknown_study_is_one_line_and_light(tmp_path):
    rc, out, modules = _ptctl(tmp_path, "report", "nope")
    assert rc == 2 and out.startswith("error: no report.md for study 'nope'") and "Traceback" not in out, out
    assert not modules & HEAVY, sorted(modules & HEAVY)
