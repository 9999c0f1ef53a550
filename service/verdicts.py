"""A study's verdicts as the API shows them: each finished phase's typed result (`state.json`, the same results the
report renders) as `service.schemas.Verdicts`, the one-line `VerdictBrief` of `GET /studies`, and the lines
`ptctl study show` prints.

Pure: nothing here reads a file. Module level imports only the schemas: the CLI renders the lines without pandas
(`study_verdicts` imports the phases, which import it, when the server calls it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from service.schemas import (
    CompareBudget,
    CompareVerdict,
    DriftVerdict,
    ForecastVerdict,
    RegretVerdict,
    TransferPoint,
    TransferVerdict,
    TuneVerdict,
    ValidateVerdict,
    VerdictBrief,
    Verdicts,
    VerifyVerdict,
    WidthTrendVerdict,
)

if TYPE_CHECKING:
    from analysis import Certificate, LRDrift, Regret
    from analysis.forecast import Forecast
    from studies.phases import CompareResult, StudyState, TransferResult, TuneResult, ValidateResult


def _num(value: Any) -> float | None:
    """A finite float, else None (JSON has no NaN)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _ci(ci: tuple[float, float] | None) -> tuple[float, float] | None:
    """A finite interval, else None (a fit with no spread can leave NaN bounds)."""
    return (float(ci[0]), float(ci[1])) if ci and all(_num(x) is not None for x in ci) else None


def tune_verdict(result: TuneResult) -> TuneVerdict:
    return TuneVerdict(best_eval_loss=_num(result.best_eval_loss), n_trials=result.n_trials,
                       n_diverged=result.n_diverged)


def transfer_verdict(result: TransferResult) -> TransferVerdict:
    points = [TransferPoint(width=int(r["width"]), eval_loss=_num(r.get("eval_loss_mean"))) for r in result.widths]
    trends = [WidthTrendVerdict(parametrization=t.parametrization, verdict=t.verdict, slope=_num(t.slope),
                                ci95=_ci(t.ci),
                                warning=t.warning, line=t.line) for t in result.trends]
    return TransferVerdict(widths=sorted(points, key=lambda p: p.width), trends=trends)


def verify_verdict(cert: Certificate) -> VerifyVerdict:
    return VerifyVerdict(certified=cert.certified, bound=cert.upper_bound, p=cert.p, alpha=cert.alpha,
                         n_better=cert.n_better, n_samples=cert.n_samples, centre_rank=cert.centre_rank,
                         centre_loss=_num(cert.centre_loss), verdict=cert.verdict)


def drift_verdict(drift: LRDrift) -> DriftVerdict:
    judged, beside = drift.judged
    ci = drift.drift_ci.get(judged)
    width = drift.optima[0].width if drift.axis != "width" and drift.optima else None
    return DriftVerdict(hparam=drift.hparam, axis=drift.axis, width=width, parametrization=judged,
                        drift=_num(drift.mup_drift), ci95=_ci(ci),
                        baseline=beside if beside in drift.drift else None,
                        baseline_drift=_num(drift.drift.get(beside)), threshold=drift.threshold,
                        passed=drift.passed, verdict=drift.verdict)


def regret_verdict(regret: Regret) -> RegretVerdict:
    ci = regret.ci
    return RegretVerdict(hparam=regret.hparam, parametrization=regret.parametrization, width=regret.width,
                         regret=_num(regret.regret), regret_pct=_num(regret.regret_pct),
                         ci95=_ci(ci), batch_size=regret.at if regret.axis == "batch" else None,
                         seq_len=regret.at if regret.axis == "seq_len" else None, note=regret.note)


def forecast_verdict(f: Forecast) -> ForecastVerdict:
    held = f.held_out
    return ForecastVerdict(width=f.target_width, steps=f.target_steps, batch_size=f.target_batch_size, lr=f.lr,
                           ci95=(2.0 ** f.interval[0], 2.0 ** f.interval[1]) if f.interval else None,
                           transferred_regret=_num(f.regret), steplaw_lr=_num(f.steplaw_lr),
                           held_out_error_log2=_num(held.error_log2) if held else None,
                           steplaw_held_out_error_log2=_num(held.steplaw_error_log2) if held else None,
                           **_leave_out_fields(f))


