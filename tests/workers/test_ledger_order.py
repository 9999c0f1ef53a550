"""A trial's last report reaches the driver's ledger before Tune's own loggers see it: a driver killed between the
two must not leave a result that Tune's result.json holds and the ledger does not (the trial would train again)."""

from __future__ import annotations

from types import SimpleNamespace

from studies import load_catalog
from workers.ray.callback import MlflowTrials
from workers.ray.ledger import FinishedTrials, content_key
from workers.ray.trainable import LAST


def _callback(tmp_path) -> tuple[MlflowTrials, FinishedTrials]:
    callback = MlflowTrials(load_catalog("tiny"), "study", "tune", "phase-run", "sqlite:///unused.db")
    callback._later = lambda fn, *args: None  # the MLflow writes: not what this test is about
    callback._end = lambda *args, **kwargs: None
    ledger = FinishedTrials(tmp_path / "tune.finished.jsonl")
    callback.use_ledger(ledger)
    return callback, ledger


def _trial(config: dict) -> SimpleNamespace:
    return SimpleNamespace(trial_id="abc_00001", config=config, experiment_tag="1_lr=0.01", last_result={})


def test_the_last_report_is_in_the_ledger_when_tune_gets_it(tmp_path):
    callback, ledger = _callback(tmp_path)
    trial = _trial({"lr": 0.01})
    callback.on_trial_result(0, [], trial, {"step": 20, "reports": "[]"})
    assert ledger.read() == {}  # a running report: the trial may still train
    callback.on_trial_result(0, [], trial, {"step": 60, "reports": "[]", LAST: 1.0})
    [record] = ledger.read().values()  # before on_trial_complete, so before Tune's loggers write the result
    assert record["trial_id"] == "abc_00001" and [r["step"] for r in record["results"]] == [20, 60]
    callback.on_trial_complete(0, [], trial)
    assert len(ledger.path.read_text().splitlines()) == 1  # once


def test_a_trial_completed_without_the_marker_is_recorded_at_completion(tmp_path):
    callback, ledger = _callback(tmp_path)
    trial = _trial({"lr": 0.02})
    callback.on_trial_result(0, [], trial, {"step": 60, "reports": "[]"})
    callback.on_trial_complete(0, [], trial)
    assert list(ledger.read()) == [content_key({"lr": 0.02})]
