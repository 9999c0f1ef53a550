"""transfer: the tune phase's winner, unchanged, trains at every transfer width and seed (μP makes it zero-shot);
the result is the eval loss per width, and whether it falls with width beyond the seeds' noise
(`analysis.width_trends`: μP's own diagnostic; under mup, wider is worse is a warning). The tune winner joins that
fit at the base width when it trained as the transfer trials do (`base_joins`).

AdamW's λ is carried by `transfer.weight_decay`: 'constant', unchanged; 'timescale' (Wang & Aitchison's rule),
scaled so that its timescale τ = 1/(ηλ) stays the same fraction of the run when the target trains a different
number of iterations than the tune trials, λ_target = λ_proxy · T_proxy / T_target at the same η
(`carried_hparams`). The report and the summary state τ for the tune winner and for the target.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import pandas as pd
from rich.markup import escape

import analysis
from analysis import WidthTrend, transfer_table, width_trends
from analysis.report import markdown_table
from analysis.transfer import BETTER
from analysis.weight_decay import decay_timescale, timescale_line, timescale_weight_decay
from studies.phases.base import (
    DRIFTS,
    LOSSES,
    PASS,
    SETUP,
    Artifacts,
    Context,
    Out,
    Phase,
    PhaseResult,
    Verdict,
    required,
)
from studies.plan import PlannedTrial
from studies.space import WEIGHT_DECAY
from studies.spec import StudySpec

log = logging.getLogger(__name__)


class TransferResult(PhaseResult):
    widths: list[dict[str, Any]] = []  # `analysis.transfer_table`'s rows: width, eval_loss_mean, ...
    reused_from: str | None = None
    trends: list[WidthTrend] = []  # per parametrization, mup first: does the loss fall with width? ([]: older records)


def weight_decay_of(spec: StudySpec, hparams: Mapping[str, float]) -> float:
    """The λ a trial with `hparams` trains with: its `weight_decay` hparam, else train.weight_decay."""
    return float(hparams.get(WEIGHT_DECAY, spec.train.weight_decay))


def carried_hparams(spec: StudySpec, hparams: Mapping[str, float], phase: str = "transfer") -> dict[str, float]:
    """The tuned `hparams` as `phase`'s trials of the transferred centre train them (transfer's; verify's, whose
    centre is the transferred one): unchanged, but under `transfer.weight_decay: timescale` λ scaled by the tune
    trials' steps over that phase's (the same τ/T at the same η; module docstring). No transfer section: unchanged."""
    if spec.transfer is None or spec.transfer.weight_decay == "constant":
        return dict(hparams)
    proxy, target = spec.steps_for("tune"), spec.steps_for(phase)
    return {**hparams, WEIGHT_DECAY: timescale_weight_decay(weight_decay_of(spec, hparams), proxy, target)}


def transfer_trials(spec: StudySpec, hparams: dict[str, float]) -> list[PlannedTrial]:
    """The winner at every transfer width and seed (λ carried by `carried_hparams`)."""
    t = required(spec.transfer, Transfer)
    carried = carried_hparams(spec, hparams)
    return [PlannedTrial(f"transfer-w{w}-s{s}", "transfer", w, s, dict(carried)) for w in t.widths
            for s in range(t.seeds)]


def base_joins(spec: StudySpec) -> bool:
    """Whether tune's winner trained as the transfer trials do (the same steps and batch, so the same λ under either
    `transfer.weight_decay`): its run is then the transferred hparams' at the base width."""
    return spec.steps_for("tune") == spec.steps_for("transfer") and spec.batch_for("tune") == spec.batch_for("transfer")


def trend_metrics(trends: list[WidthTrend]) -> dict[str, float]:
    """Each trend's slope per doubling (`width_slope.<parametrization>`) and its interval's ends (`_lo`, `_hi`)."""
    metrics = {}
    for t in trends:
        if t.slope is not None:
            metrics[f"width_slope.{t.parametrization}"] = t.slope
        if t.ci is not None:
            metrics[f"width_slope_lo.{t.parametrization}"], metrics[f"width_slope_hi.{t.parametrization}"] = t.ci
    return metrics


def trend_text(t: WidthTrend) -> str:
    """A width trend as the report and the summary tell it, its warning marked."""
    return f"{'warning: ' if t.warning else ''}{t.line}"


def tune_timescale_line(spec: StudySpec, centre: Mapping[str, float]) -> str | None:
    """AdamW's τ = 1/(ηλ) of tune's winner, over the tune trials' steps (None when λ is 0); under the coupled form
    and μP, with the note that a group whose lr μP divides by width_mult has a τ that much longer."""
    coupled_mup = spec.model.parametrization == "mup" and spec.train.weight_decay_form == "coupled"
    note = ("; coupled decay under μP: a group whose lr μP divides by width_mult has a τ width_mult times longer "
            "(train.weight_decay_form: independent keeps τ the same in every group)") if coupled_mup else ""
    return timescale_line(f"tune's winner at width {spec.tune.base_width}",
                          decay_timescale(centre["lr"], weight_decay_of(spec, centre), spec.steps_for("tune")), note)