def _leave_out_fields(f: Forecast) -> dict[str, Any]:
    out, conformal = f.leave_out, f.conformal_interval
    if out is None:
        return {}
    law = out.steplaw
    return {"conformal_ci95": (2.0 ** conformal[0], 2.0 ** conformal[1]) if conformal else None,
            "leave_out_points": len(out.points), "ci95_covered": out.t_covered, "ci95_scored": out.t_scored,
            "conformal_covered": out.covered, "conformal_scored": out.scored, "conformal_source": out.source or None,
            "conformal_level": out.level,
            "leave_out_median_error_log2": _num(out.errors.median_log2),
            "leave_out_p90_error_log2": _num(out.errors.p90_log2),
            "leave_out_median_error_nats": _num(out.errors.median_nats),
            "steplaw_leave_out_median_error_log2": _num(law.median_log2) if law else None}


def validate_verdict(result: ValidateResult) -> ValidateVerdict:
    drifts = [drift_verdict(d) for d in result.drifts]
    return ValidateVerdict(passed=all(d.passed for d in drifts), drifts=drifts,
                           regret=[regret_verdict(r) for r in result.regrets],
                           forecast=forecast_verdict(result.forecast) if result.forecast else None)


def compare_verdict(result: CompareResult) -> CompareVerdict:
    """Per budget: the family ranked first and the study's transferred model's rank (`analysis.compare_table`)."""
    budgets = []
    for budget in sorted({float(r["budget"]) for r in result.summary}):
        rows = [r for r in result.summary if float(r["budget"]) == budget]
        first = min(rows, key=lambda r: int(r["rank"]))
        ours = next((r for r in rows if r.get("role") == "transferred"), None)
        loss = _num(first.get("eval_loss_mean"))  # None: no family finished a seed at this budget
        rank = int(ours["rank"]) if ours is not None and _num(ours.get("eval_loss_mean")) is not None else None
        budgets.append(CompareBudget(budget=budget, winner=str(first["family"]) if loss is not None else None,
                                     eval_loss=loss, transferred_rank=rank))
    return CompareVerdict(budgets=budgets)


def study_verdicts(state: StudyState | None) -> Verdicts:
    """Each finished phase's verdict (none before the driver wrote `state.json`)."""
    from studies.phases import CompareResult, TransferResult, TuneResult, ValidateResult, VerifyResult

    if state is None:
        return Verdicts()
    tune, transfer = state.result("tune", TuneResult), state.result("transfer", TransferResult)
    verify, validate = state.result("verify", VerifyResult), state.result("validate", ValidateResult)
    compare = state.result("compare", CompareResult)
    return Verdicts(tune=tune_verdict(tune) if tune else None,
                    transfer=transfer_verdict(transfer) if transfer else None,
                    verify=verify_verdict(verify.certificate) if verify and verify.certificate else None,
                    validate_=validate_verdict(validate) if validate else None,
                    compare=compare_verdict(compare) if compare else None)


# ---------------------------------------------------------------------------------- text
def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}"


def _interval(ci: tuple[float, float] | None) -> str:
    return f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""


def certificate_text(v: VerifyVerdict) -> str:
    """"certified (bound 0.046 ≤ p 0.05)"."""
    return f"{'certified' if v.certified else 'not certified'} (bound {v.bound:.3g} {'≤' if v.certified else '>'} " \
           f"p {v.p:g})"


def brief(verdicts: Verdicts) -> VerdictBrief | None:
    """The verdicts in one line: a width-trend warning, the certificate, the drifts, compare's ranks; the tune
    winner's loss when none of them finished. None when no phase did."""
    verify, validate, compare, tune = verdicts.verify, verdicts.validate_, verdicts.compare, verdicts.tune
    parts = [f"{t.verdict} under {t.parametrization}" for t in (verdicts.transfer.trends if verdicts.transfer else [])
             if t.warning]
    if verify is not None:
        parts.append(certificate_text(verify))
    if validate is not None:
        lr = next((d for d in validate.drifts if d.hparam == "lr" and d.axis == "width"), None)
        parts.append(f"drift {'passed' if validate.passed else 'failed'}"
                     + (f" (lr {_signed(lr.drift)})" if lr is not None else ""))
    if compare is not None:
        ranks = ",".join("—" if b.transferred_rank is None else str(b.transferred_rank) for b in compare.budgets)
        parts.append(f"transferred model ranks {ranks} over {len(compare.budgets)} budgets")
    if not parts and tune is not None:
        parts.append(f"tuned (eval loss {tune.best_eval_loss:.4f})" if tune.best_eval_loss is not None else "tuned")
    if not parts:
        return None
    return VerdictBrief(certified=verify.certified if verify else None, bound=verify.bound if verify else None,
                        drift_passed=validate.passed if validate else None, line="; ".join(parts))


