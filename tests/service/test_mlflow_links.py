"""Every MLflow link ptctl prints opens in a browser (issue 39): an http(s) address of an MLflow UI, the tracking
server's when the tracking URI is http(s), else `PTCTL_MLFLOW_UI` (default http://127.0.0.1:5000, where
`mlflow ui --backend-store-uri <store>` serves a local store); never the store's URI (`sqlite:///...#/experiments`).
The API's `mlflow.links` (`MlflowView.observe`), the CLI's `MLflow runs:` line (`Tracker.runs_link`) and a run's
`Tracker.link` are checked on a real SQLite store and on a real MLflow server."""

from __future__ import annotations

import logging

import pytest

from service.progress import MlflowView
from service.settings import Settings
from studies.phases import StudyState
from tests.service.conftest import running_mlflow
from workers.mlflow_tracker import UI_ADDRESS, Tracker, ui_address

QUERY = "workflowType=machine_learning"


def _spec(name: str, uri: str | None) -> dict:
    return {"name": name, "resources": {"tracking": {"tracking_uri": uri, "experiment": None}}}


def _links(tracker: Tracker, uri: str, name: str) -> tuple[dict[str, str], dict[str, str]]:
    """The API's links of a study whose study and tune runs `tracker` made, and those runs' ids."""
    study = tracker.study_run("s-1", {})
    runs = {"study": study, "tune": tracker.phase_run("s-1", "tune", study)}
    _, info = MlflowView(uri).observe(_spec(name, None), "s-1", StudyState(study_id="s-1", spec_hash="h", runs=runs))
    return info.links, runs


def test_the_ui_address_of_a_tracking_uri(monkeypatch, caplog):
    monkeypatch.delenv("PTCTL_MLFLOW_UI", raising=False)
    assert ui_address("sqlite:////data/mlflow.db") == UI_ADDRESS == "http://127.0.0.1:5000"
    assert ui_address("https://u:p4ss@mlflow.example.org:8443/team/") == "https://mlflow.example.org:8443/team"
    assert ui_address("http://[::1]:5000") == "http://[::1]:5000"
    monkeypatch.setenv("PTCTL_MLFLOW_UI", "https://ui.example.org/mlflow/")
    assert ui_address("postgresql://u:p@db/mlflow") == "https://ui.example.org/mlflow"
    assert ui_address("http://tracking:5000") == "http://tracking:5000"  # a server shows its own runs
    monkeypatch.setenv("PTCTL_MLFLOW_UI", "sqlite:///x.db")
    with caplog.at_level(logging.WARNING, "workers.mlflow_tracker"):
        assert ui_address("sqlite:///x.db") == UI_ADDRESS
    assert "PTCTL_MLFLOW_UI='sqlite:///x.db' is not an http(s) address" in caplog.text
    with pytest.raises(ValueError, match="PTCTL_MLFLOW_UI='sqlite:///x.db' is not an http"):
        Settings()  # `ptctl serve` refuses it before it prints a link


def test_links_on_a_sqlite_store_open_the_configured_ui(tmp_path, monkeypatch):
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("PTCTL_MLFLOW_UI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker("links", uri)
    links, runs = _links(tracker, uri, "links")
    experiment = tracker.experiment_id
    assert links == {key: f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{run}?{QUERY}"
                     for key, run in runs.items()}
    assert tracker.runs_link() == (f"http://127.0.0.1:5000/#/experiments/{experiment}/runs?{QUERY} "
                                   f"(after `mlflow ui --backend-store-uri {uri}`)")
    monkeypatch.setenv("PTCTL_MLFLOW_UI", "https://mlflow.example.org/team/")
    run = tracker.study_run("s-1", {})
    assert tracker.link(run) == f"https://mlflow.example.org/team/#/experiments/{experiment}/runs/{run}?{QUERY}"
    assert tracker.runs_link() == f"https://mlflow.example.org/team/#/experiments/{experiment}/runs?{QUERY}"


@pytest.mark.slow  # a real MLflow server (~10 s)
def test_links_on_a_tracking_server_open_the_server(tmp_path, monkeypatch):
    monkeypatch.setenv("PTCTL_MLFLOW_UI", "http://elsewhere:5000")  # not for a server: it shows its own runs
    with running_mlflow(f"sqlite:///{tmp_path / 'server.db'}", tmp_path / "server") as (url, _):
        uri = url.replace("http://", "http://ptctl:s3cret@") + "/"  # credentials never reach a printed link
        tracker = Tracker("links", uri)
        links, runs = _links(tracker, uri, "links")
        experiment = tracker.experiment_id
        assert links == {key: f"{url}/#/experiments/{experiment}/runs/{run}?{QUERY}" for key, run in runs.items()}
        assert tracker.runs_link() == f"{url}/#/experiments/{experiment}/runs?{QUERY}"
