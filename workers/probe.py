"""A short measured probe of a study's trial shapes on this machine, and the study's wall-time estimate from it
(`studies.estimate` has the arithmetic; `estimate_here` joins the two).

Each distinct shape of the planned trials (`studies.estimate.Shape`) is built as a trial builds it (`Solo`, or
`Stacked` for a batch's members) at the space's default hparams, with a trial's threads (Ray gives each trial
`resources.cpus_per_trial`). It trains WARMUP_STEPS steps untimed, TIMED_STEPS timed, then one evaluation of the
spec's eval batches, timed. The batches are random tokens below `data.vocab_size`, masked or shifted as the
objective wants: a step's time depends on the shapes, not the text, so no corpus is read or downloaded. A shape is
timed while as many trials of it train beside it, in processes of their own, as the busiest phase that trains it
runs at once (`workers.companions`): trials on one machine share more than their cores.

Shapes go smallest first. A shape whose first step takes over SLOW_STEP_S is timed by that step alone; once
PROBE_BUDGET_S is spent, or when a shape would need over half the free memory, the rest are scaled by FLOPs from
a probed one (`studies.estimate.scaled`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from studies.estimate import (
    PHASE_START_S,
    STUDY_START_S,
    TRIAL_OVERHEAD_S,
    TUNE_TRIAL_OVERHEAD_S,
    Estimate,
    Job,
    Shape,
    ShapeTime,
    at_once,
    completed,
    estimate,
    lanes_text,
    planned_jobs,
    shapes_of,
)
from studies.members import member_bytes
from studies.spec import StudySpec, TrialConfig
from workers.batches import Batch, mask_tokens, row_width, shift_tokens
from workers.companions import Companions
from workers.errors import one_line
from workers.quiet import quiet
from workers.tokenizer import SPECIAL_TOKENS
from workers.train import Engine

WARMUP_STEPS = 2  # the first steps pay one-time costs (allocator, lazy imports) a trial pays once per actor
TIMED_STEPS = 5
SLOW_STEP_S = 5.0  # a first step this long: its shape is timed by it alone (an overestimate, said so)
PROBE_BUDGET_S = 60.0  # past this the larger shapes are scaled by FLOPs: a plan answers in about a minute at most
MEMORY_SHARE = 0.5  # of the free memory a probed shape may need (`studies.members.member_bytes`)


@dataclass(frozen=True)
class Probe:
    times: dict[Shape, ShapeTime]  # the shapes probed
    seconds: float  # the probe's own wall time
    notes: list[str] = field(default_factory=list)  # shapes timed otherwise than their phases will run them
    unprobed: list[str] = field(default_factory=list)  # `label: why` of each shape left unprobed, one line each


@dataclass(frozen=True)
class Machine:
    """What Ray will find here: CPUs, GPUs, one GPU's free memory and the memory its trials share."""

    cpus: int
    gpus: int
    gpu_memory: float | None
    where: str = "this machine"
    memory: float | None = None  # bytes: this machine's MemTotal, or the Ray cluster's memory and object store

    @classmethod
    def here(cls, cpus: int | None = None) -> Machine:
        """This machine (`cpus`: a cap Ray is given, e.g. `PTCTL_RAY_NUM_CPUS`)."""
        found = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        memory = float(torch.cuda.mem_get_info(0)[0]) if gpus else None
        return cls(cpus or found, gpus, memory, memory=_meminfo("MemTotal"))

    def of_ray(self) -> tuple[Machine, str | None]:
        """The Ray cluster at `RAY_ADDRESS` (joined), or the one this process is connected to, as one machine of
        its CPUs, GPUs and memory, a GPU's free memory taken as this machine's (`self`); this machine without
        either (and why, when `RAY_ADDRESS` cannot be reached)."""
        if not os.environ.get("RAY_ADDRESS") and _connected_ray() is None:
            return self, None
        from workers.errors import InfrastructureLost
        from workers.ray.cluster import ensure_ray, ray_memory, resources

        try:
            ensure_ray()
        except InfrastructureLost as exc:
            return self, f"the Ray cluster could not be reached ({one_line(exc)}): this machine's CPUs are counted"
        found = resources()
        return Machine(int(found.get("CPU", 0)) or self.cpus, int(found.get("GPU", 0)), self.gpu_memory,
                       "the Ray cluster", ray_memory(found) or self.memory), None


def _connected_ray() -> Any:
    """Ray, when this process imported it and is connected (None otherwise: nothing here imports it, so the local
    runner needs no Ray installed)."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def _meminfo(key: str) -> float | None:
    """/proc/meminfo's `key` (MemTotal, MemAvailable) in bytes; None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/meminfo", encoding="ascii") as info:
        return float(next(x for x in info if x.startswith(f"{key}:")).split()[1]) * 1024
    return None


def free_memory(device: str) -> float | None:
    """Bytes free on `device` now (the CPU: /proc/meminfo's MemAvailable); None where unknown."""
    if device == "cuda":
        return float(torch.cuda.mem_get_info(0)[0])
    return _meminfo("MemAvailable")


