"""The end-of-study summary the CLI prints: the story of a study in the terminal, for any subset of phases.

In order: the transferred hparams (tune's winner), the loss per width (the tuned base width, then each
transfer width), the lr-drift verdict per parametrization (validate; optima interpolated in log lr) and what
transfer cost against the sweep's optimum (the transfer regret), the
certificate (verify) and where its better neighbours lie, the families per budget (compare), then the report,
its figures and the MLflow runs table. A section whose phase did not run (or left no table) is left out;
nothing here trains or logs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis import Certificate, LRDrift, neighbour_advice
from analysis.constants import TrialStatus
from analysis.table import loss_spread
from studies.phases import CompareResult, StudyState, TuneResult, ValidateResult, VerifyResult
from studies.phases.validate import horizon_flag, regret_lines
from studies.spec import StudySpec
from workers.folder import StudyFolder

FIGURES = ("mutransfer", "transfer", "verify", "tune_history", "compare")  # the headline figure first


@dataclass
class StudyView:
    """What the summary reads: the spec, the study's typed state, its folder and MLflow's run ids."""

    spec: StudySpec
    state: StudyState
    folder: StudyFolder
    runs: dict[str, str]  # trial_key → MLflow run id ({} when unknown)
    runs_link: str | None  # the experiment's runs table in the MLflow UI, or how to open it


def _table(view: StudyView, phase: str) -> pd.DataFrame | None:
    path = view.folder.trials(phase)
    return pd.read_csv(path) if path.exists() else None


def print_summary(console: Console, view: StudyView) -> None:
    """Print every section the study's finished phases support."""
    state, spec = view.state, view.spec
    console.print(f"study [bold]{state.study_id}[/]: {state.status}")
    tune = state.result("tune", TuneResult)
    if tune is not None:
        reused = f", reused from {tune.reused_from}" if tune.reused_from else ""
        console.print(f"tuned at width {spec.tune.base_width} over {tune.n_trials} trials "
                      f"(best eval loss {tune.best_eval_loss:.4f}{reused})")
        console.print("transferred hparams: " + ", ".join(f"{k}={v:.4g}" for k, v in tune.best_hparams.items()))
        note = start_note(view, tune)
        if note:
            console.print(f"[yellow]{escape(note)}[/]", soft_wrap=True)
        _width_table(console, view, tune)
    validate = state.result("validate", ValidateResult)
    for drift in validate.all_drifts() if validate else ():
        _drift_section(console, drift)
    for line in regret_lines(validate) if validate else ():
        console.print(f"[bold]{escape(line)}[/]", soft_wrap=True)
    flag = horizon_flag(spec, validate) if tune is not None else None
    if flag:
        console.print(f"[yellow]horizon:[/] {escape(flag)}", soft_wrap=True)
    verify = state.result("verify", VerifyResult)
    if verify is not None and verify.certificate is not None:
        _certificate_section(console, view, verify.certificate, tune)
    compare = state.result("compare", CompareResult)
    if compare is not None and compare.summary:
        _compare_section(console, compare)
    if view.folder.cost.exists():
        console.print(f"cost: {cost_words(json.loads(view.folder.cost.read_text()))}", soft_wrap=True)
    report = view.folder.report
    if report.exists():
        console.print(f"report: {report}")
    names = [*FIGURES[:1], *(f"mutransfer_{h}" for h in (validate.hparam_drift if validate else {})), "horizon",
             "depth", *FIGURES[1:]]
    figures = [view.folder.figure(name) for name in names if view.folder.figure(name).exists()]
    if figures:
        console.print("figures: " + ", ".join(str(f) for f in figures), soft_wrap=True)
    if view.runs_link:
        console.print(f"MLflow runs: {view.runs_link}", soft_wrap=True)


def start_note(view: StudyView, tune: TuneResult) -> str | None:
    """When tune's winner is its starting point (the space's defaults, its first trial): that, and how the other
    trials fared (none beat it: completed with a higher loss, stopped early by ASHA, diverged, failed)."""
    space = view.spec.space
    start, searched = space.defaults(), list(space.searched())
    if not searched or not all(math.isclose(tune.best_hparams.get(h, math.nan), start[h], rel_tol=1e-9)
                               for h in searched):
        return None
    said = "the tune phase's winner is its starting point (the search space's defaults, its first trial)"
    table = _table(view, "tune")
    if table is None or "status" not in table or table.empty:
        return f"{said}: none of its other {max(tune.n_trials - 1, 0)} trials beat it"
    statuses = table["status"].astype(str).tolist()
    if TrialStatus.COMPLETED in statuses:
        statuses.remove(TrialStatus.COMPLETED)  # the winner itself
    fates = {TrialStatus.COMPLETED: "completed with a higher eval loss", TrialStatus.STOPPED: "stopped early by ASHA",
             TrialStatus.DIVERGED: "diverged", TrialStatus.FAILED: "failed"}
    counts = [f"{statuses.count(s)} {what}" for s, what in fates.items() if statuses.count(s)]
    return f"{said}: none of the other {len(statuses)} trials beat it" + (f" ({', '.join(counts)})" * bool(counts))


def _share(ratio: float, of: str) -> str:
    """1.74 → "1.74× the wall time"; 0.07 → "7.0 % of the wall time"."""
    return f"{ratio:.2f}× {of}" if ratio >= 1 else f"{100 * ratio:.1f} % of {of}"


