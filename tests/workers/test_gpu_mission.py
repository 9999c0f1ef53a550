"""`benchmarks/gpu_mission.sh --smoke`: the GPU mission's path (studies/catalog/paper_gpu.yaml through the local
runner, then its results file) at toy sizes on this CPU, so the script cannot rot: the study succeeds and the file
holds the certificate, the transferred hparams and each phase's wall time and trials per hour."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.service._cli import data_dir

pytestmark = pytest.mark.slow  # the tiny study in a fresh interpreter
REPO = Path(__file__).parents[2]


def test_the_gpu_missions_smoke_run_writes_its_results(tmp_path):
    data = data_dir(tmp_path, "data")
    env = {**os.environ, "PTCTL_DATA_DIR": str(data), "PTCTL_MISSION_DIR": str(tmp_path / "mission"),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(REPO / "benchmarks" / "gpu_mission.sh"), "--smoke"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads((tmp_path / "mission" / "results-smoke.json").read_text())
    assert found["status"] == "succeeded", found
    cert = found["certificate"]
    assert cert["n_samples"] == 4 and 0 <= cert["n_better"] <= 4 and 0 < cert["upper_bound"] <= 1, cert
    assert set(found["transferred_hparams"]) == {"lr", "w_H", "w_topic", "w_unary", "w_dep", "w_head", "w_topic_z"}
    assert set(found["phases"]) == {"tune", "transfer", "verify"}, found["phases"]
    assert all(p["wall_s"] > 0 and p["trials_per_hour"] > 0 for p in found["phases"].values()), found["phases"]
    journal = data / "studies" / "paper-gpu-smoke" / "ray" / "paper-gpu-smoke.tune" / "trials.jsonl"
    assert len(journal.read_text().splitlines()) == 3  # the local runner's journal: tune's three trials
