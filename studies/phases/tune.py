"""tune: Optuna's TPE (with ASHA under Ray) searches the family's hparams at `tune.base_width`; the winner is the
lowest eval loss among the trials that ran their whole budget, and it is the centre every later phase starts from.
The search space's distributions and ASHA's rungs are the spec's (`StudySpec.search_space`, `asha_rungs`): a trial
process reads them without importing the phases.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import ClassVar

import pandas as pd
from rich.markup import escape
from rich.table import Table

import analysis
from analysis.report import tune_section
from analysis.table import TrialStatus, judged_loss, phase_rows
from studies.phases.base import LOSSES, SETUP, Artifacts, Context, Out, Phase, PhaseFailed, PhaseResult, Verdict
from studies.phases.transfer import tune_timescale_line
from studies.plan import PlannedTrial
from studies.spec import StudySpec
from studies.sweeps import flags


class TuneResult(PhaseResult):
    best_hparams: dict[str, float] = {}  # every hparam of the family (frozen ones at their defaults)
    best_eval_loss: float = float("nan")
    n_trials: int = 0
    n_diverged: int = 0
    reused_from: str | None = None  # the study whose identical tune phase this one copied


# What an infrastructure failure's message says, what failed and the fix; a failure matching none is the trial's own
INFRASTRUCTURE = (
    ("Unable to set up cluster storage", "a Ray node cannot reach the study's storage",
     "keep PTCTL_DATA_DIR on a filesystem that every Ray node mounts at the same path (e.g. NFS), or unset "
     "RAY_ADDRESS to run on this machine"),
    ("NodeDiedError", "a Ray node was lost", "check the node (ray status) and re-run the same command to resume"),
    ("ActorDiedError", "a trial's worker process died",
     "check the node's memory (an out-of-memory kill) and raise resources.max_retries, then re-run to resume"),
    ("OutOfMemoryError", "a node ran out of memory", "lower tune.max_concurrent or train.batch_size"),
)


def why_none_completed(rows: pd.DataFrame) -> str:
    """Why no trial of `rows` completed its budget: each failure's cause with its fix (infrastructure: what failed;
    the trial's own: its message), and the divergence advice only when trials diverged."""
    counts = ", ".join(f"{n} {s}" for s, n in rows["status"].value_counts().items())
    reasons: dict[str, int] = {}
    failed = rows[rows["status"] == TrialStatus.FAILED]
    for message in (failed["message"].fillna("").astype(str) if "message" in failed else [""] * len(failed)):
        known = next((f"{what} ({fix})" for text, what, fix in INFRASTRUCTURE if text in message), None)
        reason = known or f"the trial raised {message or 'an unknown error'} (its run's `failure` tag has the cause)"
        reasons[reason] = reasons.get(reason, 0) + 1
    parts = [f"{n} failed: {reason}" for reason, n in reasons.items()]
    if (rows["status"] == TrialStatus.DIVERGED).any():
        parts.append("diverged trials: lower space.lr's range or raise train.max_loss, then run it as a new study")
    return f"no tune trial completed its budget ({counts} of {len(rows)}): {'; '.join(parts) or 'none finished'}"


def best_hparams(spec: StudySpec, table: pd.DataFrame) -> dict[str, float]:
    """The lowest eval loss among trials that ran their full budget (ASHA-stopped and diverged trials lose);
    frozen hparams keep their defaults."""
    rows = phase_rows(table, "tune")
    finished = rows[rows["status"] == TrialStatus.COMPLETED]
    if finished.empty:
        raise PhaseFailed(why_none_completed(rows))
    best = finished.loc[judged_loss(finished).idxmin()]
    return spec.space.complete({h: float(best[h]) for h in spec.space.searched()})


