"""What a study costs against the model it is for: FLOPs (and wall time) of tune, verify and validate as a
share of one training run at each target width (no torch, Ray or MLflow).

μTransfer is worth doing when the proxy is cheap: the μP paper tuned GPT-3 6.7B's hparams on a proxy for
≈ 7 % of one pretraining run. `plan_cost` computes that figure from the spec alone, before anything
trains (`ptctl study plan SPEC`, `ptctl transfer --dry-run`); `measured_cost` recomputes it from the trial
tables of a finished study (the steps each trial really ran, and their wall time).

FLOPs are training FLOPs as `studies.budget.train_flops` counts them: matmuls from the shapes, 3 × forward,
over steps × batch sequences; evaluations (forward only, the same for proxy and target) are left out. A
trial at width w running s steps costs s · batch · c(w), with c(w) the training FLOPs of one sequence. The
planned tune phase is the ASHA expectation: every trial reaches the first rung (grace g), 1/η of them each
next rung g·η^k, 1/η^K the full budget (synchronous successive halving; asynchronous promotion runs a few
more); `max_flops` is every trial at its full budget. The vocabulary is `data.vocab_size` (a tokenizer's
cap: a corpus with fewer distinct tokens makes the decoder term an upper bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from studies.arch import DepthArch
from studies.budget import train_flops
from studies.phases import PHASES, phases_of
from studies.plan import PlannedTrial
from studies.spec import StudySpec

CHECK_PHASES = ("tune", "verify", "validate")  # the cost of tuning and checking, against the target runs


@dataclass(frozen=True)
class PhaseCost:
    phase: str
    trials: int
    steps: float  # optimizer steps over all trials (tune with ASHA: the expectation)
    flops: float  # training FLOPs over all trials (tune with ASHA: the expectation)
    max_flops: float  # every trial at its full budget
    widths: tuple[int, ...]


@dataclass(frozen=True)
class CostPlan:
    phases: list[PhaseCost]
    targets: dict[int, float] = field(default_factory=dict)  # target width → FLOPs of one training run there

    def flops(self, phases: tuple[str, ...] = CHECK_PHASES) -> float:
        return sum(p.flops for p in self.phases if p.phase in phases)

    def share(self, width: int, phases: tuple[str, ...] = CHECK_PHASES) -> float:
        """FLOPs of `phases` as a fraction of one training run at target `width`."""
        return self.flops(phases) / self.targets[width]


def sequence_flops(spec: StudySpec, width: int, depth: int | None = None) -> float:
    """Training FLOPs of one sequence at `width` (3 × forward, `data.mask_rate` of it decoded); `depth`: a depth
    sweep's trial, the arch at that depth (its parametrization changes no matmul)."""
    arch = spec.model.arch
    if depth is not None and isinstance(arch, DepthArch):
        arch = arch.at_depth(depth, arch.depth_parametrization)
    return train_flops(spec.model.family, arch, width, spec.data.vocab_size, spec.data.seq_len,
                       spec.data.mask_rate, 1, spec.tune.base_width)


def asha_steps(max_t: int, rungs: list[float], eta: float) -> float:
    """Expected steps of one trial under synchronous successive halving: 1/η of the trials go on past each rung
    (`StudySpec.asha_rungs`; a rung at the budget itself stops nothing)."""
    steps, start = 0.0, 0.0
    for k, end in enumerate([*(r for r in rungs if r < max_t), max_t]):
        steps += (end - start) / eta ** k
        start = end
    return steps


Run = tuple[int, float, int | None, int]  # a planned trial's width, steps, depth (None: the arch's) and batch size


def _phase(spec: StudySpec, phase: str, runs: list[Run], full_steps: int | None) -> PhaseCost:
    """`runs`: (width, steps, depth, batch size) per trial (depth: a depth sweep's, else None); `full_steps`: a
    trial's full budget (None: the steps of each run)."""
    per_seq = {(w, d): sequence_flops(spec, w, d) for w, _, d, _ in runs}
    return PhaseCost(phase, len(runs), sum(s for _, s, _, _ in runs),
                     sum(s * b * per_seq[w, d] for w, s, d, b in runs),
                     sum((full_steps or s) * b * per_seq[w, d] for w, s, d, b in runs),
                     tuple(sorted({w for w, _, _, _ in runs})))


def planned_trials(spec: StudySpec) -> dict[str, list[PlannedTrial]]:
    """The grid phases' planned trials, around the default hparams (what `ptctl study plan` shows: `Phase.planned`)."""
    return {phase: trials for phase in phases_of(spec) if (trials := PHASES[phase].planned(spec)) is not None}


def planned_runs(spec: StudySpec) -> dict[str, list[tuple[int, float]]]:
    """Per phase, (width, steps) of each planned trial (the phases' plans around the default hparams); tune's steps
    are ASHA's expectation."""
    return {phase: [(w, s) for w, s, _, _ in runs] for phase, runs in _planned_runs(spec).items()}