def drift_line(d: DriftVerdict) -> str:
    """"lr along width: mup +0.02 [-0.03, +0.07] per doubling (standard -0.98), threshold 0.25: passed"."""
    where = {"horizon": "training steps", "batch": "batch size"}.get(d.axis, d.axis) + (
        f" at width {d.width}" if d.width else "")
    beside = f" ({d.baseline} {_signed(d.baseline_drift)})" if d.baseline is not None else ""
    return (f"{d.hparam} along {where}: {d.parametrization} {_signed(d.drift)}{_interval(d.ci95)} per doubling"
            f"{beside}, threshold {d.threshold:g}: {'passed' if d.passed else 'failed'}")


def regret_text(r: RegretVerdict) -> str:
    """"regret of lr at width 128 (mup): 0.0125 nats (0.3 %) [0.010, 0.015]"."""
    batch = f", batch {r.batch_size}" if r.batch_size is not None else \
        f", context {r.seq_len}" if r.seq_len is not None else ""
    head = f"regret of {r.hparam} at width {r.width}{batch} ({r.parametrization}): "
    if r.regret is None:
        return head + (r.note or "unknown")
    pct = f" ({r.regret_pct:.2g} %)" if r.regret_pct is not None else ""
    ci = f" [{r.ci95[0]:.3g}, {r.ci95[1]:.3g}]" if r.ci95 else ""
    return f"{head}{r.regret:.3g} nats{pct}{ci}"


def forecast_text(f: ForecastVerdict) -> str:
    """"optimal lr forecast at width 128, 300 steps, batch 16: 0.012 [0.0111, 0.013] (covered 6/6 held-out points),
    86 % conformal [0.0115, 0.0125] (covered 5/6); held-out error -0.09 log2 (Step Law +0.95)"."""
    ci = f" [{f.ci95[0]:.3g}, {f.ci95[1]:.3g}]" if f.ci95 else ""
    held = f"; held-out error {_signed(f.held_out_error_log2)} log2" if f.held_out_error_log2 is not None else ""
    law = (f" (Step Law {_signed(f.steplaw_held_out_error_log2)})" if f.steplaw_held_out_error_log2 is not None
           else "")
    covered = (f" (covered {f.ci95_covered}/{f.ci95_scored} held-out points)"
               if f.ci95 and f.ci95_covered is not None and f.ci95_scored else "")
    level = f"{100 * f.conformal_level:.0f} % " if f.conformal_level is not None else ""
    conformal = (f", {level}conformal [{f.conformal_ci95[0]:.3g}, {f.conformal_ci95[1]:.3g}] (covered "
                 f"{f.conformal_covered}/{f.conformal_scored})" if f.conformal_ci95 and f.conformal_covered is not None
                 else "")
    return (f"optimal lr forecast at width {f.width}, {f.steps} steps, batch {f.batch_size}: {f.lr:.3g}{ci}{covered}"
            f"{conformal}{held}{law}")


def verdict_lines(verdicts: Verdicts) -> list[str]:
    """One line per finished phase's verdict in phase order; indented under it, transfer's width trends, the
    certificate's sentence and validate's drifts and regrets."""
    lines = []
    if (tune := verdicts.tune) is not None:
        loss = f"{tune.best_eval_loss:.4f}" if tune.best_eval_loss is not None else "—"
        lines.append(f"tune: best eval loss {loss} over {tune.n_trials} trials ({tune.n_diverged} diverged)")
    if (transfer := verdicts.transfer) is not None:
        lines.append("transfer: eval loss " + ", ".join(
            f"{p.width}: {'—' if p.eval_loss is None else f'{p.eval_loss:.4f}'}" for p in transfer.widths))
        lines += [f"  {'warning: ' if t.warning else ''}{t.line}" for t in transfer.trends]
    if (verify := verdicts.verify) is not None:
        lines.append(f"verify: {certificate_text(verify)}, {verify.n_better} of {verify.n_samples} samples better, "
                     f"centre rank {verify.centre_rank} (alpha {verify.alpha:g})")
        lines.append(f"  {verify.verdict}")
    if (validate := verdicts.validate_) is not None:
        lines.append(f"validate: drift {'passed' if validate.passed else 'failed'}")
        lines += [f"  {drift_line(d)}" for d in validate.drifts]
        lines += [f"  {regret_text(r)}" for r in validate.regret]
        if (f := validate.forecast) is not None:
            lines.append(f"  {forecast_text(f)}")
    if (compare := verdicts.compare) is not None:
        lines.append("compare: " + "; ".join(
            f"budget {b.budget:.3g}: " + (f"{b.winner} first ({b.eval_loss:.4f})" if b.winner else "none finished")
            + (f", transferred model rank {b.transferred_rank}" if b.transferred_rank is not None else "")
            for b in compare.budgets))
    return lines
