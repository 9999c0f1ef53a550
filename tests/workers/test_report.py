"""A trial's report is the one form of its result: a per-step metric a model adds reaches the trial's MLflow run
with no registration, and a final field added to `TrialReport` is a column of the trial table."""

from __future__ import annotations

import math

from pydantic import create_model

from studies import load_catalog
from studies.plan import PlannedTrial
from tests.workers.test_family import _Tags, mlp_family  # noqa: F401  (the fixture)
from workers.report import TrialReport
from workers.runner import InProcessRunner, PhaseJob, trial_row


def test_a_final_field_added_to_the_report_is_a_trial_table_column():
    spec = load_catalog("tiny")
    trial = PlannedTrial("transfer-w32-s0", "transfer", 32, 0, spec.space.defaults())
    Extended = create_model("Extended", __base__=TrialReport, grad_norm=(float, math.nan))
    row = trial_row(spec, trial, Extended(status="completed", eval_loss=4.0, steps=12, grad_norm=0.5))
    assert row["grad_norm"] == 0.5 and row["eval_loss"] == 4.0 and row["steps"] == 12
    diverged = trial_row(spec, trial, TrialReport(status="diverged", eval_loss=4.0, best_eval_loss=4.5))
    assert math.isnan(diverged["eval_loss"]) and diverged["best_eval_loss"] == 4.5


def test_a_per_step_metric_a_model_adds_reaches_the_trials_run(mlp_family, tmp_path):  # noqa: F811
    """The MLP family's `eval_metrics` returns `mlp.decoder_norm` and `mlp.evals`: nothing registers them."""
    spec = load_catalog("tiny")
    data = spec.as_dict()
    data["model"] = {"family": "mlp", "parametrization": "standard", "arch": {"hidden_mult": 2}}
    data["space"] = {}
    data["train"].update(steps=8, eval_every=4, log_every=4, warmup_steps=2)
    data["tune"]["asha"]["enabled"] = False
    spec = type(spec).model_validate(data)
    logged: list[dict] = []
    tracker = _Tags()
    tracker.log_metrics = lambda run, rows: logged.extend(rows)
    trial = PlannedTrial("transfer-w32-s0", "transfer", spec.tune.base_width, 0, spec.space.defaults())
    table = InProcessRunner().run_phase(PhaseJob(spec, "transfer", [trial], "s1", None, "s1/transfer", tracker,
                                                 tmp_path, "s1.transfer"))
    assert table.status.tolist() == ["completed"]
    evals = [r for r in logged if "mlp.evals" in r]
    assert [r["step"] for r in evals] == [4, 8] and all(r["mlp.decoder_norm"] > 0 for r in evals)
