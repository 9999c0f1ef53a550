"""How long a study will take on this machine, before it runs: wall time per phase from each planned trial's
shape, the seconds a step and an evaluation of that shape took in a short probe (`workers.probe`), and the trials
a phase runs at once (no torch, Ray or MLflow: the arithmetic only).

A job is one trial process: a trial, or a batch of `resources.batch_members` members trained as one stacked model.
A job of `steps` steps and `evals` evaluations costs build + steps · step_s + evals · eval_s + Ray's overhead. A
phase's jobs go to its lanes in plan order, each to the lane that frees first (Tune starts the next trial on the
first free slot), and the phase costs its longest lane plus PHASE_START_S; the study costs its phases plus
STUDY_START_S. Tune's trials stop where synchronous halving stops them (`tune_steps`: 1/η of them pass each rung,
as `studies.cost.asha_steps` expects; Ray's asynchronous ASHA promotes a few more, so tune is rather a lower bound);
a verify centre seed reused from transfer trains nothing. Lanes are Ray's trial slots on this machine: its CPUs over
`resources.cpus_per_trial` (and its GPUs over a phase's GPUs per trial), tune's at most `tune.max_concurrent`, and
no more than MEMORY_SHARE of the cluster's memory holds (`trial_bytes`); the study engine runs them so too
(`workers.ray.experiment`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from studies.cost import planned_trials, sequence_flops
from studies.members import auto_members, batches, member_bytes
from studies.phases.verify import reused_centre_seeds
from studies.spec import StudySpec

TRIAL_PROCESS_BYTES = 1.3e9  # a CPU trial worker's resident memory beside its model (tiny's: torch, Ray, the data)
MEMORY_SHARE = 0.8  # of the cluster's memory its trials may fill at once (the rest: the head, the drivers, slack)
# Ray's costs that no probe of a step sees, fitted on 2 idle cores (tiny; cpu_demo tuned at 32, moved to 64); a
# phase's and the study's start are process starts, CPU-bound: they take `busy` = 1 + load/cores times as long
PHASE_START_S = 2.0  # trial actors started afresh (torch, Ray Tune, the cached data), the phase's figures at its end
TRIAL_OVERHEAD_S = 0.25  # Tune's scheduling, the trial's reports and its MLflow run
TUNE_TRIAL_OVERHEAD_S = 2.0  # also TPE's suggestion and ASHA's stop before Tune starts the next trial (0.4–3 s)
STUDY_START_S = 7.0  # the local Ray's start, the MLflow store, and the report at the end
UNCERTAINTY = 0.25  # the band printed: a few probed steps against a whole run, and the machine's load meanwhile


@dataclass(frozen=True)
class Shape:
    """What one step's time depends on: the model at a width (and depth), the batch, the device, the members."""

    family: str
    width: int
    depth: int | None  # a depth sweep's trial: its depth; None: the arch's
    batch_size: int
    seq_len: int
    device: str  # "cpu" | "cuda": where the trial will train (train.device cpu, or a phase without GPUs: the CPU)
    members: int = 1  # trials trained together as one stacked model
    own_batch: bool = field(default=False, compare=False)  # batch_size is not train.batch_size: the label says it

    def label(self) -> str:
        depth = f" depth {self.depth}" if self.depth is not None else ""
        batch = f" batch {self.batch_size}" if self.own_batch else ""
        members = f" ×{self.members}" if self.members > 1 else ""
        return f"w{self.width}{depth}{batch}{members}"


@dataclass(frozen=True)
class ShapeTime:
    """A shape's measured (or scaled) seconds: one optimizer step, one evaluation, and building model and
    optimiser."""

    step_s: float
    eval_s: float
    build_s: float
    source: str = "probed"  # or how it was derived ("scaled from w64 by FLOPs")


@dataclass(frozen=True)
class Job:
    """One trial process of a phase: its shape, steps (tune: ASHA's expectation), evaluations and trials."""

    shape: Shape
    steps: float
    evals: float
    trials: int = 1
    overhead_s: float = TRIAL_OVERHEAD_S  # what Ray adds to each (tune's: TUNE_TRIAL_OVERHEAD_S)

    def seconds(self, time: ShapeTime) -> float:
        return time.build_s + self.steps * time.step_s + self.evals * time.eval_s + self.overhead_s