def target_timescale_line(spec: StudySpec, centre: Mapping[str, float]) -> str | None:
    """AdamW's τ = 1/(ηλ) at the target, over train.steps, with λ as `transfer.weight_decay` carries it (None when
    λ is 0)."""
    t = required(spec.transfer, Transfer)
    target = carried_hparams(spec, centre)
    rule = {"constant": "λ unchanged (transfer.weight_decay: constant)",
            "timescale": "λ × T_proxy/T_target (transfer.weight_decay: timescale)"}[t.weight_decay]
    return timescale_line("the target", decay_timescale(target["lr"], weight_decay_of(spec, target),
                                                        spec.steps_for("transfer")), f"; {rule}")


class Transfer(Phase):
    name: ClassVar[str] = "transfer"
    result: ClassVar[type[PhaseResult]] = TransferResult
    reusable: ClassVar[tuple[str, ...]] = ("model", "data", "train", "space", "tune", "transfer")
    how_to_add: ClassVar[str] = "add one with widths"
    pictured: ClassVar[int] = 1

    def present(self, spec: StudySpec) -> bool:
        return spec.compare is None and spec.transfer is not None

    def plan(self, ctx: Context) -> list[PlannedTrial]:
        return transfer_trials(ctx.spec, ctx.state.centre())

    def planned(self, spec: StudySpec) -> list[PlannedTrial]:
        return transfer_trials(spec, spec.space.defaults())

    def judge(self, ctx: Context, table: pd.DataFrame, out: Artifacts) -> TransferResult:
        summary, tune = transfer_table(table), ctx.tables("tune")
        analysis.plot_transfer(pd.concat([tune, table], ignore_index=True), out.figure("transfer"))
        summary.to_csv(out.artifact("transfer_summary.csv"), index=False)
        base = tune if base_joins(ctx.spec) else None
        trends = width_trends(pd.concat([base, table], ignore_index=True))
        for trend in trends:
            if trend.warning:
                log.warning("%s", trend.line)
        return TransferResult(widths=summary.to_dict(orient="records"), trends=trends)

    def figures(self, result: PhaseResult) -> dict[str, str]:
        return {"transfer": "transfer"}

    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        assert isinstance(result, TransferResult)
        t = required(spec.transfer, Transfer)
        widths = [r for r in result.widths if r.get("eval_loss_mean") == r.get("eval_loss_mean")]
        losses = ", ".join(f"{r['width']}: {r['eval_loss_mean']:.4f}" for r in widths)
        slopes = trend_metrics(result.trends)
        trends = "".join(f" {tr.line[0].upper()}{tr.line[1:]}." for tr in result.trends)
        return Verdict({"base_width": spec.tune.base_width, "target_widths": ",".join(str(w) for w in t.widths)},
                       [{"step": int(r["width"]), "eval_loss": r["eval_loss_mean"]} for r in widths]
                       + ([{"step": 0, **slopes}] if slopes else []),
                       {f"width_trend.{tr.parametrization}": tr.verdict for tr in result.trends},
                       sentence=f"Zero-shot eval loss per width: {losses}.{trends}")

    def columns(self, spec: StudySpec, verdict: Verdict) -> list[tuple[int, str]]:
        return [*verdict.shown(PASS, "tags", r"width_trend\..+"), *verdict.shown(LOSSES, "metrics", "eval_loss"),
                *verdict.shown(DRIFTS, "metrics", r"width_slope\..+"),
                *verdict.shown(SETUP, "params", "base_width|target_widths")]

    def section(self, ctx: Context, result: PhaseResult, tables: Mapping[str, pd.DataFrame]) -> list[str]:
        assert isinstance(result, TransferResult)
        decay = target_timescale_line(ctx.spec, ctx.state.centre()) if ctx.state.done("tune") else None
        return ([markdown_table(transfer_table(tables["transfer"]))] if "transfer" in tables else []) + \
            [f"**width trend:** {trend_text(t)}" for t in result.trends] + ([decay] if decay else [])

    def summary(self, ctx: Context, result: PhaseResult | None, out: Out, runs: Mapping[str, str]) -> None:
        for t in result.trends if isinstance(result, TransferResult) else ():
            colour = "yellow" if t.warning else "green" if t.verdict == BETTER else "cyan"
            out.print(f"[{colour}]width trend:[/] {escape(trend_text(t))}", soft_wrap=True)
        line = target_timescale_line(ctx.spec, ctx.state.centre()) if ctx.state.done("tune") else None
        if line:
            out.print(f"[cyan]weight decay:[/] {escape(line)}", soft_wrap=True)


PHASE = Transfer()
