"""Run identity and failure bookkeeping: instance-keyed MLflow runs (real MLflow on SQLite), ptctl's errors."""

from __future__ import annotations

import pytest

from workers.errors import InfrastructureLost, StudyFailed, one_line


def test_one_line_cause_is_short_and_names_the_type():
    text = one_line(RuntimeError("boom\n  at line 3\n" + "x" * 2000))
    assert text.startswith("RuntimeError: boom at line 3") and "\n" not in text and len(text) <= 500
    err = StudyFailed("no tune trial completed", "s1", "tune")
    assert one_line(err) == "no tune trial completed"
    assert err.describe() == "study s1 (tune phase) failed: no tune trial completed"
    assert InfrastructureLost("x", "s1").describe() == "study s1 interrupted: x"


def test_state_mints_an_instance_once(tmp_path):
    from workers.driver import load_state

    path = tmp_path / "state.json"
    first = load_state(path, "s1", "h")
    assert first.instance and len(first.instance) == 16
    path.write_text(first.model_dump_json())
    assert load_state(path, "s1", "h").instance == first.instance
    assert load_state(tmp_path / "other.json", "s1", "h").instance != first.instance


def test_unreachable_ray_address_is_infrastructure_lost(monkeypatch):
    import ray

    from workers.ray.cluster import ensure_ray

    def refuse(**kwargs):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    with pytest.raises(InfrastructureLost, match="cannot reach Ray at RAY_ADDRESS='auto'"):
        ensure_ray()


def test_experiment_names_carry_the_study():
    from workers.runner import experiment_name

    assert experiment_name("tiny-1a2b", "tune") == "tiny-1a2b.tune"
    assert experiment_name("tiny-1a2b", "compare", "tune-pt-b1") == "tiny-1a2b.compare.tune-pt-b1"


@pytest.mark.slow
def test_runs_and_pruning_stay_within_an_instance(tmp_path):
    from workers.mlflow_tracker import Tracker

    tracker = Tracker("owned", f"sqlite:///{tmp_path / 'mlflow.db'}")
    ids = {}
    for inst in ("mine", "theirs"):
        study = tracker.study_run("s1", {}, instance=inst)
        phase = tracker.phase_run("s1", "tune", study, instance=inst)
        ids[inst] = {"study": study, "phase": phase,
                     "trials": [tracker.trial_run("s1", "tune", k, phase, {"status": "running"}, instance=inst)
                                for k in ("tune-a", "tune-b")]}
    assert ids["mine"]["study"] != ids["theirs"]["study"]  # the same study id, two instances: two runs
    assert ids["mine"]["trials"][0] != ids["theirs"]["trials"][0]
    assert tracker.study_run("s1", {}, instance="mine") == ids["mine"]["study"]  # found again, not made twice
    assert {r.info.run_id for r in tracker.runs("s1", "trial", "mine")} == set(ids["mine"]["trials"])

    assert tracker.prune_trials("s1", "tune", {"tune-a"}, instance="mine") == ["tune-b"]
    pruned = tracker.client.get_run(ids["mine"]["trials"][1])
    assert pruned.info.lifecycle_stage == "deleted" and pruned.info.status == "KILLED"
    assert pruned.data.tags["status"] == "abandoned"
    for run_id in ids["theirs"]["trials"]:  # the other instance's runs are untouched
        run = tracker.client.get_run(run_id)
        assert run.info.lifecycle_stage == "active" and run.info.status == "RUNNING"

    assert tracker.owns(ids["mine"]["study"], "s1", "mine")
    assert not tracker.owns(ids["theirs"]["study"], "s1", "mine")
    assert not tracker.owns("0" * 32, "s1", "mine")