@dataclass(frozen=True)
class PhaseTime:
    phase: str
    trials: int
    lanes: int  # trials (jobs) running at once
    seconds: float | None  # None: a shape of it was neither probed nor scaled


@dataclass(frozen=True)
class Estimate:
    phases: list[PhaseTime]
    assumptions: str  # one line: what the figures assume (the probe, the lanes, ASHA, Ray's fixed costs)
    unprobed: list[str] = field(default_factory=list)  # `label: why` of each trial shape the probe could not time
    uncertainty: float = UNCERTAINTY
    start_s: float = STUDY_START_S  # the study's start at this machine's load

    @property
    def total_s(self) -> float | None:
        """Every phase and the study's start; None when a phase has no estimate."""
        if any(p.seconds is None for p in self.phases):
            return None
        return self.start_s + sum(p.seconds or 0.0 for p in self.phases)

    def line(self) -> str:
        """`estimate: tune 3 min 10 s · transfer 40 s · total ≈ 5 min (±25 %)`."""
        parts = [f"{p.phase} {duration_text(p.seconds) if p.seconds is not None else '?'}" for p in self.phases]
        total = self.total_s
        end = "total unknown (a shape was not probed)" if total is None else \
            f"total ≈ {duration_text(total, rough=True)} (±{100 * self.uncertainty:.0f} %)"
        return "estimate: " + " · ".join([*parts, end])


def duration_text(seconds: float, rough: bool = False) -> str:
    """`40 s`, `3 min 10 s`, `1 h 5 min`; `rough` (a total with a ±25 % band): to 10 s below 10 min, else to the
    minute."""
    step = (10 if seconds < 600 else 60) if rough else 1
    s = round(seconds / step) * step
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def phase_gpus(spec: StudySpec, phase: str, gpus: float) -> float:
    """GPUs per trial of `phase` on a machine with `gpus` (as `workers.ray.cluster._phase_gpus` resolves them)."""
    res = spec.resources
    if phase == "tune":
        return res.gpus_per_trial
    return res.transfer_gpus if res.transfer_gpus is not None else (1.0 if gpus else 0.0)


