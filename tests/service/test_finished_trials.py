"""A tune trial whose result was recorded must never train again, even when its driver is killed right after.

Over the session's real `ptctl serve`, MLflow server and Ray head: the study's MLflow trial runs are polled, the
driver is SIGKILLed as soon as a third tune trial's run is finished (one Tune created after its first save of the
experiment), the study is resumed and runs to its end. Seen in the kill-at-random run (30 studies), and here: the
third trial's finished run was deleted as abandoned and its configuration trained again under a new trial id, and
the first two finished trials trained again under their own ids (their result.json: steps [60, 60]). The driver's
ledger of finished trials (`workers.ray.ledger.FinishedTrials`) makes such a trial report its recorded results
again, under its first id, instead of training; killing at the first finished run did not reproduce the fault
(Tune's experiment state already held that trial as finished).
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
from tests.service.conftest import EVENT_S, ray_work, service_state, wait_for

pytestmark = pytest.mark.slow


def _spec_yaml() -> str:
    data = load_catalog("tiny").as_dict()
    data["name"] = "tiny-once"
    data["tune"] |= {"num_trials": 6, "seed": 11, "asha": {"enabled": False}}
    data["train"] |= {"steps": 60, "eval_every": 20, "log_every": 20}
    data["verify"] = None
    return yaml.safe_dump(data)


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

        finished = wait_for(finished_tune_runs, 240, "a third tune trial's run to be finished", interval=0.05,
                            seen=service_state(api, service_dir))
        drivers = [pid for pid, title in ray_work(service_dir).items() if title.startswith("ray::StudyDriverActor")]
        os.kill(drivers[0], signal.SIGKILL)  # right after the trial's result was recorded
        killed_at = time.time()
        wait_for(lambda: api.get(f"/studies/{study_id}").json()["status"] == "interrupted", EVENT_S, "the interruption")
        wait_for(lambda: not ray_work(service_dir), EVENT_S, "the lost driver's trials to die with it")
        assert api.post(f"/studies/{study_id}/resume").status_code == 200
        final = wait_for(lambda: (d := api.get(f"/studies/{study_id}").json())["status"] != "running" and d, 420,
                         "the resumed study to end", interval=2)
    assert final["status"] == "succeeded", final["error"]
    experiment = client.get_experiment_by_name("tiny-once").experiment_id
    deleted = client.search_runs([experiment], query, run_view_type=ViewType.DELETED_ONLY)
    kept = {r.info.run_id for r in client.search_runs([experiment], query)}
    assert all(r.info.run_id in kept for r in finished), f"a finished trial's run was deleted: {deleted}"
    # Tune's own record: every tune trial's config once; a step reported again is the same row (the finished trial's
    # results replayed from the driver's ledger), not a second training
    first: dict[tuple[str, int], tuple] = {}  # (config, step) → the row first reported for it
    repeats = []
    for result in sorted((service_dir / "studies" / study_id).rglob("result.json"), key=lambda p: p.stat().st_mtime):
        rows = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
        if not rows or rows[0].get("phase", "tune") != "tune" or "trial" in rows[0].get("config", {}):
            continue
        config = json.dumps(rows[0].get("config"), sort_keys=True)
        for row in rows:  # a configuration's step reported again (by its trial, or a trial TPE suggested anew after
            # the kill) is the finished trial's record replayed, the same row, never a second training
            seen = (row.get("reports"), row.get("trainable_entered"))  # the trials' reports: rows, wall times
            if first.setdefault((config, row["step"]), seen) != seen:
                repeats.append((result.parent.name, row["step"], first[(config, row["step"])], seen))
    assert not repeats, f"trials that trained again after the kill at {killed_at:.1f}: {repeats}"
