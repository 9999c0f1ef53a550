"""validate's batch sweep (`validate.batch_sizes`): lr swept at each batch size, at every validate width, under each
parametrization, the other hparams at the centre; at a fixed token budget by default (a trial at batch B trains
`StudySpec.batch_steps(B)` steps). Judged per width into the lr optimum's drift per doubling of the batch size
(`analysis.lr_drift(..., axis="batch")`, beside the √B and linear rules: `analysis.rules_text`) and the regret of
carrying the base batch's optimal lr unchanged (`analysis.batch_regret`); `batch_flag` says when tune's batch differs
from the target's. The validate phase (`studies.phases.validate`) plans, judges and tells it through these."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
from rich.markup import escape

import analysis
from analysis import LRDrift, Regret, lr_drift
from analysis.report import markdown_table
from studies.phases.base import Artifacts, Out
from studies.plan import PlannedTrial
from studies.spec import StudySpec


def batch_trials(spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
    """Every (parametrization, width, batch size, lr, seed) of the batch sweep, the other hparams at the centre;
    `-b<batch size>` in the trial key (`validate-mup-w64-b32-lr0.004-s0`). [] without `validate.batch_sizes`."""
    v = spec.validate_
    if v is None or not v.batch_sizes:
        return []
    return [PlannedTrial(f"validate-{p}-w{w}-b{b}-lr{x:.3g}-s{s}", "validate", w, s, {**centre, "lr": x},
                         parametrization=p, swept="lr", batch_size=b)
            for p in v.parametrizations for w in v.widths for b in v.batch_sizes for x in v.lrs
            for s in range(v.seeds)]


def judge_batch(spec: StudySpec, rows: pd.DataFrame, out: Artifacts) -> tuple[list[LRDrift], list[Regret]]:
    """The batch sweep's `rows` (`analysis.batch_sweep`): its figure `batch`, lr's drift per doubling of the batch
    size at each validate width, and the regret of carrying the base batch's optimal lr; ([], []) without one."""
    v = spec.validate_
    if v is None or not v.batch_sizes or rows.empty:
        return [], []
    analysis.plot_batch(rows, out.figure("batch"))
    drifts = [lr_drift(rows[rows["width"] == w], threshold=v.drift_threshold, axis="batch") for w in v.widths
              if (rows["width"] == w).any()]
    return drifts, analysis.batch_regret(rows, spec.base_batch())


def batch_flag(spec: StudySpec, drifts: Sequence[LRDrift] = ()) -> str | None:
    """A warning when tune's batch (tune.batch_size) differs from the target's (train.batch_size): the lr tuned at
    the proxy may not be the target's. With a batch sweep's `drifts`, how far mup's optimum moves to the target's
    batch; without, how to measure it. None: tune trains at the target's batch."""
    tune, target = spec.base_batch(), spec.train.batch_size
    if spec.compare is not None or tune == target:
        return None
    doublings = math.log2(target / tune)
    said = (f"tune trains at batch size {tune}, the target at {target} (train.batch_size; {abs(doublings):.2g} "
            f"doublings {'larger' if doublings > 0 else 'smaller'})")
    measured = [d for d in drifts if d.optima]
    if measured:
        moved = ", ".join(f"{d.mup_drift * doublings:+.2f}" for d in measured)
        lines = "; ".join(analysis.rules_text(d) for d in measured)
        return (f"{said}: {lines}; so the optimal lr at batch size {target} lies ≈ {moved} log2(lr) from the optimum "
                f"at the batch size {tune} tune trained at")
    v = spec.validate_
    if v is not None and v.batch_sizes:
        return f"{said}: the validate batch sweep (validate.batch_sizes) will measure how far the lr optimum moves"
    low, high = sorted((tune, target))
    return (f"{said}: the lr optimum may move with the batch size (the √B rule: +0.5 log2(lr) per doubling, the "
            f"linear rule: +1.0): measure it with validate.batch_sizes: [{low}, ..., {high}]")


def batch_lines(drifts: Sequence[LRDrift], regrets: Sequence[Regret]) -> list[str]:
    """Per width: the drift beside the rules (`analysis.rules_text`), then the batch regret line."""
    lines = []
    for d in drifts:
        width = d.optima[0].width if d.optima else None
        lines.append(f"Batch size: {analysis.rules_text(d)}.")
        if width is not None and (line := analysis.batch_regret_line(regrets, width)):
            lines.append(line)
    return lines


def batch_regret_table(regrets: Sequence[Regret]) -> pd.DataFrame:
    """Every (width, parametrization, batch size) regret of the batch sweep as report rows."""
    return pd.DataFrame([{"width": r.width, "parametrization": r.parametrization, "batch size": r.batch_size,
                          "carried lr": r.transferred, "optimum": r.optimum, "optimum_loss": r.optimum_loss,
                          "regret (nats)": r.regret, "regret %": r.regret_pct,
                          "95 % CI (nats)": f"[{r.ci[0]:+.3g}, {r.ci[1]:+.3g}]" if r.ci else "—",
                          "seeds": r.n_seeds, "note": r.note or "—"} for r in regrets])


def batch_section(spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret]) -> list[str]:
    """The report's batch-sweep paragraphs: the drift beside the rules and the regret lines in bold, then every
    regret as a table ([] without a batch sweep)."""
    if not drifts and not regrets:
        return []
    fixed = spec.validate_.batch_fixed if spec.validate_ is not None else "tokens"
    held = (f"a fixed token budget: {spec.validate_horizon()} steps at the base batch size {spec.base_batch()}, "
            "round(steps · base / B) at batch size B" if fixed == "tokens" else
            f"fixed steps: {spec.validate_horizon()} at every batch size")
    head = f"Batch sweep ({held}):"
    return [head, *(f"**{line}**" for line in batch_lines(drifts, regrets)),
            *([markdown_table(batch_regret_table(regrets))] if regrets else [])]


def print_batch_flag(spec: StudySpec, drifts: Sequence[LRDrift], out: Out) -> None:
    """The summary's `batch_flag` line, when there is one."""
    if flag := batch_flag(spec, drifts):
        out.print(f"[yellow]batch:[/] {escape(flag)}", soft_wrap=True)
