"""The tiny TauGPT study end to end through the engine: real Ray Tune (TPE + ASHA), real MLflow on SQLite."""

from collections import Counter

import pandas as pd
import pytest

from studies import load_catalog

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tau_study(study_data_dir):
    from workers.driver import run_study

    spec = load_catalog("tiny_tau")
    state = run_study(spec, "tau-e2e")
    return spec, state, study_data_dir / "studies" / "tau-e2e"


def test_tune_transfer_verify_finish_and_carry_the_winner(tau_study):
    spec, state, folder = tau_study
    assert state.status == "succeeded"
    assert [p for p, s in state.phases.items() if s.done] == ["tune", "transfer", "verify"]
    trials = pd.read_csv(folder / "artifacts" / "trials.csv")
    assert Counter(trials.phase) == {"tune": spec.tune.num_trials, "transfer": 1,
                                     "verify": spec.verify.n_samples + spec.verify.centre_seeds}
    best = state.phases["tune"].best_hparams
    assert set(best) == {"lr", "init_std", "output_mult", "temperature"}
    transfer = trials[trials.phase == "transfer"].iloc[0]
    assert transfer.width == 32 and transfer.temperature == pytest.approx(best["temperature"])
    assert transfer.status == "completed" and transfer.eval_loss < 7.6  # below ln(2000): it learned
    report = (folder / "artifacts" / "report.md").read_text()
    assert "temperature" in report  # the family's hparams head the tune table


def test_trials_log_taumode_monitoring_to_mlflow(tau_study):
    from workers.mlflow_tracker import Tracker

    spec, _, _ = tau_study
    tracker = Tracker(spec.experiment_name())
    (run,) = [r for r in tracker.runs("tau-e2e", "trial") if r.data.tags.get("phase") == "transfer"]
    metrics = run.data.metrics
    for name in ("tau.E_k.p05.layer0", "tau.E_k.p50.layer0", "tau.E_k.p95.layer0", "tau.lambda_q.p50.layer0",
                 "tau.entropy.layer0", "tau.temperature.mean", "tau.tau", "tau.collapse.layer0",
                 "stream_val_loss", "eval_loss"):
        assert name in metrics, name
    history = tracker.client.get_metric_history(run.info.run_id, "tau.E_k.p50.layer0")
    assert [m.step for m in history] == [10, 20, 30]
    assert metrics["tau.tau"] > 0 and metrics["tau.collapse.layer0"] in (0.0, 1.0)
    assert run.data.params["model"] == "tauformer"


def test_a_collapse_flag_in_a_trial_result_tags_its_mlflow_run(tmp_path):
    """The callback's own logic, fed one result by hand (a real SQLite MLflow, no Ray run)."""
    from types import SimpleNamespace

    from workers.mlflow_tracker import Tracker
    from workers.ray.callback import MlflowTrials

    spec = load_catalog("tiny_tau")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(spec.experiment_name(), uri)  # the experiment the callback writes to
    phase_run = tracker.phase_run("s1", "tune", tracker.study_run("s1", {}))
    callback = MlflowTrials(spec, "s1", "tune", phase_run, uri)
    trial = SimpleNamespace(trial_id="t1", config={"lr": 3e-3})
    callback.on_trial_result(0, [], trial, _result(10, {"eval_loss": 6.0, "tau.collapse.layer0": 0.0}))
    callback.flush()  # MLflow writes happen off Tune's loop
    (run,) = tracker.runs("s1", "trial")
    assert "taumode_collapse" not in run.data.tags and run.data.metrics["tau.collapse.layer0"] == 0.0
    callback.on_trial_result(0, [], trial, {**_result(20, {"eval_loss": 5.9, "tau.collapse.layer0": 1.0,
                                                           "tau.collapse.layer1": 0.0}), "done": False})
    callback.flush()
    (run,) = tracker.runs("s1", "trial")
    assert run.data.tags["taumode_collapse"] == "step 20: layer0"
    assert "done" not in run.data.metrics  # only the report's rows are logged


def _result(step, row):
    """A Tune result of one trial whose report holds one row."""
    from workers.ray.trainable import REPORTS
    from workers.report import TrialReport, dump_reports

    return {"step": step, REPORTS: dump_reports([TrialReport(status="running", steps=step,
                                                             rows=[{"step": step, **row}])])}
