"""Every way a `ptctl study run` can fail is recorded and told in one line.

The study ends `failed` (or `interrupted` when Ray was lost) in `state.json` and on its study and
phase MLflow runs (FAILED / KILLED, tags `status` and `error`); the CLI prints one `error:` line and
exits 1, never a traceback. An interrupted study is finished by re-running the same command.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from studies import load_catalog
from tests.service._cli import data_dir, one_line_error, ptctl
from tests.service.conftest import free_port, wait_for

pytestmark = pytest.mark.slow


def _spec(tmp: Path, name: str, **space) -> Path:
    data = load_catalog("tiny").as_dict()
    data["name"] = name
    data["train"] |= {"steps": 10, "eval_every": 5, "warmup_steps": 2}
    data["tune"] |= {"num_trials": 2, "asha": {"enabled": False}}
    data["verify"] = None
    data["space"] |= space
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _state(data: Path, name: str) -> dict:
    return json.loads(next((data / "studies").glob(f"{name}-*/state.json")).read_text())


def _runs(data: Path, name: str, study_id: str) -> dict:
    client = MlflowClient(tracking_uri=f"sqlite:///{data / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(name).experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.study_id = '{study_id}'", max_results=100)
    return {(r.data.tags["kind"], r.data.tags.get("phase", "")): r for r in runs if r.data.tags["kind"] != "trial"} | {
        ("trial", r.data.tags["trial_key"]): r for r in runs if r.data.tags["kind"] == "trial"}


def test_mlflow_unreachable_at_start(tmp_path):
    data = data_dir(tmp_path, "data")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = one_line_error(ptctl(["study", "run", str(_spec(tmp_path, "no-mlflow"))], data, url, timeout=120))
    assert "cannot reach the MLflow tracking store" in out and url in out
    state = _state(data, "no-mlflow")
    assert state["status"] == "failed" and url in state["error"]


TUNE_CHATTER = ("NaN or Inf found in input tensor", "snapshotting has been triggered", "Trial task failed",
                "A new study created", "INFO mlflow",  # Tune's, TensorBoard's, Optuna's and MLflow's own logs
                "Token authentication is")  # and Ray's note on the local cluster's default


def test_every_tune_trial_diverged(tmp_path):
    """The study fails naming the divergence, and the terminal shows ptctl's output only: the loggers of Tune and
    the libraries under it write to the study's log file."""
    data = data_dir(tmp_path, "data")
    spec = _spec(tmp_path, "all-diverge", lr={"low": 1e5, "high": 1e6, "log": True, "default": 1e6})
    done = ptctl(["study", "run", str(spec)], data)
    assert not [text for text in TUNE_CHATTER if text in done.stdout + done.stderr], done.stdout + done.stderr
    out = one_line_error(done)
    assert "tune phase" in out and "no tune trial completed its budget (2 diverged of 2)" in out
    state = _state(data, "all-diverge")
    assert state["status"] == "failed" and "diverged" in state["error"]
    runs = _runs(data, "all-diverge", state["study_id"])
    for key in (("study", "tune"), ("phase", "tune")):  # the study run's phase tag: where it stopped
        assert runs[key].info.status == "FAILED", key
        assert runs[key].data.tags["status"] == "failed" and "diverged" in runs[key].data.tags["error"]
    trials = [r for k, r in runs.items() if k[0] == "trial"]
    assert len(trials) == 2 and all(r.info.status != "RUNNING" for r in trials)


def _gcs_of(pid: int) -> int | None:
    """The pid of the GCS server of the local Ray that process `pid` started (its child), if running."""
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if "gcs_server" in stat.split(")")[0] and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                return int(entry.name)
        except (OSError, ValueError, IndexError):
            continue
    return None


def test_lost_ray_cluster_is_recorded_interrupted_and_resumed(tmp_path):
    """Ray aborts a driver whose GCS dies, so that attempt cannot record anything: the re-run records it
    `interrupted` (runs KILLED, one `note:` line), then resumes the study to its end."""
    data = data_dir(tmp_path, "data")
    spec = _spec(tmp_path, "lost-ray")
    data_spec = yaml.safe_load(spec.read_text())
    data_spec["tune"] |= {"num_trials": 6}
    # the tune phase is still running when the GCS is killed, on a slow machine too: after the first of 6 trials
    # (2 at a time) at least two rounds of 100-step trials are left
    data_spec["train"] |= {"steps": 100, "eval_every": 50}
    spec.write_text(yaml.safe_dump(data_spec))
    env = {**os.environ, "PTCTL_DATA_DIR": str(data), "RAY_ADDRESS": "", "COLUMNS": "200",
           "RAY_gcs_rpc_server_reconnect_timeout_s": "5"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "study", "run", str(spec)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def a_trial_done() -> bool:  # read MLflow's SQLite directly: cheap to poll while the study trains
            try:
                with sqlite3.connect(f"file:{data / 'mlflow.db'}?mode=ro", uri=True, timeout=1) as db:
                    return db.execute("select count(*) from tags where key = 'status' and value = 'completed'"
                                      ).fetchone()[0] > 0
            except sqlite3.Error:  # not created yet
                return False

        wait_for(a_trial_done, 300, "a finished tune trial")
        gcs = _gcs_of(proc.pid)
        assert gcs is not None, "no GCS server under the CLI's process"
        os.kill(gcs, signal.SIGKILL)
        assert proc.wait(180) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what is left of the local Ray it started
    dead = _state(data, "lost-ray")
    assert dead["status"] == "running"  # the aborted process could not write

    resumed = ptctl(["study", "run", str(spec)], data)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    notes = [line for line in resumed.stdout.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "(tune phase) interrupted" in notes[0] and str(proc.pid) in notes[0], resumed.stdout
    state = _state(data, "lost-ray")
    assert state["status"] == "succeeded" and state["runs"] == {**state["runs"], **dead["runs"]}
    runs = _runs(data, "lost-ray", state["study_id"])
    assert runs[("study", "done")].info.status == "FINISHED"
    trials = [r for k, r in runs.items() if k[0] == "trial"]
    assert sum(r.data.tags["phase"] == "tune" for r in trials) == 6
    assert all(r.info.status != "RUNNING" for r in trials)