def trial_memory() -> tuple[float, str, bool]:
    """The memory one CPU trial may have at most, where it was read and whether trials may get a GPU: the Ray
    cluster's largest node (`ray_memory`) when this process is connected to one, else this machine's MemTotal."""
    ray = _connected_ray()
    if ray is not None:
        from workers.ray.cluster import ray_memory

        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        largest = max((ray_memory(r) or 0.0 for r in nodes), default=0.0)
        if largest:
            return largest, "the Ray cluster's largest node", any(r.get("GPU", 0) > 0 for r in nodes)
    return _meminfo("MemTotal") or float("inf"), "this machine", torch.cuda.is_available()


def random_batch(spec: StudySpec, generator: torch.Generator, batch_size: int | None = None) -> Batch:
    """A batch of random tokens of the spec's shape (`batch_size` sequences; None: train.batch_size), masked (mlm)
    or shifted (clm)."""
    d = spec.data
    rows = batch_size or spec.train.batch_size
    ids = torch.randint(len(SPECIAL_TOKENS), d.vocab_size, (rows, row_width(d)), generator=generator)
    if d.objective == "clm":
        return shift_tokens(ids)
    return mask_tokens(ids, d.mask_rate, d.mask_mode, d.vocab_size, generator)


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to `n` within (a trial's), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sync(device: torch.device) -> float:
    """The clock, once `device` has finished what it was given."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@dataclass
class Rig:
    """One shape built as a trial builds it, with two batches of random tokens to step on."""

    engine: Engine
    cfg: TrialConfig
    batches: list[Batch]
    device: torch.device
    build_s: float

    def step(self, i: int) -> None:
        batch = self.batches[i % 2]
        for model in self.engine.models:
            model.before_step(batch, i)
        self.engine.losses(batch)
        self.engine.update([True] * len(self.engine.models))


def rig(spec: StudySpec, shape: Shape, steps: int = WARMUP_STEPS + TIMED_STEPS) -> Rig:
    """`shape` at the space's default hparams: `Solo`, or `Stacked` for a batch's members (module docstring)."""
    from workers.train import Solo

    config = spec.trial_config(shape.width, {}, seed=0, steps=steps, depth=shape.depth, batch_size=shape.batch_size)
    cfg = TrialConfig.model_validate({**config, "device": shape.device})
    device = torch.device(shape.device)
    generator = torch.Generator().manual_seed(0)
    batches = [random_batch(spec, generator, shape.batch_size) for _ in range(2)]
    start = _sync(device)
    engine: Engine
    if shape.members == 1:
        engine = Solo(cfg, spec.data.vocab_size, device)
    else:
        from workers.batched import Stacked

        engine = Stacked([cfg] * shape.members, spec.data.vocab_size, device)
    for model in engine.models:
        model.before_trial(cfg)
    return Rig(engine, cfg, batches, device, _sync(device) - start)


def probe_shape(spec: StudySpec, shape: Shape, n_threads: int, steps: int = TIMED_STEPS,
                warmup: int = WARMUP_STEPS, eval_batches: int = 1) -> ShapeTime:
    """Seconds of one step (the mean of the timed ones), one evaluation of `eval_batches` batches (two timed, the
    rest scaled: 64 batches of a large shape would cost more than its steps) and the build of `shape` (module
    docstring)."""
    warmup = max(warmup, 1)  # the first step is never timed: it pays the one-time costs
    with threads(n_threads), quiet(None):
        built = rig(spec, shape, warmup + steps)
        begun = _sync(built.device)
        built.step(0)
        clock = [_sync(built.device)]  # the end of each step
        slow = clock[0] - begun > SLOW_STEP_S
        for i in range(1, 0 if slow else warmup + steps):
            built.step(i)
            clock.append(_sync(built.device))
        ended = clock[-1]
        built.engine.eval_losses(built.batches[:min(eval_batches, 2)])
        for model in built.engine.models:
            model.eval_metrics(built.batches[0], warmup + steps, [])
        evaluated = _sync(built.device)
    step_s = clock[0] - begun if slow else (ended - clock[warmup - 1]) / steps  # the mean: a trial's steps add up
    eval_s = (evaluated - ended) * eval_batches / min(eval_batches, 2)
    source = f"{shape.label()}: one step timed (over {SLOW_STEP_S:g} s)" if slow else "probed"
    return ShapeTime(step_s, eval_s, built.build_s, source)


def _unprobed(spec: StudySpec, shape: Shape, k: int, spent: float, budget_s: float) -> str:
    """Why `shape` is not probed ('' if it is): no CUDA here, the budget spent, or too little free memory for `k`."""
    if shape.device == "cuda" and not torch.cuda.is_available():
        return "this machine has no CUDA device"
    if spent > budget_s:
        return f"the probe's {budget_s:g} s were spent"
    need, free = member_bytes(spec, shape.width, shape.batch_size), free_memory(shape.device)
    if need is not None and free is not None and k * shape.members * need > MEMORY_SHARE * free:
        return f"{k} at a time need ≈ {k * shape.members * need / 2**30:.1f} GiB of the {free / 2**30:.1f} GiB free"
    return ""


def probe(spec: StudySpec, shapes: Sequence[Shape], n_threads: int, budget_s: float = PROBE_BUDGET_S,
          beside: Mapping[Shape, int] | None = None) -> Probe:
    """Each of `shapes` probed in order until `budget_s` is spent (module docstring), each while `beside[shape] - 1`
    companions train it too (`workers.companions`: the trials a phase runs at once); the others in `notes`."""
    from studies.estimate import eval_batches

    at_once = {shape: (beside or {}).get(shape, 1) for shape in shapes}
    times: dict[Shape, ShapeTime] = {}
    notes: list[str] = []
    unprobed: list[str] = []
    start = time.perf_counter()
    company = Companions(spec, max(at_once.values(), default=1) - 1, n_threads, rig) if max(
        at_once.values(), default=1) > 1 else None
    try:
        for shape in shapes:
            why = _unprobed(spec, shape, at_once[shape], time.perf_counter() - start, budget_s)
            if why:
                unprobed.append(f"{shape.label()}: {why}")
                continue
            try:
                with company.beside(shape, at_once[shape]) if company else contextlib.nullcontext(0) as training:
                    times[shape] = probe_shape(spec, shape, n_threads, eval_batches=eval_batches(spec))
                if training + 1 < at_once[shape]:
                    notes.append(f"{shape.label()}: timed beside {training} other trial(s), not {at_once[shape] - 1}")
            except Exception as exc:  # a shape that cannot train here: the estimate says so instead of failing
                unprobed.append(f"{shape.label()}: {one_line(exc)}")
    finally:
        if company is not None:
            company.close()
    return Probe(times, time.perf_counter() - start, notes, unprobed)


def estimate_here(spec: StudySpec, cpus: int | None = None, budget_s: float = PROBE_BUDGET_S) -> Estimate:
    """The study's wall time on this machine, per phase, from a probe of its shapes (each timed beside as many
    trials of it as a phase runs at once); `cpus`: the CPUs Ray gets (None: this machine's)."""
    local = Machine.here(cpus)  # the probe's company: what one machine runs at once
    here, unreached = local.of_ray()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0  # before the probe adds its own
    jobs = planned_jobs(spec, here.cpus, here.gpus, here.gpu_memory, here.memory)
    shapes = shapes_of(jobs)
    n_threads = max(1, int(spec.resources.cpus_per_trial))
    found = probe(spec, shapes, n_threads, budget_s, at_once(spec, jobs, local.cpus, local.gpus, local.memory))
    times = completed(spec, shapes, found.times)
    busy = 1 + load / (os.cpu_count() or 1)
    said = assumptions(spec, jobs, here, found, times, n_threads, load)
    return estimate(spec, jobs, times, here.cpus, here.gpus, f"{said}; {unreached}" if unreached else said, busy,
                    here.memory, found.unprobed)


def assumptions(spec: StudySpec, jobs: dict[str, list[Job]], here: Machine, found: Probe,
                times: dict[Shape, ShapeTime], n_threads: int, load: float) -> str:
    """The estimate's assumptions in one line: the probe, the lanes, ASHA, Ray's fixed costs and the load now (the
    shapes left unprobed are the estimate's own lines, `Probe.unprobed`)."""
    threads = f"{n_threads} thread{'s' if n_threads > 1 else ''} per trial, random tokens"
    if found.times:
        devices = sorted({s.device.upper() if s.device == "cpu" else "GPU" for s in found.times})
        steps = ", ".join(f"{s.label()} {1000 * t.step_s:.0f} ms" for s, t in times.items() if s in found.times)
        most = max(at_once(spec, jobs, here.cpus, here.gpus, here.memory).values(), default=1)
        beside = f", up to {most} at a time as the phases run them" if most > 1 else ""
        probed = (f"probe: {TIMED_STEPS} steps per shape on this machine's {' and '.join(devices)} ({steps} per "
                  f"step{beside}; {found.seconds:.1f} s), {threads}")
    else:
        probed = f"probe: no trial shape could be timed here ({found.seconds:.1f} s)"
    parts = [probed, lanes_text(spec, jobs, here.cpus, here.gpus, here.memory)]
    if spec.tune.asha.enabled:
        parts.append("tune: ASHA's stops as synchronous halving makes them (1/η of the trials pass each rung; Ray's "
                     "asynchronous ASHA runs a few more)")
    busy = 1 + load / (os.cpu_count() or 1)
    parts.append(f"Ray's costs fitted on 2 idle cores: {STUDY_START_S:g} s per study and {PHASE_START_S:g} s per "
                 f"phase (× {busy:.1f} at load {load:.1f} on {os.cpu_count()} cores now), {TRIAL_OVERHEAD_S:g} s per "
                 f"trial ({TUNE_TRIAL_OVERHEAD_S:g} s per tune trial)")
    parts += [t.source for s, t in times.items() if t.source != "probed"]
    parts += found.notes
    if here.where != "this machine":
        parts.append(f"{here.where}'s {here.cpus} CPUs and {here.gpus} GPUs counted, its workers taken to step as "
                     "fast as this machine")
    return "; ".join(parts)
