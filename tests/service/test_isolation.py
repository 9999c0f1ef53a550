"""Concurrent studies stay apart: three tiny studies through the real API, one cancelled and resumed.

Ray Tune stages a driver's experiment files in `<Ray session>/artifacts/<start second>/<experiment>/`,
so studies whose experiments share a name (the phase) and a start second shared, and restored, each
other's trials. Every study's experiments are now named by its id: each trial table holds exactly
its own planned trials, before and after a cancel/resume, and matches its own MLflow trial runs.
"""

from __future__ import annotations

from collections import Counter

import pytest
import yaml
from mlflow import MlflowClient

from service import ray_head
from studies import load_catalog
from tests.service.conftest import service_state, wait_for

pytestmark = pytest.mark.slow
N_TUNE = 2  # each study's own trials, told apart from the others' (after a cancel/resume too)
PHASES = ("tune", "transfer", "verify", "validate", "compare")


def _spec(i: int) -> str:
    data = load_catalog("tiny").as_dict()
    data["name"] = f"tiny-iso{i}"
    data["train"] |= {"steps": 20, "eval_every": 10, "warmup_steps": 2}
    data["tune"] |= {"num_trials": N_TUNE, "seed": 20 + i, "max_concurrent": 1, "asha": {"enabled": False}}
    data["verify"] = None
    return yaml.safe_dump(data)


def _check_tables(api, mlflow_url: str, ids: list[str]) -> dict[str, set[str]]:
    """Each finished study's trial table: its planned trials exactly, each one its own live MLflow run."""
    client, seen = MlflowClient(tracking_uri=mlflow_url), {}
    for study_id in ids:
        rows = api.get(f"/studies/{study_id}/trials").json()["trials"]
        assert Counter(r["phase"] for r in rows) == {"tune": N_TUNE, "transfer": 1}, (study_id, rows)
        tune = {r["trial_id"] for r in rows if r["phase"] == "tune"}
        assert len(tune) == N_TUNE, rows
        experiment = client.get_experiment_by_name(study_id.rsplit("-", 1)[0]).experiment_id
        runs = client.search_runs([experiment], max_results=1000,
                                  filter_string=f"tags.study_id = '{study_id}' and tags.kind = 'trial'")
        assert {r.data.tags["trial_key"] for r in runs if r.data.tags["phase"] == "tune"} == tune, study_id
        assert {r["mlflow_run_id"] for r in rows} == {r.info.run_id for r in runs}, study_id
        seen[study_id] = tune
    for a in ids:
        for b in ids:
            assert a == b or not seen[a] & seen[b], f"{a} and {b} share trials {seen[a] & seen[b]}"
    return seen


def _check_folders(service_dir, ids: list[str]) -> None:
    """Tune experiments and Ray's driver staging folders are named by study id, never by a bare phase."""
    for study_id in ids:
        experiments = [p.name for p in (service_dir / "studies" / study_id / "ray").iterdir() if p.is_dir()]
        assert experiments and all(name.startswith(f"{study_id}.") for name in experiments), experiments
    staged = [p.name for p in ray_head.temp_dir(service_dir).glob("session_*/artifacts/*/*") if p.is_dir()]
    assert not [name for name in staged if name in PHASES], staged
    for study_id in ids:
        assert any(name.startswith(f"{study_id}.") for name in staged), (study_id, staged)


def test_concurrent_studies_keep_their_own_trials(server, service_dir, mlflow_server):
    with server.client() as api:
        headers = {"Content-Type": "application/yaml"}
        ids = []
        for i in range(3):
            created = api.post("/studies", content=_spec(i), headers=headers)
            assert created.status_code == 201, created.text
            ids.append(created.json()["id"])
        status = lambda sid: api.get(f"/studies/{sid}").json()  # noqa: E731
        wait_for(lambda: status(ids[0])["progress"]["tune"]["done"] >= 1, 300, "a finished tune trial of the first",
                 seen=service_state(api, service_dir))
        assert api.post(f"/studies/{ids[0]}/cancel").status_code == 200
        for sid in ids[1:]:
            final = wait_for(lambda sid=sid: (d := status(sid))["status"] not in ("pending", "running") and d, 600,
                             f"study {sid} to finish")
            assert final["status"] == "succeeded", final
        before = _check_tables(api, mlflow_server[0], ids[1:])

        assert api.post(f"/studies/{ids[0]}/resume").status_code == 200
        final = wait_for(lambda: (d := status(ids[0]))["status"] not in ("pending", "running") and d, 600,
                         "the resumed study to finish")
        assert final["status"] == "succeeded", final
        after = _check_tables(api, mlflow_server[0], ids)
        assert {k: after[k] for k in ids[1:]} == before
    _check_folders(service_dir, ids)
