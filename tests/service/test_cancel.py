"""Losing a driver, resuming, cancelling: against the real server and Ray head of the session.

A study whose driver actor dies becomes `interrupted` (the reconciler notices), `resume` starts a new
driver on the same study id, `cancel` kills it, and then no process of the study's Ray work is left:
no driver, no Tune trial, and no placement group a dead driver held.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from mlflow import MlflowClient

from studies import load_catalog
from tests.service.conftest import EVENT_S, ray_work, wait_for
from tests.workers.test_gpu_batches import ROOT
from tests.workers.test_groups import MAKER

pytestmark = pytest.mark.slow


def _spec_yaml() -> str:
    data = load_catalog("tiny").as_dict()
    data["name"] = "tiny-cancel"
    data["tune"] |= {"num_trials": 12, "seed": 7, "asha": {"enabled": False}}  # long enough to interrupt twice
    # seconds per trial, so a poll sees one running beside a finished one (30-step trials came and went unseen)
    data["train"] |= {"steps": 150, "eval_every": 50, "log_every": 50}
    data["verify"] = None
    return yaml.safe_dump(data)


def test_lost_driver_is_interrupted_then_resumed_then_cancelled(server, service_dir, mlflow_server):
    with server.client() as api:
        study_id = api.post("/studies", content=_spec_yaml(), headers={"Content-Type": "application/yaml"}).json()["id"]

        status = lambda: api.get(f"/studies/{study_id}").json()  # noqa: E731

        def training() -> bool:
            tune = status()["progress"]["tune"]
            return tune["done"] >= 1 and tune["running"] >= 1

        wait_for(training, 240, "tune trials to be training", seen=status)
        drivers = [pid for pid, title in ray_work(service_dir).items() if title.startswith("ray::StudyDriverActor")]
        assert len(drivers) == 1, ray_work(service_dir)
        os.kill(drivers[0], signal.SIGKILL)  # the driver dies behind the API's back
        lost = wait_for(lambda: (d := api.get(f"/studies/{study_id}").json())["status"] == "interrupted" and d, EVENT_S,
                        "the reconciler to mark the study interrupted")
        assert "resume" in lost["error"]
        wait_for(lambda: not ray_work(service_dir), EVENT_S, "the lost driver's trials to die with it")

        resumed = api.post(f"/studies/{study_id}/resume")
        assert resumed.status_code == 200 and resumed.json()["status"] == "running"
        assert resumed.json()["attempts"] == 2
        assert api.post(f"/studies/{study_id}/resume").status_code == 409  # already running
        wait_for(lambda: len(ray_work(service_dir)) >= 2, 180, "a trial process beside the resumed driver")

        cancelled = api.post(f"/studies/{study_id}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        wait_for(lambda: not ray_work(service_dir), EVENT_S, "every trial and the driver to stop after cancel")
        time.sleep(4)
        assert not ray_work(service_dir), "Ray work came back after cancel"
        assert api.get(f"/studies/{study_id}").json()["status"] == "cancelled"
        assert api.post(f"/studies/{study_id}/cancel").status_code == 409

    client = MlflowClient(tracking_uri=mlflow_server[0])
    experiment = client.get_experiment_by_name("tiny-cancel").experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.study_id = '{study_id}'", max_results=1000)
    assert runs and all(r.info.status != "RUNNING" for r in runs), "the cancelled study left MLflow runs open"
    assert any(r.data.tags.get("status") == "cancelled" for r in runs)


def test_a_cancel_stops_every_member_of_a_batched_phase(server, service_dir, mlflow_server):
    """Cancelled while verify trains its samples as batches of 4 (`resources.batch_members`): no trial process is
    left, and no member's run stays open."""
    data = load_catalog("tiny").as_dict()
    data["name"] = "tiny-cancel-batched"
    data["tune"] |= {"num_trials": 2, "seed": 8, "asha": {"enabled": False}}
    data["verify"] |= {"steps": 1500}  # a batch trains long enough to be cancelled mid-way
    data["train"] |= {"eval_every": 50, "log_every": 50}
    data["resources"] |= {"batch_members": 4}
    with server.client() as api:
        study_id = api.post("/studies", content=yaml.safe_dump(data),
                            headers={"Content-Type": "application/yaml"}).json()["id"]
        status = lambda: api.get(f"/studies/{study_id}").json()  # noqa: E731
        wait_for(lambda: status()["progress"]["verify"]["running"] >= 4, 240, "a verify batch's members to train",
                 seen=status)
        assert api.post(f"/studies/{study_id}/cancel").json()["status"] == "cancelled"
        wait_for(lambda: not ray_work(service_dir), EVENT_S, "every batch and the driver to stop after cancel")

    client = MlflowClient(tracking_uri=mlflow_server[0])
    experiment = client.get_experiment_by_name("tiny-cancel-batched").experiment_id
    members = client.search_runs([experiment], filter_string=f"tags.study_id = '{study_id}' and tags.phase = 'verify'",
                                 max_results=1000)
    batched = [r for r in members if r.data.tags.get("batch")]
    assert len(batched) >= 4, [r.data.tags for r in members]
    assert all(r.info.status != "RUNNING" for r in members), "a cancelled batch left a member's run open"


ORPHAN = MAKER + """
import sys
from pathlib import Path
from service.execution import RayExecutor
from service.settings import Settings

RayExecutor(Settings(data_dir=Path(sys.argv[1]))).connect()  # the service's Ray head, as the service joins it
group, _ = made("ptctl-driver-orphan", kill=True)  # kept by Ray while this child's job lives
until(lambda: placement_group_table()[group]["state"] == "REMOVED", timeout=float(sys.argv[2]))
"""


def test_the_service_releases_the_groups_a_dead_driver_left(server, service_dir):
    """A placement group whose creator, a driver, is dead is removed by the API's reconciler (here every second),
    so the CPUs it held come back for the studies after it (`workers.ray.actors`)."""
    done = subprocess.run([sys.executable, "-c", ORPHAN, str(service_dir), str(EVENT_S)], cwd=ROOT,
                          capture_output=True, text=True, timeout=EVENT_S + 120,
                          env={**os.environ, "PTCTL_DATA_DIR": str(service_dir), "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "placement group(s) that dead drivers left holding CPUs" in server.log.read_text()
