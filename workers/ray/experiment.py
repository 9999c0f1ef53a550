"""A phase as a Ray Tune experiment: `run_phase` runs it, or restores and finishes it, and returns its trial table.

Every phase is a Ray Tune experiment stored under the study's folder, so a killed driver can
`Tuner.restore` it. Its name carries the study id (`workers.runner.experiment_name`): Tune stages a driver's
experiment files in `<Ray session>/artifacts/<start time, to the second>/<experiment name>/`, so two
studies whose phases start in the same second under one phase name would share (and restore) each
other's trials. `tune` searches with OptunaSearch (TPE) and ASHA; `transfer`, `verify` and
`validate` run a fixed list of planned trials (`studies.plan`) as a grid. `RayRunner` is
this module as the driver's `workers.runner.Runner`; planned trials travel in Tune's config as
`PlannedTrial.as_dict()`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import pandas as pd
import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from analysis.table import TrialStatus
from studies.estimate import lanes, trial_bytes
from studies.members import auto_members, batches
from studies.plan import PlannedTrial
from studies.spec import StudySpec
from workers.errors import InfrastructureLost, Interrupted, StudyFailed
from workers.ray.callback import MlflowTrials, failure_cause
from workers.ray.cluster import (
    NodeWatch,
    _phase_gpus,
    check_gpus,
    ensure_ray,
    ray_memory,
    resources,
    worker_gpu_memory,
)
from workers.ray.ledger import FinishedTrials, content_key
from workers.ray.trainable import OBJECTIVE, final_reports, members_of, study_trainable
from workers.report import TrialReport
from workers.runner import PhaseJob, batch_tag, optuna_space, trial_frame, trial_row

log = logging.getLogger(__name__)


class RayRunner:
    """The `workers.runner.Runner` on Ray Tune: `run_phase` with `MlflowTrials` writing the trial runs."""

    def run_phase(self, job: PhaseJob) -> pd.DataFrame:
        callback = MlflowTrials(job.spec, job.study_id, job.phase, job.phase_run, job.tracker.uri, job.tags,
                                instance=job.instance)
        callback.notify = job.notify
        planned = None if job.planned is None else _grid(job.spec, job.phase, job.planned)
        return run_phase(job.spec, job.phase, job.storage, callback, planned, experiment=job.experiment)


def _grid(spec: StudySpec, phase: str, planned: list[PlannedTrial]) -> list[dict[str, Any]]:
    """A grid phase's Tune trials: each planned trial alone (`as_dict`), or batches of them (`{"members": [...],
    "batch": "i/n"}`) when `resources.batch_members` (auto: the cluster's GPUs, their memory and the trial slots)
    makes any."""
    ensure_ray()
    res, total = spec.resources, resources()
    gpus = _phase_gpus(spec, phase)
    slots = int(total.get("GPU", 0) // gpus) if gpus else int(total.get("CPU", 1) // res.cpus_per_trial)
    memory = worker_gpu_memory(gpus) if gpus and res.batch_members == "auto" else None
    k = auto_members(spec, planned, slots=max(slots, 1), memory_bytes=memory, gpu=gpus > 0)
    groups = batches(spec, planned, k)
    return [group[0].as_dict() if len(group) == 1 else
            {"members": [t.as_dict() for t in group], "batch": f"{i + 1}/{len(groups)}"}
            for i, group in enumerate(groups)]


def storage_root(spec: StudySpec, local: Path) -> str:
    """Where Tune keeps a study's experiments and trial checkpoints: `resources.storage` (else PTCTL_STORAGE) with
    the study's id (`local` is its folder's `ray/`), a path or an S3 URI that every node reaches; else `local`."""
    shared = spec.resources.storage or os.environ.get("PTCTL_STORAGE")
    return f"{shared.rstrip('/')}/{local.parent.name}" if shared else str(local)


def run_phase(spec: StudySpec, phase: str, storage: Path, callback: MlflowTrials,
              planned: list[dict[str, Any]] | None = None, *, experiment: str) -> pd.DataFrame:
    """Run (or restore and finish) one phase's Tune experiment `<storage_root>/experiment`; its trial table.

    `experiment` must be unique to the study (`experiment_name`). Ray itself failing (the cluster
    lost, a node's raylet gone) raises `InfrastructureLost`: the study is interrupted, not failed."""
    ensure_ray()
    root = storage_root(spec, storage)
    res = spec.resources
    gpus = _phase_gpus(spec, phase)
    found = resources()
    check_gpus(phase, gpus, found.get("GPU", 0))
    finished = callback.use_ledger(FinishedTrials(storage / f"{experiment}.finished.jsonl"))
    trainable = study_trainable(spec, phase, experiment, gpus, finished)
    faults: dict[str, Any] = {
        "callbacks": [callback, NodeWatch(phase, res.cpus_per_trial, gpus)],  # no node for the trials: interrupted
        "failure_config": tune.FailureConfig(max_failures=res.max_retries),
        "checkpoint_config": tune.CheckpointConfig(num_to_keep=1)}  # the latest one is all a restart needs
    at_once = lanes(spec, phase, int(found.get("CPU", 1)), found.get("GPU", 0), ray_memory(found))
    squeezed = False
    try:
        while True:
            tuner = _tuner(spec, phase, trainable, planned, root, experiment, faults, at_once)
            try:
                with tune_log(storage / f"{experiment}.log"):
                    grid = tuner.fit()
            except BaseException as exc:
                with contextlib.suppress(Exception):  # what the runs could still record; the fit's error is the cause
                    callback.flush()
                if not memory_killed(exc):
                    raise
                killed: object = exc  # a task's worker killed: Tune fails the whole fit
            else:  # an actor killed as it started: Tune records its trial errored
                killed = next((e for e in (grid[i].error for i in range(len(grid))) if e and memory_killed(e)), None)
            if killed is None:
                break
            if squeezed:
                raise StudyFailed(squeeze_words(spec, phase, at_once, killed, storage.parent.name)) from (
                    killed if isinstance(killed, BaseException) else None)
            squeezed, at_once = True, max(1, at_once // 2)
            log.warning("%s phase: Ray's memory monitor killed trial workers (%s); resuming the phase with at most "
                        "%d trial(s) at once", phase, failure_cause(str(killed)), at_once)
        callback.flush()  # the trials' runs are complete before the caller reads or prunes them
    except (ray.exceptions.RaySystemError, ray.exceptions.ActorDiedError, ray.exceptions.NodeDiedError,
            ray.exceptions.RpcError) as exc:
        raise InfrastructureLost(f"Ray failed during the {phase} phase ({type(exc).__name__}: {exc}); "
                                 "re-run to resume it") from exc
    check_all_ran(phase, grid, spec.tune.num_trials if planned is None else len(planned))
    return grid_table(spec, phase, grid, {k: r["trial_id"] for k, r in finished.items()})


# Tune's loggers, the TensorBoard writer under it, and the warnings shown meanwhile (`py.warnings`, as
# `logging.captureWarnings` names them)
CHATTER = ("ray.tune", "ray.train", "ray.air", "tensorboardX", "py.warnings")


def _log_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:  # warnings.showwarning's
    logging.getLogger("py.warnings").warning(warnings.formatwarning(message, category, filename, lineno, line).rstrip())


@contextlib.contextmanager
def tune_log(path: Path) -> Iterator[None]:
    """While a phase runs, what Tune logs (a failed trial's traceback, its snapshot warnings, TensorBoard's NaN
    warning for a diverged trial) and what the libraries warn (Optuna, when a retried trial reports a step again)
    goes to `path` beside the experiment, not to the terminal: ptctl's own output (progress, the trial table, the
    error line) says what happened, and the log file has the detail."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger(name) for name in CHATTER]
    saved = [(each.handlers, each.propagate) for each in loggers]
    for each in loggers:
        each.handlers, each.propagate = [handler], False
    try:
        with warnings.catch_warnings():  # the filters and `showwarning` as they were, after
            warnings.showwarning = _log_warning
            yield
    finally:
        for each, (handlers, propagate) in zip(loggers, saved, strict=True):
            each.handlers, each.propagate = handlers, propagate
        handler.close()


def _tuner(spec: StudySpec, phase: str, trainable: Any, planned: list[dict[str, Any]] | None, root: str,
           experiment: str, faults: dict[str, Any], at_once: int) -> tune.Tuner:
    """The phase's Tuner: restored from `<root>/<experiment>` when Tune saved it (`faults` and `at_once`, this run's,
    put in: `_renew`), else new."""
    path = f"{root}/{experiment}"
    if tune.Tuner.can_restore(path):
        log.info("restoring the %s phase from %s", phase, path)
        # the plan again: a driver killed before Tune's first state save leaves only `tuner.pkl`, which keeps no
        # param_space, and Tune then restarts the experiment from the param_space given here
        tuner = tune.Tuner.restore(str(path), trainable, param_space=_param_space(planned), resume_unfinished=True,
                                   resume_errored=True)
        _renew(tuner, faults, at_once)
        return tuner
    return tune.Tuner(trainable, param_space=_param_space(planned), tune_config=_tune_config(spec, phase, at_once),
                      run_config=tune.RunConfig(name=experiment, storage_path=root, verbose=0, log_to_file=True,
                                                **faults))


MEMORY_KILLED = "running low on memory"  # what Ray's memory monitor says of the workers it killed


def memory_killed(exc: object) -> bool:
    """Whether `exc` (Tune's fit failing, or a trial's recorded error) comes from Ray's memory monitor killing trial
    workers: an `OutOfMemoryError` in its chain (Tune 2.60 re-raises it as a RuntimeError that fails the whole fit),
    or its words."""
    if not isinstance(exc, BaseException):
        return MEMORY_KILLED in str(exc)
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ray.exceptions.OutOfMemoryError) or MEMORY_KILLED in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def squeeze_words(spec: StudySpec, phase: str, at_once: int, exc: object, study_id: str) -> str:
    """The phase's error after its trials were killed for memory twice: how much, what to lower, how to resume."""
    need = trial_bytes(spec, phase, resources().get("GPU", 0)) / 2**30
    total = (ray_memory(resources()) or 0) / 2**30
    lower = "tune.max_concurrent (or raise resources.cpus_per_trial)" if phase == "tune" else \
        "resources.cpus_per_trial (fewer trials at once)"
    return (f"the {phase} phase's trials were killed by Ray's memory monitor twice, the second time with at most "
            f"{at_once} at once (each trial needs about {need:.1f} GiB; the cluster has {total:.1f} GiB): the node "
            f"ran low on memory ({failure_cause(str(exc))}). Lower {lower}, train.batch_size or data.seq_len, or "
            f"free the node's memory; then resume the study (the same command, or POST /studies/{study_id}/resume): "
            "its finished trials are kept")


def check_all_ran(phase: str, grid: tune.ResultGrid, expected: int) -> None:
    """Raise `Interrupted` when Tune returned before every trial ran: on SIGINT it stops and returns the trials it
    has (fewer than planned; one that never started has no config); its saved state resumes the rest."""
    ran = sum(grid[i].config is not None for i in range(len(grid)))
    if ran < expected:
        raise Interrupted(f"the {phase} phase stopped with {ran} of its {expected} trials run "
                          "(interrupted): re-run the same command to resume it")


def _renew(tuner: tune.Tuner, faults: dict[str, Any], at_once: int) -> None:
    """A restored Tuner runs with the RunConfig pickled at its start: its callback lost the driver's `notify`
    (the progress bar) and its retry and checkpoint settings may be older. Put this run's in (the Tuner runs in
    this process unless Ray Client is used, where the pickled ones stay)."""
    # Ray Tune 2.60.0 has no public way: `Tuner.restore` takes no RunConfig (only the trainable, param_space, the
    # resume flags and storage_filesystem) and reads the one in `tuner.pkl`, so it is set on Tune's own TunerInternal
    local = getattr(tuner, "_local_tuner", None)
    if local is None:
        log.warning("restored Tuner runs remotely (Ray Client): keeping its pickled callbacks and failure settings")
        return
    run_config = local.get_run_config()
    for key, value in faults.items():
        setattr(run_config, key, value)
    local._tune_config.max_concurrent_trials = at_once  # Tune 2.60: the TuneConfig it restored, on TunerInternal


def _param_space(planned: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {} if planned is None else {"trial": tune.grid_search(planned)}


def _tune_config(spec: StudySpec, phase: str, at_once: int) -> tune.TuneConfig:
    """The phase's TuneConfig, `at_once` trials at most running together (`studies.estimate.lanes`)."""
    if phase != "tune":  # trial actors are reused: no process start, torch import or data load per trial
        return tune.TuneConfig(metric=OBJECTIVE, mode="min", reuse_actors=True, max_concurrent_trials=at_once)
    import optuna  # the driver's searcher: trial actors import this module without Optuna
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t = spec.tune
    space = optuna_space(spec)
    defaults = spec.space.defaults()
    searcher = OptunaSearch(space=space, metric=OBJECTIVE, mode="min", sampler=optuna.samplers.TPESampler(seed=t.seed),
                            points_to_evaluate=[{k: defaults[k] for k in space}])
    scheduler = ASHAScheduler(time_attr="step", max_t=spec.steps_for("tune"), grace_period=t.asha.grace_steps,
                              reduction_factor=t.asha.reduction_factor) if t.asha.enabled else None
    return tune.TuneConfig(metric=OBJECTIVE, mode="min", search_alg=searcher, scheduler=scheduler,
                           num_samples=t.num_trials, max_concurrent_trials=at_once, reuse_actors=True)


def grid_table(spec: StudySpec, phase: str, grid: tune.ResultGrid, originals: dict[str, str] | None = None
               ) -> pd.DataFrame:
    """The tidy trial table (see `analysis`) of a finished Tune experiment, one row per trial (a batch's: one per
    member) from its final reports; a trial that replayed a finished one (`FinishedTrials`) under a new id gets the
    id it first had (`originals`: content key → id)."""
    rows = []
    for result in (grid[i] for i in range(len(grid))):
        m, config = result.metrics or {}, result.config or {}
        trial_id = (originals or {}).get(content_key(config)) or m.get("trial_id") or Path(result.path).name
        members = members_of(spec, phase, config, trial_id)
        tag = batch_tag(config["trial"]["batch"], len(members)) if len(members) > 1 else None
        if result.error:
            reports = [TrialReport(status=TrialStatus.FAILED, message=failure_cause(str(result.error)))] * len(members)
        else:
            reports = final_reports(m, len(members))
        rows += [trial_row(spec, t, r.model_copy(update={"batch": tag})) for t, r in zip(members, reports, strict=True)]
    return trial_frame(list({row["trial_id"]: row for row in rows}.values()))  # a replayed trial once