def lanes(spec: StudySpec, phase: str, cpus: int, gpus: float, memory: float | None = None) -> int:
    """Trials of `phase` running at once on `cpus` CPUs, `gpus` GPUs and `memory` bytes (None: not counted): Ray's
    slots (each trial holds cpus_per_trial CPUs and its GPUs), tune's capped at max_concurrent, and no more than
    MEMORY_SHARE of the memory holds (`trial_bytes` each); the local runner: one."""
    if spec.resources.runner == "local":  # workers.runner.InProcessRunner: one trial (or batch) after another
        return 1
    slots = int(cpus // spec.resources.cpus_per_trial)
    per_gpu = phase_gpus(spec, phase, gpus)
    if per_gpu:
        slots = min(slots, int(gpus // per_gpu))
    if phase == "tune":
        slots = min(slots, spec.tune.max_concurrent)
    if memory is not None:
        slots = min(slots, int(MEMORY_SHARE * memory // trial_bytes(spec, phase, gpus)))
    return max(1, slots)


def trial_bytes(spec: StudySpec, phase: str, gpus: float) -> float:
    """A trial process's host memory: TRIAL_PROCESS_BYTES (torch, Ray, the data), and on CPU its model's training
    memory at the phase's widest width (`member_bytes`)."""
    if phase_gpus(spec, phase, gpus) > 0 and spec.train.device != "cpu":
        return TRIAL_PROCESS_BYTES
    widths = [spec.tune.base_width] if phase == "tune" else [t.width for t in planned_trials(spec).get(phase, [])]
    model = member_bytes(spec, max(widths, default=spec.tune.base_width), spec.batch_for(phase))
    return TRIAL_PROCESS_BYTES + (model or 0.0)


def eval_batches(spec: StudySpec) -> int:
    """Batches of one evaluation: train.eval_batches, fewer when the held-out sequences run out first."""
    return min(spec.train.eval_batches, math.ceil(spec.data.max_eval_sequences / spec.train.batch_size))


def _shape(spec: StudySpec, phase: str, width: int, depth: int | None, gpus: float, members: int = 1,
           batch_size: int | None = None) -> Shape:
    """A trial's shape; `batch_size`: a batch sweep's (None: the phase's, `StudySpec.batch_for`)."""
    device = "cuda" if phase_gpus(spec, phase, gpus) > 0 and spec.train.device != "cpu" else "cpu"
    batch = batch_size or spec.batch_for(phase)
    return Shape(spec.model.family, width, depth, batch, spec.data.seq_len, device, members,
                 batch != spec.train.batch_size)


def tune_steps(spec: StudySpec) -> list[int]:
    """Each tune trial's steps as synchronous halving stops them: of n trials, round(n/η^k) (at least one) train past
    rung k; the full budgets first (Ray's asynchronous ASHA lets its first trials through: nothing beats them yet).
    The same total as `studies.cost.asha_steps` but for rounding, and the long trials make a lane the last."""
    t, full = spec.tune, spec.steps_for("tune")
    rungs = [r for r in spec.asha_rungs() if r < full]
    past = [max(1, round(t.num_trials / t.asha.reduction_factor ** k)) for k in range(len(rungs) + 1)]
    steps = [full] * past[-1]
    for k in range(len(rungs), 0, -1):  # the trials stopped at rung k: they passed rung k - 1 and no further
        steps += [int(rungs[k - 1])] * (past[k - 1] - past[k])
    return steps


def planned_jobs(spec: StudySpec, cpus: int, gpus: float = 0, gpu_memory: float | None = None,
                 memory: float | None = None) -> dict[str, list[Job]]:
    """Each phase's jobs in plan order: tune's `num_trials` trials at ASHA's expected steps, the grid phases'
    planned trials as `resources.batch_members` packs them (auto: as `studies.members.auto_members` would, from
    the lanes and `gpu_memory`, the bytes of one GPU)."""
    if spec.compare is not None:
        raise ValueError("a compare study's runs are not estimated: its stages' widths come from the vocabulary; "
                         "plan a study with transfer widths instead")
    every = spec.train.eval_every
    shape = _shape(spec, "tune", spec.tune.base_width, None, gpus)
    jobs = {"tune": [Job(shape, n, math.ceil(n / every), overhead_s=TUNE_TRIAL_OVERHEAD_S) for n in tune_steps(spec)]}
    for phase, trials in planned_trials(spec).items():
        if phase == "verify":
            reused = set(reused_centre_seeds(spec))
            trials = [trial for trial in trials if not (trial.is_centre and trial.seed in reused)]
        gpu = phase_gpus(spec, phase, gpus) > 0
        slots = lanes(spec, phase, cpus, gpus, memory)
        k = auto_members(spec, trials, slots=slots, memory_bytes=gpu_memory, gpu=gpu)
        jobs[phase] = []
        for group in batches(spec, trials, k):
            first = group[0]
            n = first.steps(spec)
            shape = _shape(spec, phase, first.width, first.depth, gpus, len(group), first.batch_size(spec))
            jobs[phase].append(Job(shape, n, math.ceil(n / every), len(group)))
    return jobs


def at_once(spec: StudySpec, jobs: Mapping[str, list[Job]], cpus: int, gpus: float,
            memory: float | None = None) -> dict[Shape, int]:
    """Per shape, the trials that run side by side in the busiest phase that trains it: its lanes, or its jobs if
    fewer (what the probe times it beside: trials on one machine share more than their cores)."""
    out: dict[Shape, int] = {}
    for phase, phase_jobs in jobs.items():
        k = min(lanes(spec, phase, cpus, gpus, memory), len(phase_jobs))
        for job in phase_jobs:
            out[job.shape] = max(out.get(job.shape, 1), k)
    return out


def shapes_of(jobs: Mapping[str, list[Job]]) -> list[Shape]:
    """The distinct shapes of the jobs, smallest first (the order a probe with a time budget takes them in)."""
    found = {job.shape for phase in jobs.values() for job in phase}
    return sorted(found, key=lambda s: (s.width, s.depth or 0, s.members, s.device))


def step_flops(spec: StudySpec, shape: Shape) -> float | None:
    """Training FLOPs of one step of `shape` (every member's); None: the family registers no FLOP counts."""
    try:
        return shape.members * shape.batch_size * sequence_flops(spec, shape.width, shape.depth)
    except ValueError:
        return None


def scaled(spec: StudySpec, shape: Shape, measured: Mapping[Shape, ShapeTime]) -> ShapeTime | None:
    """`shape`'s time scaled by FLOPs from the largest measured shape on its device (else the smallest); None
    when the family has no FLOP counts or nothing on that device was measured. Scaling up from a small shape
    overstates a large one's time on a GPU (the small one leaves it idle), understates it past a CPU's caches."""
    want = step_flops(spec, shape)
    known = [(f, s) for s in measured if s.device == shape.device and (f := step_flops(spec, s))]
    if want is None or not known:
        return None
    below = [(f, s) for f, s in known if f <= want]
    flops, ref = max(below, key=lambda x: x[0]) if below else min(known, key=lambda x: x[0])
    ratio, base = want / flops, measured[ref]
    return ShapeTime(base.step_s * ratio, base.eval_s * ratio, base.build_s * ratio,
                     f"{shape.label()} scaled from {ref.label()} by FLOPs")


def completed(spec: StudySpec, shapes: Iterable[Shape], measured: Mapping[Shape, ShapeTime]) -> dict[Shape, ShapeTime]:
    """The measured times, and each other shape's scaled by FLOPs where it can be (`scaled`)."""
    out = dict(measured)
    for shape in shapes:
        if shape not in out and (time := scaled(spec, shape, measured)) is not None:
            out[shape] = time
    return out


def schedule(durations: Iterable[float], lanes: int) -> float:
    """The makespan of `durations` started in order, each on the lane that frees first."""
    free = [0.0] * max(1, lanes)
    for d in durations:
        heapq.heapreplace(free, free[0] + d)
    return max(free)


def estimate(spec: StudySpec, jobs: Mapping[str, list[Job]], times: Mapping[Shape, ShapeTime], cpus: int,
             gpus: float, assumptions: str, busy: float = 1.0, memory: float | None = None,
             unprobed: Iterable[str] = ()) -> Estimate:
    """The wall time of each phase of `jobs` on `cpus` CPUs and `gpus` GPUs from the shapes' `times` (module
    docstring), the starts `busy` times their idle cost; a phase with a shape missing from `times` has none
    (`unprobed`: the shapes not probed, and why)."""
    phases = []
    for phase, phase_jobs in jobs.items():
        n = lanes(spec, phase, cpus, gpus, memory)
        seconds = None
        if all(job.shape in times for job in phase_jobs):
            seconds = PHASE_START_S * busy + schedule((job.seconds(times[job.shape]) for job in phase_jobs), n)
        phases.append(PhaseTime(phase, sum(job.trials for job in phase_jobs), min(n, max(len(phase_jobs), 1)),
                                seconds))
    return Estimate(phases, assumptions, list(unprobed), start_s=STUDY_START_S * busy)


def lanes_text(spec: StudySpec, jobs: Mapping[str, list[Job]], cpus: int, gpus: float,
               memory: float | None = None) -> str:
    """`2 trials at a time (2 CPUs ÷ resources.cpus_per_trial 1)`, naming each phase whose lanes differ, and what
    capped them below what was asked (tune.max_concurrent) or what the CPUs allow (the memory)."""
    per_phase = {phase: min(lanes(spec, phase, cpus, gpus, memory), max(len(j), 1)) for phase, j in jobs.items()}
    counts = sorted(set(per_phase.values()))
    why = f"{cpus} CPUs ÷ resources.cpus_per_trial {spec.resources.cpus_per_trial:g}" + (
        f", {gpus:g} GPUs" if gpus else "")
    by_cpus = {phase: lanes(spec, phase, cpus, gpus) for phase in jobs}
    capped = [p for p in jobs if memory is not None and lanes(spec, p, cpus, gpus, memory) < by_cpus[p]]
    if capped and memory is not None:
        need = max(trial_bytes(spec, p, gpus) for p in capped) / 2**30
        why += (f"; capped by memory: {MEMORY_SHARE:.0%} of {memory / 2**30:.1f} GiB holds that many trials of "
                f"~{need:.1f} GiB ({', '.join(capped)})")
    if "tune" in jobs and spec.tune.max_concurrent > by_cpus["tune"]:
        why += f"; tune.max_concurrent {spec.tune.max_concurrent} capped to {per_phase['tune']}"
    if len(counts) == 1:
        return f"{counts[0]} trial{'s' if counts[0] > 1 else ''} at a time ({why})"
    return ", ".join(f"{phase} {n}" for phase, n in per_phase.items()) + f" trials at a time ({why})"