def _planned_runs(spec: StudySpec) -> dict[str, list[Run]]:
    """`planned_runs` with each trial's depth (a depth sweep's; else None: the arch's) and batch size (tune's,
    a batch sweep's, else train.batch_size)."""
    t, full = spec.tune, spec.steps_for("tune")
    steps = asha_steps(full, spec.asha_rungs(), t.asha.reduction_factor)
    runs: dict[str, list[Run]] = {"tune": [(t.base_width, steps, None, spec.batch_for("tune"))] * t.num_trials}
    for phase, trials in planned_trials(spec).items():
        runs[phase] = [(trial.width, trial.steps(spec), trial.depth, trial.batch_size(spec))
                       for trial in trials]
    return runs


def plan_cost(spec: StudySpec) -> CostPlan:
    """The planned FLOPs of every phase and of one training run at each transfer width."""
    if spec.compare is not None:
        raise ValueError("a compare study's budgets are its own cost account (report: compare, train_flops); "
                         "plan a study with transfer widths instead")
    phases = [_phase(spec, name, runs, spec.steps_for(name) if name == "tune" else None)
              for name, runs in _planned_runs(spec).items()]
    widths = spec.transfer.widths if spec.transfer is not None else []
    targets = {w: spec.train.steps * spec.train.batch_size * sequence_flops(spec, w) for w in widths}
    return CostPlan(phases, targets)


def measured_cost(spec: StudySpec, tables: dict[str, Any], phase_wall_s: dict[str, float] | None = None
                  ) -> dict[str, Any]:
    """The cost of a finished study from its trial tables (`phase` → DataFrame with width, steps, wall_time_s).

    Returns `{"rows": [...], "targets": {width: {"flops", "wall_s"}}, "metrics": {...}}`: one row per phase with
    its trials, steps run, FLOPs, Σ trial wall time and, where known, the phase's elapsed wall time; a target's
    wall time is the median wall time of the transfer trials at that width. `metrics` are flat numbers for
    MLflow (`cost.<phase>.flops`, `cost.proxy_pct.w<W>` = tune FLOPs as % of one run at W, `cost.checks_pct.w<W>`
    = tune + verify + validate, and the same for wall time as `*_wall_pct`).
    """
    if spec.compare is not None:
        return {"rows": [], "targets": {}, "metrics": {}}
    walls, batch = phase_wall_s or {}, spec.train.batch_size
    try:
        sizes = {(int(w), d) for t in tables.values() if t is not None for w, d in zip(t["width"], _depths(t),
                                                                                       strict=True)}
        sizes |= {(w, None) for w in (spec.transfer.widths if spec.transfer else [])}
        per_seq = {(w, d): sequence_flops(spec, w, d) for w, d in sizes}
    except ValueError:  # a family without a FLOP formula (TauGPT): wall time only
        per_seq = None
    rows: list[dict[str, Any]] = []
    for phase, table in tables.items():
        if phase not in (*CHECK_PHASES, "transfer") or table is None or table.empty:
            continue
        steps = table["steps"].fillna(0)
        flops = None if per_seq is None else float(sum(
            float(s) * b * per_seq[int(w), d] for w, d, s, b in zip(table["width"], _depths(table), steps,
                                                                    _batches(spec, phase, table), strict=True)))
        rows.append({"phase": phase, "trials": len(table), "steps": int(steps.sum()), "flops": flops,
                     "trial_wall_s": float(table["wall_time_s"].fillna(0).sum()), "phase_wall_s": walls.get(phase)})
    targets: dict[int, dict[str, float | None]] = {}
    transfer = tables.get("transfer")
    for w in (spec.transfer.widths if spec.transfer is not None else []):
        at = transfer[transfer["width"] == w]["wall_time_s"].dropna() if transfer is not None else None
        targets[w] = {"flops": None if per_seq is None else spec.train.steps * batch * per_seq[w, None],
                      "wall_s": float(at.median()) if at is not None and len(at) else None}
    metrics: dict[str, float] = {}
    for row in rows:
        if row["flops"] is not None:
            metrics[f"cost.{row['phase']}.flops"] = row["flops"]
        metrics[f"cost.{row['phase']}.trial_wall_s"] = row["trial_wall_s"]
    for w, target in targets.items():
        for name, phases in (("proxy", ("tune",)), ("checks", CHECK_PHASES)):
            chosen = [r for r in rows if r["phase"] in phases]
            if target["flops"]:
                metrics[f"cost.{name}_pct.w{w}"] = 100 * sum(r["flops"] for r in chosen) / target["flops"]
            if target["wall_s"]:
                metrics[f"cost.{name}_wall_pct.w{w}"] = 100 * sum(r["trial_wall_s"] for r in chosen) / target["wall_s"]
    return {"rows": rows, "targets": targets, "metrics": metrics}


def _batches(spec: StudySpec, phase: str, table: Any) -> list[int]:
    """Each row's batch size: a batch sweep's (the `batch_size` column), else the phase's (`StudySpec.batch_for`)."""
    own = spec.batch_for(phase)
    if "batch_size" not in table:
        return [own] * len(table)
    return [own if b != b or b is None else int(b) for b in table["batch_size"]]  # b != b: NaN


def _depths(table: Any) -> list[int | None]:
    """Each row's depth: a depth sweep's (the `depth` column), else None (the arch's)."""
    if "depth" not in table:
        return [None] * len(table)
    return [None if d != d or d is None else int(d) for d in table["depth"]]  # d != d: NaN
