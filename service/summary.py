"""The end-of-study summary the CLI prints: the story of a study in the terminal, for any subset of phases.

Each phase of the study tells its own lines (`Phase.summary`), in the order of its `told`: the transferred hparams
(tune's winner) and the loss per width (the tuned base width, then each transfer width), the lr-drift verdict per
parametrization (validate; optima interpolated in log lr) and what transfer cost against the sweep's optimum (the
transfer regret), the certificate (verify) and where its better neighbours lie, the families per budget (compare);
then the cost, the report, the phases' figures (`Phase.figures`, in the order of their `pictured`) and the MLflow
runs table. A phase that did not run (or left no table) tells nothing; nothing here trains or logs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd
from rich.console import Console

from studies.phases import PHASES, PhaseResult, StudyState, phases_of
from studies.phases.base import Context
from studies.spec import StudySpec
from workers.folder import StudyFolder


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
    if spec.resources.runner == "local":  # Ray, the default, goes unsaid
        console.print("runner: local (this process, no Ray; no early stopping)")
    ctx = Context(spec, state, lambda name: _table(view, name))
    for name in sorted(phases_of(spec), key=lambda p: PHASES[p].told):
        PHASES[name].summary(ctx, state.result(name, PhaseResult), console, view.runs)
    if view.folder.cost.exists():
        console.print(f"cost: {cost_words(json.loads(view.folder.cost.read_text()))}", soft_wrap=True)
    report = view.folder.report
    if report.exists():
        console.print(f"report: {report}")
    figures = [path for p in sorted(phases_of(spec), key=lambda p: PHASES[p].pictured) if state.done(p)
               for name in PHASES[p].figures(state.phases[p]).values() if (path := view.folder.figure(name)).exists()]
    if figures:
        console.print("figures: " + ", ".join(str(f) for f in figures), soft_wrap=True)
    if view.runs_link:
        console.print(f"MLflow runs: {view.runs_link}", soft_wrap=True)


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