def lr_text(value: float) -> str:
    """4.4e-3 style: two significant digits, no exponent padding."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def start_note(ctx: Context, tune: TuneResult) -> str | None:
    """When tune's winner is its starting point (the space's defaults, its first trial): that, and how the other
    trials fared (none beat it: completed with a higher loss, stopped early by ASHA, diverged, failed)."""
    space = ctx.spec.space
    start, searched = space.defaults(), list(space.searched())
    if not searched or not all(math.isclose(tune.best_hparams.get(h, math.nan), start[h], rel_tol=1e-9)
                               for h in searched):
        return None
    said = "the tune phase's winner is its starting point (the search space's defaults, its first trial)"
    table = ctx.tables("tune")
    if table is None or "status" not in table or table.empty:
        return f"{said}: none of its other {max(tune.n_trials - 1, 0)} trials beat it"
    statuses = table["status"].astype(str).tolist()
    if TrialStatus.COMPLETED in statuses:
        statuses.remove(TrialStatus.COMPLETED)  # the winner itself
    fates = {TrialStatus.COMPLETED: "completed with a higher eval loss", TrialStatus.STOPPED: "stopped early by ASHA",
             TrialStatus.DIVERGED: "diverged", TrialStatus.FAILED: "failed"}
    counts = [f"{statuses.count(s)} {what}" for s, what in fates.items() if statuses.count(s)]
    return f"{said}: none of the other {len(statuses)} trials beat it" + (f" ({', '.join(counts)})" * bool(counts))


def _width_table(ctx: Context, tune: TuneResult, out: Out, runs: Mapping[str, str]) -> None:
    """The tuned base width, then every transfer trial: the μTransfer story as a loss per width."""
    table = Table(title="eval loss per width (the tuned hparams, zero-shot above the base width)")
    for col in ("width", "seed", "params", "eval loss", "status"):
        table.add_column(col, justify="left" if col == "status" else "right")
    table.add_column("MLflow run", overflow="fold", min_width=32)
    table.add_row(str(ctx.spec.tune.base_width), "", "", f"{tune.best_eval_loss:.4f}", "tuned (base)", "")
    transfer = ctx.tables("transfer")
    if transfer is not None:
        for row in transfer.sort_values(["width", "seed"]).itertuples():
            params = f"{int(row.params):,}" if row.params == row.params else "—"
            loss = f"{row.eval_loss:.4f}" if row.eval_loss == row.eval_loss else "—"
            table.add_row(str(row.width), str(row.seed), params, loss, str(row.status), runs.get(row.trial_id, "—"))
    out.print(table)


class Tune(Phase):
    name: ClassVar[str] = "tune"
    result: ClassVar[type[PhaseResult]] = TuneResult
    reusable: ClassVar[tuple[str, ...]] = ("model", "data", "train", "space", "tune")
    told: ClassVar[int] = 0
    pictured: ClassVar[int] = 3  # the search's history after the study's results

    def present(self, spec: StudySpec) -> bool:
        return spec.compare is None  # a compare study tunes in its stages

    def plan(self, ctx: Context) -> list[PlannedTrial] | None:
        return None  # the searcher suggests tune.num_trials trials

    def count(self, spec: StudySpec) -> int:
        return spec.tune.num_trials

    def judge(self, ctx: Context, table: pd.DataFrame, out: Artifacts) -> TuneResult:
        best = best_hparams(ctx.spec, table)
        analysis.plot_tune_history(table, out.figure("tune_history"))
        done = table[table.status == TrialStatus.COMPLETED]
        return TuneResult(best_hparams=best, best_eval_loss=float(done.eval_loss.min()), n_trials=len(table),
                          n_diverged=int((table.status == TrialStatus.DIVERGED).sum()))

    def figures(self, result: PhaseResult) -> dict[str, str]:
        return {"tune": "tune_history"}

    def section(self, ctx: Context, result: PhaseResult, tables: Mapping[str, pd.DataFrame]) -> list[str]:
        validate = ctx.state.phases.get("validate")  # its drifts, when it finished
        drifts = getattr(validate, "drifts", []) if validate is not None and validate.done else []
        decay = tune_timescale_line(ctx.spec, result.best_hparams) if isinstance(result, TuneResult) else None
        return ([tune_section(tables["tune"], ctx.spec.space.names())] if "tune" in tables else []) + \
            [f"**{label}: {flag}**" for label, flag in flags(ctx.spec, drifts)] + ([decay] if decay else [])

    def summary(self, ctx: Context, result: PhaseResult | None, out: Out, runs: Mapping[str, str]) -> None:
        if not isinstance(result, TuneResult):
            return
        reused = f", reused from {result.reused_from}" if result.reused_from else ""
        out.print(f"tuned at width {ctx.spec.tune.base_width} over {result.n_trials} trials "
                  f"(best eval loss {result.best_eval_loss:.4f}{reused})")
        out.print("transferred hparams: " + ", ".join(f"{k}={v:.4g}" for k, v in result.best_hparams.items()))
        note = start_note(ctx, result)
        if note:
            out.print(f"[yellow]{escape(note)}[/]", soft_wrap=True)
        if decay := tune_timescale_line(ctx.spec, result.best_hparams):
            out.print(f"[cyan]weight decay:[/] {escape(decay)}", soft_wrap=True)
        _width_table(ctx, result, out, runs)
        if ctx.spec.validate_ is None:  # else the validate phase's lines end with the flags
            for label, flag in flags(ctx.spec, []):
                out.print(f"[yellow]{label}:[/] {escape(flag)}", soft_wrap=True)

    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        assert isinstance(result, TuneResult)
        best = result.best_hparams
        shown = ", ".join(f"{h}={lr_text(best[h]) if h == 'lr' else f'{best[h]:.3g}'}" for h in spec.space.searched())
        return Verdict({**{f"best.{h}": v for h, v in best.items()}, "base_width": spec.tune.base_width},
                       [{"step": 0, "best_eval_loss": result.best_eval_loss, "n_trials": result.n_trials}],
                       sentence=f"Tuned at width {spec.tune.base_width} over {result.n_trials} trials: "
                                f"{shown} (eval loss {result.best_eval_loss:.4f}).")

    def columns(self, spec: StudySpec, verdict: Verdict) -> list[tuple[int, str]]:
        # each searched hparam's winner, in the space's order (frozen ones are constants)
        winner = [c for h in spec.space.searched() for c in verdict.shown(SETUP, "params", rf"best\.{re.escape(h)}")]
        return [*verdict.shown(LOSSES, "metrics", "best_eval_loss"), *winner,
                *verdict.shown(SETUP, "params", "base_width")]


PHASE = Tune()
