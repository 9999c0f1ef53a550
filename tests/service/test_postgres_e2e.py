"""The cluster set-up's databases, end to end: a real `ptctl serve` whose study store is PostgreSQL and whose
MLflow tracking server runs on PostgreSQL too (`mlflow server --backend-store-uri postgresql+psycopg://...`), both
on the throwaway server of `tests/service/postgres.py`, with the API's own embedded Ray head.

In order: a tiny study runs through the API, its trial runs land in MLflow's PostgreSQL database exactly once;
then the API is SIGKILLed with two submits cut short (one stored `pending`, one `running` with a driver actor that
was never told to run), and the restarted API starts both; their clients' retries (same `Idempotency-Key`) answer
them running, and both succeed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from mlflow import MlflowClient

from service import ray_head
from studies import load_catalog
from tests.conftest import DEFAULT_DATA
from tests.service.conftest import ADMIN, READ, Server, running_mlflow, wait_for

pytestmark = pytest.mark.slow
TERMINAL = ("succeeded", "failed", "cancelled")


def _spec(name: str) -> str:
    data = load_catalog("tiny").as_dict()
    data["name"] = name
    data["train"] |= {"steps": 20}
    data["tune"] |= {"num_trials": 2, "asha": {"enabled": False}}
    data["verify"] = None
    return yaml.safe_dump(data)


@pytest.fixture(scope="module")
def on_postgres(tmp_path_factory, postgres):
    """`ptctl serve` on a fresh data directory, its store and its MLflow server's store on PostgreSQL."""
    data = tmp_path_factory.mktemp("ptctl-pg-e2e")
    (DEFAULT_DATA / "corpora").mkdir(parents=True, exist_ok=True)
    (data / "corpora").symlink_to(DEFAULT_DATA / "corpora")
    with running_mlflow(postgres.fresh_database("mlflow"), data / "mlflow-server") as (mlflow_url, _):
        env = {**os.environ, "PTCTL_DATA_DIR": str(data), "MLFLOW_TRACKING_URI": mlflow_url, "RAY_ADDRESS": "",
               "PTCTL_DATABASE_URL": postgres.fresh_database("ptctl"), "PTCTL_API_TOKENS": f"admin:{ADMIN},read:{READ}",
               "PTCTL_RAY_NUM_CPUS": "2", "PTCTL_RECONCILE_S": "1", "PTCTL_TOKEN": "", "PTCTL_SERVER": ""}
        srv = Server(env, data / "api.log")
        srv.data, srv.mlflow = data, mlflow_url
        try:
            srv.start()
            yield srv
        finally:
            srv.stop()
            ray_head.stop(data)


def _status(api, study_id: str) -> dict:
    return api.get(f"/studies/{study_id}").json()


def _finish(api, study_id: str) -> dict:
    return wait_for(lambda: (d := _status(api, study_id))["status"] in TERMINAL and d, 420,
                    f"study {study_id} to finish", interval=2)


def test_a_tiny_study_runs_with_the_store_and_mlflow_on_postgres(on_postgres, postgres):
    with on_postgres.client() as api:
        submitted = api.post("/studies", content=_spec("pg-tiny"), headers={"Content-Type": "application/yaml"})
        assert submitted.status_code == 201, submitted.text
        study_id = submitted.json()["id"]
        final = _finish(api, study_id)
        trials = api.get(f"/studies/{study_id}/trials").json()
    assert final["status"] == "succeeded", final["error"]
    client = MlflowClient(tracking_uri=on_postgres.mlflow)
    experiment = client.get_experiment_by_name("pg-tiny")
    runs = client.search_runs([experiment.experiment_id], f"tags.study_id = '{study_id}'", max_results=1000)
    trial_runs = [r for r in runs if r.data.tags.get("kind") == "trial"]
    assert len(trial_runs) == len(trials["trials"]) == 3, trials  # 2 tune trials, 1 transfer trial
    assert len({r.data.params.get("trial_id", r.info.run_name) for r in trial_runs}) == 3, "a trial logged twice"
    import psycopg  # the runs are in MLflow's PostgreSQL database, not in a file or SQLite store beside it

    with psycopg.connect(postgres.url("mlflow").replace("+psycopg", "")) as conn:
        row = conn.execute("SELECT count(*) FROM runs WHERE experiment_id = %s",
                           (int(experiment.experiment_id),)).fetchone()
    assert row is not None and row[0] == len(runs) >= 3 + 1 + 2  # the trials, the study's run, two phase runs


# A submit cut short by the API's death: stored (`pending`), or also given an idle driver actor and moved to
# `running` (the API died before telling the driver to run).
_CUT_SHORT = """
import sys
from service.execution import RayExecutor
from service.settings import Settings
from service.store import Store
from studies.spec import StudySpec
import yaml
step, key = sys.argv[1], sys.argv[2]
settings = Settings()
store = Store(settings.db_url)
spec = StudySpec.model_validate(yaml.safe_load(sys.stdin.read()))
study, _ = store.create(f"cut-{step}", spec.as_dict(), spec.content_hash(), key)
if step == "running":
    RayExecutor(settings).start(study.id)
    store.transition(study.id, "running", expect=["pending"])
"""


def test_submits_cut_short_by_the_api_death_are_started_by_the_next_api(on_postgres):
    on_postgres.kill()
    for step in ("pending", "running"):
        subprocess.run([sys.executable, "-c", _CUT_SHORT, step, f"key-{step}"], input=_spec(f"cut-{step}"),
                       text=True, env=on_postgres.env, check=True, timeout=120)
    on_postgres.start()
    with on_postgres.client() as api:
        for step in ("pending", "running"):
            now = _status(api, f"cut-{step}")  # start-up started them before the API answered
            assert now["status"] in ("running", "succeeded"), now  # (before: pending, interrupted)
            retried = api.post("/studies", content=_spec(f"cut-{step}"),
                               headers={"Content-Type": "application/yaml", "Idempotency-Key": f"key-{step}"})
            assert retried.status_code == 200 and retried.json()["id"] == f"cut-{step}", retried.text
            assert retried.json()["status"] in ("running", "succeeded"), retried.json()
        finals = [_finish(api, f"cut-{step}") for step in ("pending", "running")]
    assert [f["status"] for f in finals] == ["succeeded", "succeeded"], [f["error"] for f in finals]
    assert [f["attempts"] for f in finals] == [1, 2]  # the idle driver was replaced by a second attempt
