"""Two data directories, one real MLflow server: the same spec run by `ptctl study run` from both.

The CLI's study id is name + spec hash, the same in both directories; each study must still find,
reuse and prune only the runs it created (its `state.json` instance id), so neither deletes nor
appends to the other's runs. A resume against another tracking store stops with a one-line error
naming both stores.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from mlflow.entities import ViewType

from studies import load_catalog
from tests.service._cli import data_dir, one_line_error, ptctl

pytestmark = pytest.mark.slow
N_TUNE = 2


def _spec(tmp: Path) -> Path:
    data = load_catalog("tiny").as_dict()
    data["name"] = "tiny-owned"
    data["tune"] |= {"num_trials": N_TUNE, "seed": 11}  # max_concurrent 2: the tune phase is one round of trials
    data["verify"] = None
    path = tmp / "tiny-owned.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, mlflow_server):
    tmp = tmp_path_factory.mktemp("ownership")
    spec, url = _spec(tmp), mlflow_server[0]
    dirs = {"a": data_dir(tmp, "a"), "b": data_dir(tmp, "b")}
    for key in ("a", "b"):
        done = ptctl(["study", "run", str(spec)], dirs[key], url)
        assert done.returncode == 0, done.stdout + done.stderr
    states = {k: json.loads(next((d / "studies").glob("tiny-owned-*/state.json")).read_text()) for k, d in dirs.items()}
    return spec, url, dirs, states


def _all_runs(url: str, study_id: str) -> list:
    client = MlflowClient(tracking_uri=url)
    experiment = client.get_experiment_by_name("tiny-owned").experiment_id
    return client.search_runs([experiment], filter_string=f"tags.study_id = '{study_id}'", max_results=1000,
                              run_view_type=ViewType.ALL)


def test_each_data_directory_keeps_its_own_runs(two_runs):
    spec, url, dirs, states = two_runs
    a, b = states["a"], states["b"]
    assert a["study_id"] == b["study_id"]
    assert not set(a["runs"].values()) & set(b["runs"].values()), "the second study reused the first's runs"
    runs = _all_runs(url, a["study_id"])
    live = {r.info.run_id for r in runs if r.info.lifecycle_stage == "active"}
    for state in (a, b):
        assert set(state["runs"].values()) <= live, "a study's state points at deleted runs"
        tune = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == state["runs"]["tune"]]
        assert len(tune) == N_TUNE and all(r.info.lifecycle_stage == "active" for r in tune), "tune runs deleted"
    assert a["instance"] != b["instance"]
    by_instance = {inst: [r for r in runs if r.data.tags.get("study_instance") == inst]
                   for inst in (a["instance"], b["instance"])}
    assert sum(len(v) for v in by_instance.values()) == len(runs), "a run without its study instance"
    client = MlflowClient(tracking_uri=url)
    for state in (a, b):
        mine = by_instance[state["instance"]]
        kinds = Counter(r.data.tags["kind"] for r in mine)
        assert kinds == {"study": 1, "phase": 2, "trial": N_TUNE + 1}, kinds  # the tune trials, 1 transfer trial
        assert all(r.info.lifecycle_stage == "active" and r.info.status == "FINISHED" for r in mine)
        assert set(state["runs"].values()) <= {r.info.run_id for r in mine}  # its state points at its own runs
        artifacts = {f.path for f in client.list_artifacts(state["runs"]["study"])}
        assert {"report.md", "trials.csv"} <= artifacts  # the report lives on a live run of its own
        for run in mine:
            if run.data.tags["kind"] == "trial":
                steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
                assert len(steps) == len(set(steps)), f"duplicated steps {steps} in {run.data.tags['trial_key']}"


def test_resume_touches_only_its_own_runs(two_runs):
    spec, url, dirs, states = two_runs
    before = {r.info.run_id: (r.info.status, r.info.lifecycle_stage) for r in _all_runs(url, states["b"]["study_id"])}
    again = ptctl(["study", "run", str(spec)], dirs["a"], url)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already done, skipped" in again.stdout
    after = {r.info.run_id: (r.info.status, r.info.lifecycle_stage) for r in _all_runs(url, states["b"]["study_id"])}
    assert after == before


def test_resume_against_another_store_names_both(two_runs, tmp_path):
    spec, url, dirs, states = two_runs
    other = f"sqlite:///{tmp_path / 'other.db'}"
    out = one_line_error(ptctl(["study", "run", str(spec)], dirs["a"], other))
    assert url in out and other in out, out
    state = json.loads(next((dirs["a"] / "studies").glob("tiny-owned-*/state.json")).read_text())
    assert state["status"] == "failed" and "does not hold" in state["error"]
