"""`ptctl study run --runner local` on a machine without Ray or MLflow (both made unimportable in the child): the
tiny study runs in the CLI's own process, says in one line that nothing is recorded in MLflow, is SIGKILLed in
its verify phase, and resumes with the same command: every planned trial is in its phase's journal once (a finished
trial never trains again) and the certificate is written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.service._cli import data_dir

pytestmark = pytest.mark.slow  # the tiny study, twice, in a fresh interpreter

REPO = Path(__file__).parents[2]
BLOCK = '''
import sys


class _Absent:  # this machine has no Ray and no MLflow
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in ("ray", "mlflow"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, _Absent)
'''


def _journal_ids(folder: Path, phase: str) -> list[str]:
    path = folder / "ray" / f"local.{phase}" / "trials.jsonl"
    return [json.loads(line)["trial_id"] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_local_study_without_ray_or_mlflow_resumes_after_a_kill(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK)
    env = {**os.environ, "PTCTL_DATA_DIR": str(data_dir(tmp_path, "data")), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    args = [sys.executable, "-m", "service.cli", "study", "run", str(REPO / "studies" / "catalog" / "tiny.yaml"),
            "--runner", "local", "--study-id", "local"]
    folder = Path(env["PTCTL_DATA_DIR"]) / "studies" / "local"
    first = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while len(_journal_ids(folder, "verify")) < 2 and first.poll() is None:  # two verify trials done
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(60)
    before = {phase: _journal_ids(folder, phase) for phase in ("tune", "transfer", "verify")}
    assert len(before["verify"]) >= 2, (before, first.stdout.read() if first.stdout else "")

    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "MLflow is not installed: this study records no MLflow runs" in out and "Traceback" not in out, out
    assert "runner: local" in out and "MLflow runs:" not in out, out
    state = json.loads((folder / "state.json").read_text())
    assert state["status"] == "succeeded" and state["runs"]["study"] == "local", state
    for phase in ("tune", "transfer", "verify"):
        ids = _journal_ids(folder, phase)
        assert len(ids) == len(set(ids)), (phase, ids)  # none trained twice
        assert ids[: len(before[phase])] == before[phase], phase  # what was done before the kill was kept
    # tiny.yaml: 6 samples and the centre's seed 1 (its seed 0 is transfer's run, reused)
    assert sorted(_journal_ids(folder, "verify")) == ["verify-centre-s1", *(f"verify-sample{i:03d}" for i in range(6))]
    assert (folder / "artifacts" / "certificate.json").exists()
