"""tune: Optuna's TPE (with ASHA under Ray) searches the family's hparams at `tune.base_width`; the winner is the
lowest eval loss among the trials that ran their whole budget, and it is the centre every later phase starts from.

Also here, once for both runners: the search space's distributions and the steps ASHA may judge a trial at.
"""

from __future__ import annotations

from typing import ClassVar

import pandas as pd

import analysis
from analysis.table import TrialStatus, judged_loss, phase_rows
from studies.phases.base import Artifacts, Context, Phase, PhaseFailed, PhaseResult, Verdict
from studies.plan import PlannedTrial
from studies.spec import StudySpec


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


def asha_rungs(spec: StudySpec) -> list[float]:
    """The steps ASHA may judge a tune trial at: grace·η^k up to the budget (Ray's rungs are among them)."""
    t, max_t = spec.tune, spec.steps_for("tune")
    rungs: list[float] = []
    rung: float = t.asha.grace_steps
    while t.asha.enabled and rung <= max_t:
        rungs.append(rung)
        rung *= t.asha.reduction_factor
    return rungs


def search_space(spec: StudySpec) -> dict[str, tuple[float, float, bool]]:
    """The searched hparams as (low, high, log): the Optuna distributions of both runners."""
    return {name: (r.low, r.high, r.log) for name, r in spec.space.searched().items()}


def lr_text(value: float) -> str:
    """4.4e-3 style: two significant digits, no exponent padding."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


class Tune(Phase):
    name: ClassVar[str] = "tune"
    result: ClassVar[type[PhaseResult]] = TuneResult
    reusable: ClassVar[tuple[str, ...]] = ("model", "data", "train", "space", "tune")

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

    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        assert isinstance(result, TuneResult)
        best = result.best_hparams
        shown = ", ".join(f"{h}={lr_text(best[h]) if h == 'lr' else f'{best[h]:.3g}'}" for h in spec.space.searched())
        return Verdict({**{f"best.{h}": v for h, v in best.items()}, "base_width": spec.tune.base_width},
                       [{"step": 0, "best_eval_loss": result.best_eval_loss, "n_trials": result.n_trials}],
                       sentence=f"Tuned at width {spec.tune.base_width} over {result.n_trials} trials: "
                                f"{shown} (eval loss {result.best_eval_loss:.4f}).")


PHASE = Tune()
