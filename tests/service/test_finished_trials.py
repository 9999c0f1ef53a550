"""A tune trial whose result was recorded must never train again, even when its driver is killed right after.

Over the session's real `ptctl serve`, MLflow server and Ray head: the study's MLflow trial runs are polled, the
driver is SIGKILLed as soon as a third tune trial's run is finished (one Tune created after its first save of the
experiment), the study is resumed and runs to its end. Seen in the kill-at-random run (30 studies), and here: the
third trial's finished run was deleted as abandoned and its configuration trained again under a new trial id, and
the first two finished trials trained again under their own ids (their result.json: steps [60, 60]). Expected to
fail until workers/ records finished trials durably (docs/LOG.md); killing at the first finished run did not
reproduce it (Tune's experiment state already held that trial as finished).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import yaml
from mlflow import MlflowClient
from mlflow.entities import ViewType

from studies import load_catalog
from tests.service.conftest import wait_for
from tests.service.test_cancel import ray_work

pytestmark = pytest.mark.slow


def _spec_yaml() -> str:
    data = load_catalog("tiny").as_dict()
    data["name"] = "tiny-once"
    data["tune"] |= {"num_trials": 6, "seed": 11, "asha": {"enabled": False}}
    data["train"] |= {"steps": 60, "eval_every": 20, "log_every": 20}
    data["verify"] = None
    return yaml.safe_dump(data)


@pytest.mark.xfail(reason="workers/: Tune saves its experiment state periodically, not when a trial completes; the "
                          "restored experiment trains a trial that finished after its last save again (docs/LOG.md)",
                   strict=False)
def test_a_trial_finished_just_before_its_driver_was_killed_does_not_train_again(server, service_dir,
                                                                                   mlflow_server):
    client = MlflowClient(tracking_uri=mlflow_server[0])
    with server.client() as api:
        study_id = api.post("/studies", content=_spec_yaml(), headers={"Content-Type": "application/yaml"}).json()["id"]
        query = f"tags.study_id = '{study_id}' and tags.kind = 'trial' and tags.phase = 'tune'"

        def finished_tune_runs():
            experiment = client.get_experiment_by_name("tiny-once")
            runs = client.search_runs([experiment.experiment_id], query) if experiment else []
            done = [r for r in runs if r.info.status == "FINISHED"]
            return done if len(done) >= 3 else None  # one created after Tune's first save of the experiment

        finished = wait_for(finished_tune_runs, 240, "a third tune trial's run to be finished", interval=0.05)
        drivers = [pid for pid, title in ray_work(service_dir).items() if title.startswith("ray::StudyDriverActor")]
        os.kill(drivers[0], signal.SIGKILL)  # right after the trial's result was recorded
        killed_at = time.time()
        wait_for(lambda: api.get(f"/studies/{study_id}").json()["status"] == "interrupted", 60, "the interruption")
        wait_for(lambda: not ray_work(service_dir), 60, "the lost driver's trials to die with it")
        assert api.post(f"/studies/{study_id}/resume").status_code == 200
        final = wait_for(lambda: (d := api.get(f"/studies/{study_id}").json())["status"] != "running" and d, 420,
                         "the resumed study to end", interval=2)
    assert final["status"] == "succeeded", final["error"]
    experiment = client.get_experiment_by_name("tiny-once").experiment_id
    deleted = client.search_runs([experiment], query, run_view_type=ViewType.DELETED_ONLY)
    kept = {r.info.run_id for r in client.search_runs([experiment], query)}
    assert all(r.info.run_id in kept for r in finished), f"a finished trial's run was deleted: {deleted}"
    # Tune's own record: every tune trial's config once, each trial's steps reported once (never trained again)
    configs, repeats = [], []
    for result in (service_dir / "studies" / study_id).rglob("result.json"):
        rows = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
        if not rows or rows[0].get("phase", "tune") != "tune" or "trial" in rows[0].get("config", {}):
            continue
        configs.append(json.dumps(rows[0].get("config"), sort_keys=True))
        steps = [row["step"] for row in rows]
        if len(steps) != len(set(steps)):
            repeats.append((result.parent.name, steps))
    assert not repeats, f"trials that trained again after the kill at {killed_at:.1f}: {repeats}"
    assert len(configs) == len(set(configs)), "a configuration was trained by two trials"