def cost_words(cost: dict[str, Any]) -> str:
    """`studies.cost.measured_cost`'s account in words: what the tune phase (the proxy), then every phase that
    checks it, cost against one training run at the widest target width, in wall time (Σ of the trials' wall
    times against the median run there) and in training FLOPs."""
    targets = cost.get("targets") or {}
    if not targets:
        return "no transfer width: no training run at a target width to compare the tune phase's cost with"
    width = max(targets, key=int)
    target, rows = targets[width], cost["rows"]
    phases = {p: [r for r in rows if r["phase"] == p] for p in ("tune", "verify", "validate")}

    def took(chosen: list[dict[str, Any]], wall: str, flops: str) -> str:
        spent = sum(r["trial_wall_s"] for r in chosen)
        parts = [_share(spent / target["wall_s"], wall)] if target.get("wall_s") else []
        if target.get("flops") and all(r["flops"] is not None for r in chosen):
            parts.append(_share(sum(r["flops"] for r in chosen) / target["flops"], flops))
        return " and ".join(parts) or "an unknown share (no finished run at that width to compare with)"

    trials = sum(r["trials"] for r in phases["tune"])
    line = (f"the tune phase (the proxy) took {took(phases['tune'], 'the wall time', 'the FLOPs')} of one "
            f"training run at the target width {width} (its {trials} trials' wall times summed)")
    checks = [p for p, chosen in phases.items() if chosen]
    if len(checks) > 1:
        line += f"; {' + '.join(checks)} together took " + took(
            [r for p in checks for r in phases[p]], "its wall time", "its FLOPs")
    return line


def _width_table(console: Console, view: StudyView, tune: TuneResult) -> None:
    """The tuned base width, then every transfer trial: the μTransfer story as a loss per width."""
    table = Table(title="eval loss per width (the tuned hparams, zero-shot above the base width)")
    for col in ("width", "seed", "params", "eval loss", "status"):
        table.add_column(col, justify="left" if col == "status" else "right")
    table.add_column("MLflow run", overflow="fold", min_width=32)
    table.add_row(str(view.spec.tune.base_width), "", "", f"{tune.best_eval_loss:.4f}", "tuned (base)", "")
    transfer = _table(view, "transfer")
    if transfer is not None:
        for row in transfer.sort_values(["width", "seed"]).itertuples():
            params = f"{int(row.params):,}" if row.params == row.params else "—"
            loss = f"{row.eval_loss:.4f}" if row.eval_loss == row.eval_loss else "—"
            table.add_row(str(row.width), str(row.seed), params, loss, str(row.status),
                          view.runs.get(row.trial_id, "—"))
    console.print(table)


def _drift_section(console: Console, drift: LRDrift) -> None:
    """The optimal lr (or other swept hparam) per width under each parametrization and its drift per doubling."""
    h, axis = drift.hparam, drift.axis
    at = "" if axis == "width" else f" at width {drift.optima[0].width}" if drift.optima else ""
    column = {"width": "width", "horizon": "steps"}.get(axis, axis)
    table = Table(title=f"{h} sweep (validate){at}: optimal {h} per {column}, interpolated in log {h}")
    for col in ("parametrization", column, f"best grid {h}", f"interpolated {h}", "eval loss"):
        table.add_column(col, justify="right")
    for o in sorted(drift.optima, key=lambda o: (o.parametrization != "mup", o.parametrization, getattr(o, axis))):
        interp = f"{o.lr_interp:.3g}" if o.lr_interp is not None else "—"
        edge = " (grid edge)" if o.at_grid_edge else ""
        table.add_row(o.parametrization, str(getattr(o, axis)), f"{o.lr:.3g}{edge}", interp, f"{o.eval_loss:.4f}")
    console.print(table)
    for param, value in drift.drift.items():
        ci = drift.drift_ci.get(param)
        interval = f" (95 % CI over seeds [{ci[0] + 0.0:+.2f}, {ci[1] + 0.0:+.2f}])" if ci else ""
        console.print(f"{h} drift{at}, {param}: {value + 0.0:+.2f} log2({h}) per doubling of {column}{interval}")
    console.print(f"[{'green' if drift.passed else 'red'}]{h} drift:[/] {drift.verdict}", soft_wrap=True)


def _compare_section(console: Console, compare: CompareResult) -> None:
    """Every family at every budget (`analysis.compare_table`'s rows, best first within a budget)."""
    table = Table(title=f"eval loss per parameter budget ({compare.tokens:,} training tokens a run)")
    for col in ("budget", "family", "role", "width", "params", "eval loss (seeds)", "rank"):
        table.add_column(col, justify="left" if col in ("family", "role") else "right")
    for row in compare.summary:
        loss = loss_spread(row["eval_loss_mean"], row["eval_loss_std"])
        loss += f" ({row['n_seeds']}" + (f", {row['n_diverged']} diverged)" if row["n_diverged"] else ")")
        table.add_row(f"{row['budget']:,.0f}", row["family"], row["role"], str(row["width"]),
                      f"{row['params']:,}" if row["params"] is not None else "—", loss, str(row["rank"]))
    console.print(table)


def _certificate_section(console: Console, view: StudyView, cert: Certificate, tune: TuneResult | None) -> None:
    colour = "green" if cert.certified else "yellow"
    console.print(f"[{colour}]certificate:[/] {cert.verdict}", soft_wrap=True)
    verify = _table(view, "verify")
    if cert.certified or verify is None:
        return
    if tune is not None:
        advice = neighbour_advice(verify, tune.best_hparams, list(view.spec.space.searched()), cert.tolerance,
                                  alpha=cert.alpha)
        console.print(f"where the better neighbours lie: {advice.text}", soft_wrap=True)
