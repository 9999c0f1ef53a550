"""validate's forecast of the target's optimal lr (`analysis.forecast`): what the spec gives it (the target, the
sweeps' steps and batch sizes, the non-embedding parameter count per width for Step Law's baseline), the plan's line
saying what it will be fitted on, its verdict metrics and its summary line. The validate phase
(`studies.phases.validate`) judges and tells it through these."""

from __future__ import annotations

import logging

import pandas as pd
from rich.markup import escape

from analysis.forecast import Forecast, forecast, forecast_line
from studies.budget import param_count
from studies.family import get_family
from studies.phases.base import Context, Out
from studies.spec import StudySpec
from studies.sweeps.batch import batch_steps

log = logging.getLogger(__name__)


def target_width(spec: StudySpec) -> int | None:
    """The width the forecast is for: the largest of transfer.widths, else the largest validate width."""
    if spec.transfer is not None and spec.transfer.widths:
        return max(spec.transfer.widths)
    return max(spec.validate_.widths) if spec.validate_ is not None else None


def forecast_widths(spec: StudySpec) -> list[int]:
    """The validate widths whose mup lr sweeps the forecast fits ([] without mup or with fewer than two)."""
    v = spec.validate_
    if v is None or spec.compare is not None or "mup" not in v.parametrizations or len(v.widths) < 2:
        return []
    return list(v.widths)


def non_embedding_params(spec: StudySpec, widths: list[int]) -> dict[int, float] | None:
    """Step Law's N per width: the model's parameters that do not grow with the vocabulary (the family's count at
    vocabulary size 0: the token embedding and the decoder left out); None when the family registers no count."""
    if get_family(spec.model.family).param_count is None:
        return None
    try:
        return {w: float(param_count(spec.model.family, spec.model.arch, w, 0, spec.tune.base_width)) for w in widths}
    except ValueError as e:  # a width the arch cannot build at
        log.warning("no Step Law baseline: %s", e)
        return None


def _batch_steps(spec: StudySpec) -> dict[int, int]:
    """A batch sweep's steps per batch size (`studies.sweeps.batch.batch_steps`); {} without one."""
    v = spec.validate_
    return {b: batch_steps(spec, b) for b in (v.batch_sizes if v is not None and v.batch_sizes else [])}


def forecast_at(spec: StudySpec, table: pd.DataFrame, transferred_lr: float | None, width: int, steps: int,
                batch_size: int) -> Forecast:
    """The forecast at a target of `width`, `steps` and `batch_size` from every mup lr sweep of `table` (the rows of
    the sweeps that enter it: `Sweep.forecast`); a `ValueError` saying why when the sweeps give no fit."""
    return forecast(table, target_width=width, target_steps=steps, target_batch_size=batch_size,
                    steps=spec.validate_horizon(), batch_size=spec.batch_for("validate"),
                    batch_steps=_batch_steps(spec), transferred_lr=transferred_lr, seq_len=spec.data.seq_len,
                    n_params=non_embedding_params(spec, sorted({*forecast_widths(spec), width})))


def judge_forecast(ctx: Context, table: pd.DataFrame) -> Forecast | None:
    """`forecast_at` the study's target (`target_width`, train.steps, train.batch_size) with the tune winner's lr as
    the transferred one; None without two widths under mup, or when the sweeps give no fit (the reason logged)."""
    spec, width = ctx.spec, target_width(ctx.spec)
    if not forecast_widths(spec) or width is None:
        return None
    try:
        return forecast_at(spec, table, ctx.state.centre().get("lr"), width, spec.train.steps, spec.train.batch_size)
    except ValueError as e:
        log.warning("no lr forecast: %s", e)
        return None


def forecast_plan_line(spec: StudySpec) -> str | None:
    """The plan's line: which widths, horizons and batch sizes the forecast will be fitted on, for which target, and
    what is held out; None when the study will make none."""
    widths, width = forecast_widths(spec), target_width(spec)
    if not widths or width is None:
        return None
    v = spec.validate_
    assert v is not None  # `forecast_widths` checks it
    horizons, base, by_batch = v.horizons() or [spec.validate_horizon()], spec.batch_for("validate"), _batch_steps(spec)
    batches = sorted({base, *by_batch})
    fitted = (f"widths {', '.join(map(str, widths))} at {', '.join(map(str, horizons))} steps"
              + (f" and batch sizes {', '.join(map(str, batches))}" if len(batches) > 1 else ""))
    points = [(h, base) for h in horizons] + [(s, b) for b, s in by_batch.items()]  # (steps, batch) at each width
    steps, batch = max(points)  # the held-out rule: the longest steps, the largest batch there
    held = (f"; scored on width {widths[-1]} at {steps} steps, batch {batch}, held out of the fit, beside Step Law"
            if len(widths) >= 3 else "")
    return (f"mup's optimal lr will be fitted over {fitted} and forecast at width {width}, {spec.train.steps} "
            f"steps, batch {spec.train.batch_size}{held}")


def _leave_out_metrics(f: Forecast) -> dict[str, float | None]:
    """The leave-out scoring's: points, |error| median and p90 (log2, nats) of the forecast and Step Law, each
    interval's coverage (a fraction of the points it was measured on) and the conformal interval."""
    out = f.leave_out
    if out is None:
        return {}
    summaries = {"forecast": out.errors, "steplaw": out.steplaw}
    conformal = f.conformal_interval
    return {"forecast_leave_out_points": len(out.points),
            **{f"{who}_leave_out_{stat}": getattr(s, stat) if s else None for who, s in summaries.items()
               for stat in ("median_log2", "p90_log2", "median_nats", "p90_nats")},
            "forecast_t_coverage": out.t_covered / out.t_scored if out.t_scored else None,
            "forecast_conformal_coverage": out.covered / out.scored if out.covered is not None and out.scored
            else None,
            "forecast_conformal_multiplier": out.multiplier,
            "forecast_conformal_log2_lr_lo": conformal[0] if conformal else None,
            "forecast_conformal_log2_lr_hi": conformal[1] if conformal else None}


def forecast_metrics(f: Forecast | None) -> dict[str, float]:
    """The verdict's metrics: the forecast (log2 lr, its interval, the transferred lr's expected regret, each slope),
    Step Law's at the target, the held-out errors of both, and the leave-out scoring's errors and coverages."""
    if f is None:
        return {}
    held = f.held_out
    values = {"forecast_log2_lr": f.log2_lr, "forecast_lr": f.lr,
              "forecast_log2_lr_lo": f.interval[0] if f.interval else None,
              "forecast_log2_lr_hi": f.interval[1] if f.interval else None,
              "forecast_transfer_regret": f.regret, "forecast_transfer_regret_pct": f.regret_pct,
              **{f"forecast_slope.{t}": f.coefficients[t] for t in f.terms},
              "steplaw_lr": f.steplaw_lr,
              "forecast_error_log2": held.error_log2 if held else None,
              "forecast_error_nats": held.regret if held else None,
              "steplaw_error_log2": held.steplaw_error_log2 if held else None,
              "steplaw_error_nats": held.steplaw_regret if held else None,
              "forecast_target_error_log2": f.target_check.error_log2 if f.target_check else None,
              **_leave_out_metrics(f)}
    return {k: float(v) for k, v in values.items() if v is not None}


def print_forecast(f: Forecast | None, out: Out) -> None:
    """The summary's forecast line, when there is one."""
    if f is not None:
        out.print(f"[bold]{escape(forecast_line(f))}[/]", soft_wrap=True)
