"""validate's lr forecast judged on forecast_cpu's planned grid with losses written by hand (no training): the
optimum follows a known law in width and steps, so the forecast at the target, its held-out score, the verdict's
metrics, the report, the summary and the plan line can be checked against it."""

from __future__ import annotations

import numpy as np
import pandas as pd
from rich.console import Console

from studies import load_catalog
from studies.families.pt import pt_params
from studies.phases import StudyState, TuneResult, ValidateResult
from studies.phases.base import Context
from studies.phases.validate import PHASE, validate_trials
from studies.phases.validate_forecast import forecast_plan_line, non_embedding_params, target_width
from studies.spec import StudySpec
from tests.studies._report import phase_report
from tests.studies.test_validate_phase import Folder

SPEC = load_catalog("forecast_cpu")
CENTRE = {**SPEC.space.defaults(), "lr": 0.016}


def _optimum(width: int, steps: int) -> float:
    """log2 η*: 2^-5 at width 32 and 150 steps, 0.2 octave lower per doubling of width, 0.5 per doubling of steps."""
    return -5.0 - 0.2 * np.log2(width / 32) - 0.5 * np.log2(steps / 150)


def _table(spec: StudySpec = SPEC) -> pd.DataFrame:
    rows = []
    for trial in validate_trials(spec, CENTRE):
        x, steps = np.log2(trial.hparams["lr"]), (trial.at or {}).get("horizon") or spec.validate_horizon()
        offset = 0.05 * (trial.seed - 0.5)  # each seed's optimum a little apart
        loss = 5.0 - 0.1 * np.log2(steps) + 0.05 * (x - _optimum(trial.width, steps) - offset) ** 2
        rows.append({**trial.columns(spec), "status": "completed", "eval_loss": loss, "steps": steps})
    return pd.DataFrame(rows)


def _ctx(spec: StudySpec = SPEC) -> Context:
    state = StudyState(study_id="f", spec_hash="x", phases={"tune": TuneResult(status="done", best_hparams=CENTRE)})
    return Context(spec=spec, state=state, tables=lambda name: None)


def test_the_forecast_is_judged_scored_and_told(tmp_path):
    result = PHASE.judge(_ctx(), _table(), Folder(tmp_path))
    assert isinstance(result, ValidateResult)
    f = result.forecast
    assert f is not None and (f.target_width, f.target_steps, f.target_batch_size) == (128, 300, 16)
    assert f.terms == ["width", "steps"] and f.n_points == 3 * 2 * 2
    assert abs(f.coefficients["width"] + 0.2) < 0.05 and abs(f.coefficients["steps"] + 0.5) < 0.05
    assert abs(f.log2_lr - _optimum(128, 300)) < 0.1 and f.transferred_lr == 0.016
    held = f.held_out
    assert held is not None and (held.width, held.steps) == (128, 300) and held.n_fit == 2 * 2 * 2
    assert abs(held.error_log2) < 0.25 and held.steplaw_error_log2 is not None
    assert f.target_check is None  # the target is the held-out point
    n = pt_params(SPEC.model.arch, 128, 0, 32)
    assert f.steplaw_lr is not None and abs(f.steplaw_lr - 1.79 * n**-0.713 * (300 * 16 * 64) ** 0.307) < 1e-12
    verdict = PHASE.verdict(SPEC, ValidateResult.model_validate(result.model_dump(mode="json")))
    metrics = verdict.metrics[0]
    assert metrics["forecast_log2_lr"] == f.log2_lr and metrics["forecast_error_log2"] == held.error_log2
    assert metrics["steplaw_error_log2"] == held.steplaw_error_log2 and "forecast_slope.steps" in metrics
    out = f.leave_out
    assert out is not None and metrics["forecast_leave_out_points"] == len(out.points) == 6
    assert metrics["forecast_leave_out_median_log2"] == out.errors.median_log2 < 0.25
    assert metrics["steplaw_leave_out_p90_log2"] == out.steplaw.p90_log2
    assert metrics["forecast_t_coverage"] == out.t_covered / 6
    report = phase_report(SPEC, {"tune": {"best_hparams": CENTRE}, "validate": result.model_dump()},
                          {"name": SPEC.name})
    validate = report.split("## validate")[1]
    assert "**Forecast of mup's optimal lr at width 128, 300 steps, batch 16:" in validate
    assert "| held out | 128 | 300 | 16 |" in validate and "Step Law" in validate
    console = Console(record=True, width=300)
    PHASE.summary(_ctx(), result, console, {})
    assert "Forecast of mup's optimal lr at width 128" in console.export_text()


def test_the_plan_says_what_the_forecast_will_fit(tmp_path):
    line = forecast_plan_line(SPEC)
    assert line == ("mup's optimal lr will be fitted over widths 32, 64, 128 at 150, 300 steps and forecast at width "
                    "128, 300 steps, batch 16; scored on width 128 at 300 steps, batch 16, held out of the fit, "
                    "beside Step Law")
    two = StudySpec.model_validate({**SPEC.as_dict(), "validate": {**SPEC.as_dict()["validate"], "widths": [32, 64]}})
    assert forecast_plan_line(two) is not None and "held out" not in (forecast_plan_line(two) or "")
    one = StudySpec.model_validate({**SPEC.as_dict(), "validate": {**SPEC.as_dict()["validate"], "widths": [64]}})
    result = PHASE.judge(_ctx(one), _table(one), Folder(tmp_path))  # a horizon sweep alone: no forecast
    assert forecast_plan_line(one) is None and isinstance(result, ValidateResult) and result.forecast is None


def test_the_target_and_steplaws_parameter_count():
    assert target_width(SPEC) == 128
    with_transfer = StudySpec.model_validate({**SPEC.as_dict(), "transfer": {"widths": [64, 256]}})
    assert target_width(with_transfer) == 256
    counts = non_embedding_params(SPEC, [32, 64, 128])
    assert counts == {w: float(pt_params(SPEC.model.arch, w, 0, 32)) for w in (32, 64, 128)}
    assert counts[64] == 2 * 6 * 4 * 64 * 8  # PT's uv factors: 2·k·h·d·r, k = 2γ + 2, h = 2·64/32; no vocabulary
