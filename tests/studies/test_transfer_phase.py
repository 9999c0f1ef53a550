"""The transfer phase judged on hand-written losses (no training): whether the transferred hparams' eval loss falls
with width, in its result, its verdict (MLflow), its report section and its summary lines; older records load."""

from __future__ import annotations

import pandas as pd

from analysis.transfer import BETTER, CAUSE, UNJUDGED, WORSE
from studies import load_catalog
from studies.phases import StudyState, TransferResult, TuneResult
from studies.phases.base import Context
from studies.phases.transfer import PHASE, base_joins, transfer_trials
from studies.plan import PlannedTrial
from studies.spec import StudySpec
from tests.studies._report import phase_report
from tests.studies.test_validate_phase import Folder
from tests.studies.test_weight_decay import _Out

SPEC = load_catalog("cpu_demo")  # tuned at 32, transferred to 64 and 128 at the tune trials' steps and batch
CENTRE = {**SPEC.space.defaults(), "lr": 0.01}


def _ctx(spec: StudySpec, losses: dict[int, float]) -> tuple[Context, pd.DataFrame]:
    """A study whose tune winner (and a worse trial) ran at the base width and whose transfer trials ran at
    `losses`' widths (seed s adds 0.002·s)."""
    tune = [PlannedTrial.for_tune(spec, f"{i}", {"lr": lr}) for i, lr in enumerate((0.01, 0.05))]
    tune_rows = pd.DataFrame([{**t.columns(spec), "status": "completed", "eval_loss": losses[t.width] + 0.3 * i}
                              for i, t in enumerate(tune)])
    rows = pd.DataFrame([{**t.columns(spec), "status": "completed", "eval_loss": losses[t.width] + 0.002 * t.seed,
                          "params": t.width, "tokens": 100, "wall_time_s": 1.0} for t in transfer_trials(spec, CENTRE)])
    state = StudyState(study_id="t", spec_hash="h", phases={"tune": TuneResult(status="done", best_hparams=CENTRE)})
    return Context(spec, state, {"tune": tune_rows}.get), rows


def _judged(tmp_path, spec: StudySpec, losses: dict[int, float]) -> tuple[Context, TransferResult]:
    ctx, rows = _ctx(spec, losses)
    result = PHASE.judge(ctx, rows, Folder(tmp_path))
    assert isinstance(result, TransferResult)
    return ctx, result


def test_wider_is_worse_is_a_warning_in_the_verdict_the_report_and_the_summary(tmp_path, caplog):
    ctx, result = _judged(tmp_path, SPEC, {32: 5.01, 64: 5.16, 128: 5.33})
    [trend] = result.trends
    assert (trend.parametrization, trend.verdict, trend.widths) == ("mup", WORSE, [32, 64, 128])  # the base joined
    assert trend.line.startswith("wider is worse under mup: eval loss 5.010 → 5.160 → 5.330 at widths 32, 64, 128 "
                                 "(+0.160 per doubling, 95 % interval [+0.") and trend.line.endswith(CAUSE)
    assert trend.line in caplog.text
    verdict = PHASE.verdict(SPEC, result)
    assert verdict.tags == {"width_trend.mup": WORSE}
    assert set(verdict.metrics[-1]) == {"step", "width_slope.mup", "width_slope_lo.mup", "width_slope_hi.mup"}
    assert "Wider is worse under mup: eval loss 5.010 → 5.160 → 5.330" in verdict.sentence
    assert ("tags.`width_trend.mup`" in dict(PHASE.columns(SPEC, verdict)).values()
            and "metrics.`width_slope.mup`" in dict(PHASE.columns(SPEC, verdict)).values())
    report = phase_report(SPEC, {"tune": {"best_hparams": CENTRE}, "transfer": result.model_dump()}, {"name": "t"})
    assert f"**width trend:** warning: {trend.line}" in report.split("## transfer")[1]
    printed: list[str] = []
    PHASE.summary(ctx, result, _Out(printed), {})
    assert printed[0].startswith("[yellow]width trend:[/] warning: wider is worse under mup")


def test_wider_is_better_and_a_base_that_trained_otherwise_stays_out(tmp_path):
    _, better = _judged(tmp_path, SPEC, {32: 5.3, 64: 5.1, 128: 4.9})
    assert better.trends[0].verdict == BETTER and not better.trends[0].warning
    assert PHASE.verdict(SPEC, better).tags == {"width_trend.mup": BETTER}
    shorter = StudySpec.model_validate({**SPEC.as_dict(), "tune": {**SPEC.as_dict()["tune"], "steps": 75}})
    assert base_joins(SPEC) and not base_joins(shorter)
    _, alone = _judged(tmp_path, shorter, {32: 5.01, 64: 5.16, 128: 5.33})
    [trend] = alone.trends  # one seed at 64 and 128: a slope, no residual to size the noise
    assert (trend.widths, trend.verdict, trend.ci) == ([64, 128], UNJUDGED, None)
    assert "Not judged under mup" in PHASE.verdict(shorter, alone).sentence


def test_an_older_record_without_trends_loads_and_says_nothing_of_them():
    older = TransferResult.model_validate({"status": "done", "widths": [{"width": 64, "eval_loss_mean": 5.7}]})
    assert older.trends == []
    verdict = PHASE.verdict(SPEC, older)
    assert verdict.tags == {} and verdict.metrics == [{"step": 64, "eval_loss": 5.7}]
    assert verdict.sentence == "Zero-shot eval loss per width: 64: 5.7000."
