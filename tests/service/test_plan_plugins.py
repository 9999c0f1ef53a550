"""`ptctl study plan` of a plugin family's study, in a fresh interpreter that discovers the plugin (a throwaway
distribution, `tests.studies.test_plugins`' way): an arch that declares no context is accepted and the plan says its
context is unchecked; a trial shape the probe cannot build is one `not probed:` line with the exception's message,
and the estimate's other lines stay whole (they once read "on this machine's no device ( per step")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from studies import load_catalog
from tests.studies.test_plugins import _distribution

REPO = Path(__file__).parents[2]
LOOSE = """
    from pydantic import Field

    from studies.arch import Arch, PosInt
    from studies.family import from_mup
    from studies.space import Range, Space


    class LooseArch(Arch):  # no context_field: nothing says how long a sequence its model takes
        n_heads: PosInt = Field(2, description="attention heads")

        def width_steps(self, base_width):
            return {"n_heads": self.n_heads}


    class LooseSpace(Space):
        HPARAMS = ("lr", "output_mult")
        lr: Range = Field(default_factory=lambda: Range(low=1e-4, high=1e-1, default=1e-2))
        output_mult: Range = Field(default_factory=lambda: Range(low=0.1, high=10.0, default=1.0))
        frozen: list[str] = Field(default_factory=list)


    FAMILY = from_mup("loose", "nowhere_to_be_found:make_model", LooseArch, LooseSpace)  # no such module
"""


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    site = root / "site"
    site.mkdir()
    _distribution(site, "loose-plugin", "loose_plugin", LOOSE, {"loose": "loose_plugin:FAMILY"})
    data = load_catalog("tiny").as_dict()
    data.update(model={"family": "loose", "parametrization": "mup", "arch": {"n_heads": 2}}, verify=None)
    data["data"] = {**data["data"], "objective": "clm"}
    data["tune"] = {**data["tune"], "num_trials": 1, "max_concurrent": 1}  # one trial a phase: no companions
    data.pop("space")
    spec = root / "loose.yaml"
    spec.write_text(json.dumps(data))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "COLUMNS": "200",
           "PTCTL_DATA_DIR": str(root / "data")}

    def _plan(*flags: str) -> tuple[int, str]:
        done = subprocess.run([sys.executable, "-m", "service.cli", "study", "plan", *flags, str(spec)], env=env,
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        return done.returncode, done.stdout + done.stderr

    return _plan


def test_an_undeclared_context_is_accepted_and_the_plan_says_it_is_unchecked(plan):
    rc, out = plan("--no-probe")
    assert rc == 0, out
    assert ("context: not declared: model family 'loose' names no arch field holding its longest sequence "
            "(Arch.context_field), so data.seq_len 32 is unchecked until its first trial runs it") in out, out


def test_a_shape_the_probe_cannot_build_is_one_line_naming_the_exception(plan):
    rc, out = plan()
    assert rc == 0, out
    lines = out.splitlines()
    failed = [line for line in lines if line.startswith("not probed: ")]
    assert failed == ["not probed: w16: ModuleNotFoundError: No module named 'nowhere_to_be_found'",
                      "not probed: w32: ModuleNotFoundError: No module named 'nowhere_to_be_found'"], out
    assumes = next(line for line in lines if line.startswith("assumes: "))
    assert "no device" not in assumes and "( per step" not in assumes and "not probed" not in assumes, assumes
    assert assumes.startswith("assumes: probe: no trial shape could be timed"), assumes
    assert "estimate: tune ? · transfer ? · total unknown (a shape was not probed)" in out, out
    assert "Traceback" not in out
