"""The tracker on the embedded SQLite store: artifacts stay under the data directory, drivers that
start together share one experiment, and the runs link opens the saved verdicts view (real MLflow, no server)."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from workers.mlflow_tracker import VIEW_ID, VIEW_TAG, Tracker, prepare_store


def _experiment_id(uri: str, name: str, queue) -> None:
    queue.put(Tracker(name, uri).experiment_id)


def _save_view(uri: str, name: str, column: str, ready) -> None:
    tracker = Tracker(name, uri)
    ready.wait(120)  # every process has imported MLflow and opened the store: the view's first write races
    tracker.save_view([column])


def test_artifacts_live_under_the_data_dir_not_the_working_dir(tmp_path, monkeypatch):
    data, cwd = tmp_path / "data", tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.setenv("PTCTL_DATA_DIR", str(data))
    monkeypatch.delenv("PTCTL_ARTIFACT_ROOT", raising=False)
    monkeypatch.chdir(cwd)
    tracker = Tracker("artifacts-home", f"sqlite:///{data / 'mlflow.db'}")
    run = tracker.study_run("s-1", {})
    (tmp_path / "report.md").write_text("# report")
    tracker.log_artifacts(run, [tmp_path / "report.md"])
    assert not (cwd / "mlruns").exists() and list(cwd.iterdir()) == []
    stored = list((data / "mlartifacts").rglob("report.md"))
    assert len(stored) == 1 and stored[0].read_text() == "# report"


@pytest.mark.slow  # four processes, each opening the MLflow store
def test_drivers_starting_together_share_one_experiment(tmp_path, monkeypatch):
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    uri = prepare_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert Path(tmp_path / "mlflow.db").exists()
    ctx, queue = mp.get_context("spawn"), mp.get_context("spawn").Queue()
    procs = [ctx.Process(target=_experiment_id, args=(uri, "together", queue)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    ids = {queue.get(timeout=5) for _ in procs}
    assert len(ids) == 1, ids


def test_the_runs_link_opens_the_saved_verdicts_view(tmp_path, monkeypatch):
    """`save_view` writes the view the MLflow UI's Views menu lists (MLflow 3.17's saved-view envelope) and
    `runs_link` opens it, in the UI's model-training mode; a second study widens the view, never narrows it."""
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("PTCTL_MLFLOW_UI", raising=False)
    tracker = Tracker("viewed", f"sqlite:///{tmp_path / 'mlflow.db'}")
    link = tracker.runs_link()
    assert f"#/experiments/{tracker.experiment_id}/runs?workflowType=machine_learning " in link
    assert "viewStateShareKey" not in link  # no view saved yet: the UI would say the key does not exist
    tracker.save_view(["tags.`certified`", "params.`best.lr`", "attributes.`Description`"])
    tracker.save_view(["tags.`certified`", "params.`best.w_H`", "attributes.`Description`"])
    saved = json.loads(tracker.client.get_experiment(tracker.experiment_id).tags[VIEW_TAG + VIEW_ID])
    assert saved["name"] == "verdicts" and saved["updatedAt"] >= saved["createdAt"] > 0
    state = json.loads(saved["state"])
    assert state["selectedColumns"] == ["tags.`certified`", "params.`best.w_H`", "attributes.`Description`",
                                        "params.`best.lr`"]  # the latest columns' order first, then the others
    assert state["columnOrder"] == ["attributes.`Run Name`", "runDateAndNestInfo", "tags.`certified`",
                                    "params.`best.w_H`", "params.`best.lr`", "duration", "attributes.`Description`"]
    link = tracker.runs_link()
    assert link.startswith(f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs?"
                           f"workflowType=machine_learning&viewStateShareKey={VIEW_ID} (after `mlflow ui ")
    assert tracker.link("abc") == (f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs/abc?"
                                   "workflowType=machine_learning")  # the UI's address, not the store's URI


@pytest.mark.slow  # four processes, each opening the MLflow store
def test_studies_saving_the_view_together_all_succeed_and_keep_their_columns(tmp_path, monkeypatch):
    """Four drivers save the verdicts view of one experiment at once (4 first studies submitted together): on
    SQLite the first tag write is an INSERT, and all but one lose it; each must still succeed, and no study's
    columns may be lost to another's read-modify-write."""
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    uri = prepare_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = Tracker("viewed-together", uri)
    ctx = mp.get_context("spawn")
    columns = [f"params.`best.h{i}`" for i in range(4)]
    ready = ctx.Barrier(len(columns))  # released when the last process is ready (was: a fixed 8-s sleep)
    procs = [ctx.Process(target=_save_view, args=(uri, "viewed-together", c, ready)) for c in columns]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    saved = json.loads(tracker.client.get_experiment(tracker.experiment_id).tags[VIEW_TAG + VIEW_ID])
    assert set(json.loads(saved["state"])["selectedColumns"]) == set(columns)


def test_the_mlflow_tracker_implements_every_call_of_the_protocol():
    """`RunTracker`'s bodies are the null tracker's: the MLflow tracker must define each call itself, not inherit
    one that records nothing."""
    from workers.tracker import NullTracker, RunTracker

    calls = [name for name, value in vars(RunTracker).items() if callable(value) and not name.startswith("_")]
    assert len(calls) == 20 and not [name for name in calls if name not in vars(Tracker)]
    assert NullTracker().trial_run("s", "tune", "tune-1", "p", {}) == "s/tune/tune-1"
