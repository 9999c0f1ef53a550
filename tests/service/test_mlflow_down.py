"""Reads never wait for MLflow (`service.progress.MlflowView.observe`): with the study's real MLflow server up, a
detail read shows its links and live rows; with it stopped, the same reads answer from the store and state.json and
say that live progress is unavailable; against a server that accepts connections and never answers (slow, not
down), a read answers once its short wait is over, and the reads after it do not wait at all."""

from __future__ import annotations

import copy
import json
import socket
from contextlib import ExitStack

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from studies import load_catalog
from studies.phases import StudyState
from tests.service.conftest import FakeExecutor, running_mlflow
from workers.folder import StudyFolder
from workers.mlflow_tracker import Tracker

TINY = load_catalog("tiny").as_dict()
pytestmark = pytest.mark.slow  # a real MLflow server


def _submit(api: TestClient, data_dir, body: dict, runs: dict[str, str]) -> str:
    created = api.post("/studies", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert created.status_code == 201, created.text
    study = created.json()
    folder = StudyFolder(study["id"], data_dir)
    folder.state_path.parent.mkdir(parents=True, exist_ok=True)
    folder.state_path.write_text(StudyState(study_id=study["id"], spec_hash=study["spec_hash"], runs=runs,
                                            instance="i1").model_dump_json())
    return study["id"]


def test_detail_reads_answer_with_mlflow_stopped_and_say_so(tmp_path, migrated):
    data = migrated(tmp_path / "data")
    mlflow = ExitStack()
    uri, _ = mlflow.enter_context(running_mlflow(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}", tmp_path / "mlflow"))
    settings = Settings(data_dir=data, ray_num_cpus=1, MLFLOW_TRACKING_URI=uri)
    with mlflow, TestClient(create_app(settings, FakeExecutor()), raise_server_exceptions=False) as api:
        tracker = Tracker(TINY["name"], uri)
        run = tracker.study_run("pending", {}, instance="i1")
        study_id = _submit(api, data, TINY, {"study": run})
        tracker.trial_run(study_id, "tune", "t0", run, {"status": "running", "width": "16"}, instance="i1")
        up = api.get(f"/studies/{study_id}").json()
        assert "study" in up["mlflow"]["links"] and up["mlflow"]["detail"] is None, up["mlflow"]
        assert [r["trial_id"] for r in api.get(f"/studies/{study_id}/trials").json()["trials"]] == ["t0"]
        mlflow.close()  # the server is stopped: a read that must ask (the trial table is always fresh) finds it away
        trials = api.get(f"/studies/{study_id}/trials")
        assert trials.status_code == 200 and [r["trial_id"] for r in trials.json()["trials"]] == ["t0"], trials.text
        detail = api.get(f"/studies/{study_id}")  # ... and the reads after it do not wait for it
        assert detail.status_code == 200, detail.text
        body = detail.json()
        assert body["status"] == "running" and body["progress"] is not None, body
        assert "live progress unavailable" in body["mlflow"]["detail"], body["mlflow"]
        assert body["mlflow"]["links"] == {} and body["mlflow"]["runs"] == {"study": run}, body["mlflow"]


def test_a_server_that_never_answers_holds_a_read_for_its_short_wait_only(tmp_path, migrated):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # connections are accepted by the kernel; nothing ever answers them
    uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
    data = migrated(tmp_path / "data")
    settings = Settings(data_dir=data, ray_num_cpus=1, tracking_uris=[uri])
    try:
        with TestClient(create_app(settings, FakeExecutor()), raise_server_exceptions=False) as api:
            body = copy.deepcopy(TINY)
            body["resources"]["tracking"]["tracking_uri"] = uri
            study_id = _submit(api, data, body, {"study": "r0"})
            first = api.get(f"/studies/{study_id}").json()["mlflow"]
            assert first["detail"].startswith("MLflow did not answer within 2 s: live progress unavailable"), first
            again = api.get(f"/studies/{study_id}").json()["mlflow"]  # while it is marked down: no wait at all
            assert again["detail"].startswith("MLflow was not answering: live progress unavailable"), again
            assert api.get("/studies").json()["total"] == 1
    finally:
        silent.close()
