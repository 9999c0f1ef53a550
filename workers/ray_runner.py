"""Ray Tune glue: the one module that imports Ray.

Every phase is a Ray Tune experiment stored under the study's folder, so a killed driver can
`Tuner.restore` it. Its name carries the study id (`workers.runner.experiment_name`): Tune stages a driver's
experiment files in `<Ray session>/artifacts/<start time, to the second>/<experiment name>/`, so two
studies whose phases start in the same second under one phase name would share (and restore) each
other's trials. `tune` searches with OptunaSearch (TPE) and ASHA; `transfer`, `verify` and
`validate` run a fixed list of planned trials (`studies.plan`) as a grid. Trials report to Tune at
every evaluation; `MlflowTrials`, a callback in the driver process, writes their nested runs. `RayRunner` is
this module as the driver's `workers.runner.Runner`; planned trials travel in Tune's config as
`PlannedTrial.as_dict()`.

Faults: every evaluation's report carries a checkpoint (`workers.train`'s resumable state), and a trial whose
worker dies is restarted from it up to `resources.max_retries` times (Tune's `FailureConfig`) before it is
recorded `failed`. A restarted or restored trial logs only the steps its MLflow run does not have yet, so
its history holds each step once. Why a trial diverged or failed is a tag on its run and the table's `message`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's console boxes; the CLI draws its own progress

import pandas as pd  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from ray import tune  # noqa: E402
from ray.tune.result import AUTO_RESULT_KEYS  # noqa: E402
from ray.tune.schedulers import ASHAScheduler  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from analysis.table import TrialStatus  # noqa: E402
from studies.members import auto_members, batches  # noqa: E402
from studies.phases.tune import asha_rungs  # noqa: E402
from studies.plan import PlannedTrial  # noqa: E402
from studies.spec import StudySpec  # noqa: E402
from workers.errors import InfrastructureLost, Interrupted, StudyFailed  # noqa: E402
from workers.models import family  # noqa: E402
from workers.runner import (  # noqa: E402
    GROUP_MULT,
    RUN_PARAM,
    PhaseJob,
    TrialRecorder,
    batch_tag,
    gpu_memory,
    optuna_space,
    trial_frame,
    trial_row,
)
from workers.train import TrialConfig, train_trial  # noqa: E402

if TYPE_CHECKING:
    from workers.tracker import RunTracker

log = logging.getLogger(__name__)
OBJECTIVE = "objective"  # eval loss; the loss ceiling (train.max_loss) for a diverged trial
STATE_FILE = "state.pt"  # a trial checkpoint: `workers.train`'s resumable state, torch.save'd
FINAL_KEYS = ("status", "eval_loss", "best_eval_loss", "steps", "tokens", "wall_time_s", "params", "message")


def ensure_ray() -> None:
    """Join `RAY_ADDRESS` when set (e.g. `auto` or `ray://head:10001`), else start a private local Ray."""
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or "local"
        if address == "local" and "RAY_AUTH_MODE" not in os.environ:
            # Ray turns token authentication on for a new local cluster and says so on the terminal unless
            # RAY_AUTH_MODE is set: the private Ray keeps that default, chosen here, so the terminal stays ptctl's
            os.environ["RAY_AUTH_MODE"] = "token"
            ray._raylet.Config.initialize("")  # type: ignore[attr-defined]  # Ray read the mode at import
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=False)
        except (ConnectionError, ray.exceptions.RayError) as exc:
            raise InfrastructureLost(f"cannot reach Ray at RAY_ADDRESS={address!r} ({exc}); start the cluster "
                                     "or unset RAY_ADDRESS for a local Ray, then re-run to resume") from exc


def has_gpus() -> bool:
    return ray.cluster_resources().get("GPU", 0) > 0


def check_gpus(phase: str, gpus: float, available: float) -> None:
    """A trial asking for more GPUs than the whole cluster has would wait forever: a `StudyFailed` naming the fix."""
    if gpus > available:
        field = "gpus_per_trial" if phase == "tune" else "transfer_gpus"
        raise StudyFailed(f"the {phase} phase's trials ask for {gpus:g} GPU each (resources.{field}) but the Ray "
                          f"cluster has {available:g}: add a node with GPUs (ray start --num-gpus=N) or set "
                          f"resources.{field} to 0")


# A phase whose Ray cluster has no node left that can run its trials ends `interrupted`, not never.
#
# Tune waits for resources forever: when every worker node of a cluster is lost, the trials that ran there fail,
# are restarted (`resources.max_retries`) and stay pending, and `Tuner.fit` never returns (Tune logs "No trial is
# running and no new trial has been started within the last 60 seconds" once a minute, from the cluster size it
# cached at the start). `NodeWatch`, a Tune callback of every phase (`run_phase`), checks the live
# nodes every few seconds: when none has had the CPUs and GPUs of one trial for `PTCTL_NO_NODE_S` seconds (default
# `NO_NODE_S`, 60), it raises `InfrastructureLost` naming the fix. Tune's experiment state (saved at every trial
# checkpoint) keeps the trials and their checkpoints, so re-running the same command once a node has joined
# restores the phase and the trials resume from their last checkpoint. `PTCTL_NO_NODE_S=0` waits forever (a
# cluster whose autoscaler adds nodes on demand).
NO_NODE_S = 60.0  # seconds a phase waits for a node that can run its trials (PTCTL_NO_NODE_S; 0: forever)
CHECK_EVERY_S = 2.0  # seconds between looks at the cluster's nodes (a GCS call each)


def no_node_wait_s() -> float:
    """`PTCTL_NO_NODE_S`, else `NO_NODE_S`; 0 (or less): wait forever."""
    text = os.environ.get("PTCTL_NO_NODE_S", "").strip()
    try:
        return float(text) if text else NO_NODE_S
    except ValueError:
        log.warning("PTCTL_NO_NODE_S=%r is not a number of seconds: using %g", text, NO_NODE_S)
        return NO_NODE_S


def fits(nodes: Iterable[dict[str, Any]], cpus: float, gpus: float) -> bool:
    """Whether a live node among `ray.nodes()` has (in all, busy or not) the CPUs and GPUs of one trial."""
    return any(n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= cpus
               and n.get("Resources", {}).get("GPU", 0) >= gpus for n in nodes)


class NodeWatch(tune.Callback):
    """Raise `InfrastructureLost` from Tune's loop once no live node has fitted one of the phase's trials (`cpus`,
    `gpus` each) for `wait_s` seconds (None: `no_node_wait_s()`; 0: never)."""

    def __init__(self, phase: str, cpus: float, gpus: float, wait_s: float | None = None, *,
                 every_s: float = CHECK_EVERY_S, nodes: Callable[[], list[dict[str, Any]]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.phase, self.cpus, self.gpus = phase, cpus, gpus
        self.wait_s = no_node_wait_s() if wait_s is None else wait_s
        self.every_s, self.nodes, self.clock = every_s, nodes, clock
        self.checked: float | None = None  # when the nodes were last looked at
        self.since: float | None = None  # since when no node fits

    def __getstate__(self) -> dict:  # Tune pickles callbacks with the experiment: no clock state, no function
        return {**self.__dict__, "nodes": None, "checked": None, "since": None}

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self.wait_s <= 0:
            return
        now = self.clock()
        if self.checked is not None and now - self.checked < self.every_s:
            return
        self.checked = now
        try:
            live = (self.nodes or ray.nodes)()
        except Exception as exc:  # the GCS itself unreachable: Ray's own handling ends the driver (InfrastructureLost)
            log.debug("cannot list the Ray nodes: %s", exc)
            return
        if fits(live, self.cpus, self.gpus):
            self.since = None
            return
        if self.since is None:
            self.since = now
            log.warning("the Ray cluster has no live node with %s: the %s phase waits up to %g s for one",
                        self.needs(), self.phase, self.wait_s)
        if now - self.since >= self.wait_s:
            raise InfrastructureLost(
                f"the Ray cluster has had no live node that can run the {self.phase} phase's trials ({self.needs()} "
                f"each) for {self.wait_s:g} s (PTCTL_NO_NODE_S): its worker nodes were lost or none has joined; start "
                f"one (ray start --address={self.head()}) and re-run the same command to resume")

    def needs(self) -> str:
        return f"{self.cpus:g} CPU" + (f" and {self.gpus:g} GPU" if self.gpus else "")

    @staticmethod
    def head() -> str:
        """The cluster's GCS address, for the fix's `ray start --address=...` (not connected: a placeholder, since
        `ray.get_runtime_context` would start a local Ray)."""
        address = None
        if ray.is_initialized():
            with contextlib.suppress(Exception):
                address = ray.get_runtime_context().gcs_address
        return address or "<head:port>"


def planned_trial(spec: StudySpec, phase: str, config: dict[str, Any], trial_id: str) -> PlannedTrial:
    """The trial behind a Tune config: a planned trial (grid phases, `PlannedTrial.as_dict`) or a TPE suggestion."""
    if "trial" in config:
        return PlannedTrial.from_dict(config["trial"])
    if phase != "tune":  # never a default tune trial in its place
        raise ValueError(f"a {phase} trial's Tune config holds no planned trial (got keys {sorted(config)}): the "
                         f"phase's experiment does not hold its plan; delete its folder under the study's ray/ and "
                         "re-run to resume")
    return PlannedTrial.for_tune(spec, trial_id, config)


class CheckpointClock:
    """Whether an evaluation should carry a checkpoint: retries are allowed and `every_s` seconds passed since the
    last one (or the trial's start); `every_s` = 0: every evaluation."""

    def __init__(self, max_retries: int, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled, self.every_s, self.clock = max_retries > 0, every_s, clock
        self.last = clock()

    def __call__(self) -> bool:
        now = self.clock()
        if not self.enabled or now - self.last < self.every_s:
            return False
        self.last = now
        return True


REPORT_EVERY_S = 10.0  # the longest a trial's evaluations wait to be reported (MLflow's live view lags this much)


class ReportClock:
    """Whether an evaluation at `step` is reported to Tune now, or kept for the next report.

    Tune's function trainables report synchronously: the training thread waits at every report until the driver
    has processed it (scheduler, searcher, callbacks) and asks for the next, so each report is a pause of one
    driver round trip. Evaluations are therefore reported in batches: at the first evaluation at or past each ASHA
    rung (`rungs`; its decisions see what they saw when every evaluation was reported), when `every_s` passed
    since the last report, and with the final result; the rows in between ride along (`BATCH_KEY`)."""

    def __init__(self, rungs: list[float], every_s: float = REPORT_EVERY_S, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.rungs, self.every_s, self.clock = sorted(rungs), every_s, clock
        self.last = clock()

    def __call__(self, step: int) -> bool:
        now, at_rung = self.clock(), bool(self.rungs) and step >= self.rungs[0]
        self.rungs = [r for r in self.rungs if r > step]
        if at_rung or now - self.last >= self.every_s:
            self.last = now
            return True
        return False


BATCH_KEY = "earlier_rows"  # a report's evaluations before its own, as JSON (Tune's loggers skip a string)


def _trainable(config: dict[str, Any], spec_dict: dict[str, Any], phase: str, cpus: float,
               finished: dict[str, dict[str, Any]] | None = None) -> None:
    """One Tune trial: train (from its last checkpoint when Tune restarts it), report each evaluation, then one final
    result with the status. An evaluation carries a checkpoint when retries are allowed and `checkpoint_every_s` of
    training passed since the last one: each checkpoint costs a save, a copy to storage and (with num_to_keep)
    Tune's snapshot of the whole experiment, so a short trial makes none and a long one one per interval."""
    entered = time.time()  # with `left`: the trainable's own span (the orchestration benchmark splits the overhead)
    record = (finished or {}).get(content_key(config))
    if record is not None:  # finished before its driver was lost: its results again, nothing trained
        for result in record["results"]:
            tune.report(result)
        return
    family(spec_dict["model"]["family"])  # a plugin's family missing on this node: named, with the fix
    spec = StudySpec.model_validate(spec_dict)
    if batch_of(config) is not None:
        return _batch_trainable(config, spec, cpus)
    trial = planned_trial(spec, phase, config, tune.get_context().get_trial_id())
    cfg = TrialConfig.model_validate(trial.trial_config(spec))
    torch.set_num_threads(max(1, int(cpus)))
    resume = _checkpointed_state()
    resumed = {"resumed_from": resume["step"]} if resume else {}
    resumed["node_id"] = ray.get_runtime_context().get_node_id()  # where it trains: a tag on its run
    due = CheckpointClock(spec.resources.max_retries, spec.resources.checkpoint_every_s)
    report_now = ReportClock(asha_rungs(spec) if phase == "tune" else [])
    kept: list[dict[str, Any]] = []  # evaluations since the last report

    def checkpoint(row: dict[str, Any], state: dict[str, Any]) -> None:
        if row["step"] >= cfg.steps:  # the last step comes with the final result
            return
        save = due()
        if not (report_now(row["step"]) or save):
            kept.append(dict(row))
            return
        result = {**row, **resumed, OBJECTIVE: row["eval_loss"], BATCH_KEY: json.dumps(kept)}
        kept.clear()
        if not save:
            tune.report(result)
            return
        with tempfile.TemporaryDirectory(prefix="ptctl-ckpt-") as folder:  # tune.report copies it to storage
            torch.save(state, Path(folder) / STATE_FILE)
            tune.report(result, checkpoint=tune.Checkpoint.from_directory(folder))

    result = train_trial(cfg, checkpoint=checkpoint, resume=resume)
    last = result.history[-1] if result.history else {"step": result.steps}
    final = {k: getattr(result, k) for k in FINAL_KEYS}
    final.update({f"{GROUP_MULT}{group}": mult for group, mult in result.lr_multipliers.items()})
    final.update({f"{RUN_PARAM}{name}": value for name, value in result.run_params.items()})
    objective = result.eval_loss if result.status == TrialStatus.COMPLETED else cfg.max_loss
    earlier = [r for r in kept if r["step"] < last["step"]]
    tune.report({**last, **final, **resumed, "step": result.steps, OBJECTIVE: objective, BATCH_KEY: json.dumps(earlier),
                 "trainable_entered": entered, "trainable_left": time.time()})


MEMBER_ROWS = "member_rows"  # a batch's report: each member's evaluations since the last report, as JSON
MEMBER_FINALS = "member_finals"  # a batch's final report: each member's final result, as JSON


def batch_of(config: dict[str, Any]) -> list[PlannedTrial] | None:
    """The members of a batched Tune trial (`{"trial": {"members": [...], "batch": tag}}`); None for one trial."""
    trial = config.get("trial")
    if not isinstance(trial, dict) or "members" not in trial:
        return None
    return [PlannedTrial.from_dict(m) for m in trial["members"]]


def _batch_trainable(config: dict[str, Any], spec: StudySpec, cpus: float) -> None:
    """One Tune trial that trains a batch's members as one batched model (`workers.batched.train_batch`): its
    reports carry each member's rows (`MEMBER_ROWS`), its checkpoints the whole batch's state, its final report
    each member's result (`MEMBER_FINALS`); `MlflowTrials` writes one run per member."""
    from workers.batched import train_batch

    members = batch_of(config) or []
    cfgs = [TrialConfig.model_validate(m.trial_config(spec)) for m in members]
    torch.set_num_threads(max(1, int(cpus)))
    resume = _checkpointed_state()
    where = {"resumed_from": resume["step"]} if resume else {}
    where["node_id"] = ray.get_runtime_context().get_node_id()
    due = CheckpointClock(spec.resources.max_retries, spec.resources.checkpoint_every_s)
    report_now = ReportClock([])
    kept: dict[str, list[dict[str, Any]]] = {m.trial_key: [] for m in members}

    def checkpoint(rows: dict[int, dict[str, Any]], state: dict[str, Any]) -> None:
        for i, row in rows.items():
            kept[members[i].trial_key].append(dict(row))
        step = state["step"]
        save = due()
        if not (report_now(step) or save):
            return
        losses = [r["eval_loss"] for r in rows.values()]
        result = {"step": step, **where, OBJECTIVE: min(losses, default=cfgs[0].max_loss),
                  MEMBER_ROWS: json.dumps(kept)}
        for rows_of in kept.values():
            rows_of.clear()
        if not save:
            tune.report(result)
            return
        with tempfile.TemporaryDirectory(prefix="ptctl-ckpt-") as folder:
            torch.save(state, Path(folder) / STATE_FILE)
            tune.report(result, checkpoint=tune.Checkpoint.from_directory(folder))

    def progress(i: int, row: dict[str, Any]) -> None:
        if "eval_loss" not in row:  # logged steps between evaluations ride with the next report
            kept[members[i].trial_key].append(dict(row))

    results = train_batch(cfgs, progress=progress, checkpoint=checkpoint, resume=resume)
    finals = {}
    for member, result in zip(members, results, strict=True):
        last = [r for r in result.history if r["step"] == result.steps]
        if last and last[-1] not in kept[member.trial_key]:
            kept[member.trial_key].append(last[-1])
        finals[member.trial_key] = {**{k: getattr(result, k) for k in FINAL_KEYS}, "status": str(result.status),
                                    **{f"{GROUP_MULT}{g}": v for g, v in result.lr_multipliers.items()},
                                    **{f"{RUN_PARAM}{n}": v for n, v in result.run_params.items()}}
    done = [f["eval_loss"] for f in finals.values() if f["status"] == TrialStatus.COMPLETED]
    tune.report({"step": max(r.steps for r in results), **where, OBJECTIVE: min(done, default=cfgs[0].max_loss),
                 MEMBER_ROWS: json.dumps(kept), MEMBER_FINALS: json.dumps(finals, default=str)})


def _checkpointed_state() -> dict[str, Any] | None:
    """The state of this trial's last checkpoint, if Tune restarts (retry) or restores (resume) it."""
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        return torch.load(Path(folder) / STATE_FILE, map_location="cpu", weights_only=True)


def failure_cause(text: str | None) -> str:
    """One line from an error's text: the last `SomethingError: ...` line of a traceback, else its first line."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    blocks = [i for i, line in enumerate(lines) if line.startswith("Failure # ")]  # Tune's error file
    lines = lines[blocks[-1] + 1:] if blocks else lines
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", line)]
    return (raised[-1] if raised else lines[0] if lines else "unknown error")[:500]


def _trial_error(trial) -> str:
    path = trial.error_file
    return failure_cause(Path(path).read_text(errors="replace") if path and Path(path).exists() else None)


TUNE_KEYS = frozenset({*AUTO_RESULT_KEYS, "trial_id", "done", "experiment_tag", "should_checkpoint", "date"})


def content_key(config: dict[str, Any]) -> str:
    """A Tune trial's identity by what it trains: its config (a planned trial, a batch, or TPE's suggestion)."""
    return json.dumps(config, sort_keys=True, default=str)


class FinishedTrials:
    """The driver's ledger of a phase's finished Tune trials (`<experiment>.finished.jsonl` in the study folder),
    appended and synced when a trial completes, before its run is written.

    Tune saves its experiment state every few seconds, not when a trial completes: a driver killed just after a
    trial finished restores an experiment that holds the trial as still running, or not at all (TPE then suggests
    its configuration again, under a new trial id). Read back on restore, the ledger makes such a trial report its
    recorded results again instead of training (`_trainable`), under its first trial id and number (`original`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, dict[str, Any]]:
        """content key → {"trial_id", "number", "results"} of each finished trial."""
        if not self.path.exists():
            return {}
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        records = []
        for line in lines:
            with contextlib.suppress(json.JSONDecodeError):  # a line cut by the kill itself
                records.append(json.loads(line))
        return {r["content"]: r for r in records}

    def add(self, config: dict[str, Any], trial_id: str, number: int | None, results: list[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"content": content_key(config), "trial_id": trial_id, "number": number, "results": results}
        with open(self.path, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())


class _TrialRef:
    """What the deferred writes need of a Tune trial, read when Tune hands it over (the trial object changes)."""

    def __init__(self, trial) -> None:
        self.trial_id, self.config = trial.trial_id, dict(trial.config)
        self.experiment_tag = getattr(trial, "experiment_tag", None)


def _trial_number(trial) -> int | None:
    """The trial's 1-based number in its experiment (Tune's experiment tag starts `7_lr=...`), if it has one."""
    head = str(getattr(trial, "experiment_tag", "") or "").split("_", 1)[0]
    return int(head) if head.isdigit() else None


class MlflowTrials(tune.Callback):
    """Nested MLflow runs for the trials of one phase, written from the driver (one SQLite writer).

    The writes run in order on one background thread, so Tune's loop does not wait on MLflow between trials (a
    trial's run, params, metrics and end were ≈ 10 % of a short tune phase's wall time when written inline);
    `flush` (at the experiment's end, and by `run_phase` whatever happens) waits for them and raises the first
    error. What a handler reads from a trial is read when Tune calls it; only the MLflow calls are deferred.
    """

    def __init__(self, spec: StudySpec, study_id: str, phase: str, phase_run: str, tracking_uri: str,
                 tags: dict[str, Any] | None = None, instance: str | None = None) -> None:
        self.spec_dict, self.study_id, self.phase, self.instance = spec.as_dict(), study_id, phase, instance
        self.phase_run, self.uri = phase_run, tracking_uri
        self.tags = dict(tags or {})  # on every trial run; a "phase" here overrides `phase` (compare's tunes)
        self._tracker: RunTracker | None = None  # the driver's MLflow tracker, made on first use
        self._recorder: TrialRecorder | None = None
        self._runs: dict[str, str] = {}
        self._logged: dict[str, int] = {}  # trial id → the last step its run holds (a restart logs only later ones)
        self._tagged: dict[tuple[str, str], Any] = {}  # (trial id, tag) → its value on the run (resumed, node)
        self._stepped = False  # on_step_begin has run: a restored experiment's finished trials are counted
        self.notify: Callable[[dict[str, Any]], None] | None = None  # told of each finished trial
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self.ledger: FinishedTrials | None = None  # set by `run_phase`
        self._finished: dict[str, dict[str, Any]] = {}  # the ledger as the phase (re)started
        self._reported: dict[str, list[dict[str, Any]]] = {}  # trial id → the results it reported so far

    def __getstate__(self) -> dict:  # Tune pickles callbacks with the experiment; clients stay behind
        return {**self.__dict__, "_tracker": None, "_recorder": None, "_runs": {}, "_logged": {}, "_tagged": {},
                "_stepped": False, "notify": None, "_writer": None, "_pending": [], "ledger": None, "_finished": {},
                "_reported": {}}

    def use_ledger(self, ledger: FinishedTrials) -> dict[str, dict[str, Any]]:
        """Record finished trials in `ledger`; what it held already (the trainables replay those)."""
        self.ledger, self._finished = ledger, ledger.read()
        return self._finished

    def original(self, trial) -> tuple[str, int | None]:
        """The trial id and number a finished trial first had (`FinishedTrials`), else the trial's own."""
        record = self._finished.get(content_key(trial.config))
        if record is None:
            return trial.trial_id, _trial_number(trial)
        return record["trial_id"], record["number"]

    def _later(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on the writer thread, after every write submitted before it."""
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-trials")
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        self._pending.append(self._writer.submit(fn, *args))

    def flush(self) -> None:
        """Wait for every deferred write; raise the first that failed."""
        pending, self._pending = self._pending, []
        errors = [e for f in pending if (e := f.exception()) is not None]  # exception() waits
        if errors:
            raise errors[0]

    def on_experiment_end(self, trials, **info) -> None:
        self.flush()

    @property
    def recorder(self) -> TrialRecorder:
        from workers.tracking import Tracker  # the driver's: trial actors import this module without MLflow

        if self._recorder is None:
            spec = StudySpec.model_validate(self.spec_dict)
            self._tracker = self._tracker or Tracker(spec.experiment_name(), self.uri)
            self._recorder = TrialRecorder(spec, self.study_id, self.phase, self.phase_run, self._tracker,
                                           self.instance, self.tags)
        return self._recorder

    def _run(self, trial, member: PlannedTrial | None = None) -> str:
        """The run of a Tune trial, or of one member of a batched Tune trial."""
        key = trial.trial_id if member is None else f"{trial.trial_id}:{member.trial_key}"
        if key not in self._runs:
            recorder = self.recorder
            if member is None:
                trial_id, number = self.original(trial)
                planned = planned_trial(recorder.spec, self.phase, trial.config, trial_id)
                run = recorder.start(planned, number, ray_trial_id=trial_id)
            else:
                members = batch_of(trial.config) or []
                tag = batch_tag(trial.config["trial"]["batch"], len(members))
                run = recorder.start(member, None, ray_trial_id=trial.trial_id, batch=tag)
            self._logged[key] = recorder.tracker.last_step(run, "train_loss")
            self._runs[key] = run
        return self._runs[key]

    def _runs_of(self, trial) -> list[tuple[str, PlannedTrial | None]]:
        """(run key, member) of each run a Tune trial writes: itself, or each member of its batch."""
        members = batch_of(trial.config)
        if members is None:
            return [(trial.trial_id, None)]
        return [(f"{trial.trial_id}:{m.trial_key}", m) for m in members]

    def on_step_begin(self, iteration, trials, **info) -> None:
        """Once: a restored experiment's trials that had finished before count as done (progress bars), and each
        gets its finished run: the interrupted driver may have died with those writes still queued."""
        if self._stepped:
            return
        self._stepped = True
        for trial in trials:
            if trial.status == "TERMINATED":
                last = dict(trial.last_result or {})
                if "step" in last:  # the run finds the steps it already holds and logs only later ones
                    self._later(self._result, _TrialRef(trial), last)
                for member, status, final in self._finals(trial, last):
                    self._later(self._finish, _TrialRef(trial), status, final, "FINISHED", {}, member)
                    if self.notify is not None:
                        self.notify({"phase": self.phase, "trial_id": member.trial_key if member else trial.trial_id,
                                     "status": status, "eval_loss": final.get("eval_loss"), "restored": True})

    def _finals(self, trial, last: dict[str, Any]) -> list[tuple[PlannedTrial | None, str, dict[str, Any]]]:
        """(member, status, final result) of each run of a finished Tune trial (a batch: each member's)."""
        members = batch_of(trial.config)
        if members is None:
            return [(None, last.get("status", TrialStatus.STOPPED), last)]
        finals = json.loads(last.get(MEMBER_FINALS) or "{}")
        return [(m, finals.get(m.trial_key, {}).get("status", TrialStatus.STOPPED), finals.get(m.trial_key, {}))
                for m in members]

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        for _, member in self._runs_of(trial):
            self._later(self._run, _TrialRef(trial), member)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self._reported.setdefault(trial.trial_id, []).append({k: v for k, v in result.items() if k not in TUNE_KEYS})
        self._later(self._result, _TrialRef(trial), dict(result))

    def _result(self, trial: _TrialRef, result: dict[str, Any]) -> None:
        members = json.loads(result.get(MEMBER_ROWS) or "null")
        for key, member in self._runs_of(trial):
            run = self._run(trial, member)
            where = {"resumed_from_step": result.get("resumed_from"), "node_id": result.get("node_id")}
            changed = {k: v for k, v in where.items() if v and self._tagged.get((key, k)) != v}
            if changed:  # a restarted trial: the checkpoint it resumed from and the node it runs on now
                self.recorder.tracker.set_tags(run, changed)
                self._tagged.update({(key, k): v for k, v in changed.items()})
            reported = [*json.loads(result.get(BATCH_KEY) or "[]"), result] if member is None else \
                (members or {}).get(member.trial_key, [])
            rows: list[dict[str, Any]] = []  # a restart's repeats of steps the run has are dropped
            for each in reported:
                if each["step"] > max(self._logged.get(key, 0), rows[-1]["step"] if rows else 0):
                    rows.append(each)
            if rows:
                self.recorder.log_steps(run, rows)
                self._logged[key] = rows[-1]["step"]

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        """The trial's worker failed and Tune restarts it (from its last checkpoint): the run stays `running`."""
        tags = {"retries": trial.num_failures, "last_failure": _trial_error(trial)}
        for _, member in self._runs_of(trial):
            self._later(lambda ref, m: self.recorder.tracker.set_tags(self._run(ref, m), tags), _TrialRef(trial),
                        member)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        if self.ledger is not None:  # durable before anything else: a finished trial never trains again
            trial_id, number = self.original(trial)
            self.ledger.add(trial.config, trial_id, number, self._reported.pop(trial.trial_id, []))
        for member, status, final in self._finals(trial, dict(trial.last_result or {})):  # no status: ASHA stopped
            self._end(trial, status, final, "FINISHED", {}, member)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        """Retries used up (or none allowed): the trial is failed (each member of a batch), with the cause of its
        last failure."""
        why = {"failure": _trial_error(trial), "retries": trial.num_failures}
        for _, member in self._runs_of(trial):
            self._end(trial, TrialStatus.FAILED, {}, "FAILED", why, member)

    def _finish(self, trial: _TrialRef, status: str, last: dict[str, Any], run_status: str,
                tags: dict[str, Any], member: PlannedTrial | None = None) -> None:
        """How far the trial trained (an early-stopped trial's budget used), its per-group lr multipliers and its
        end."""
        mults = {k.removeprefix(GROUP_MULT): v for k, v in last.items() if k.startswith(GROUP_MULT)}
        model = {k.removeprefix(RUN_PARAM): v for k, v in last.items() if k.startswith(RUN_PARAM)}
        steps = last.get("step", last.get("steps"))
        self.recorder.finish(self._run(trial, member), status, last.get("message"), steps=steps,
                             lr_multipliers=mults, run_status=run_status, tags=tags, run_params=model)

    def _end(self, trial, status: str, last: dict[str, Any], run_status: str, tags: dict[str, Any],
             member: PlannedTrial | None = None) -> None:
        self._later(self._finish, _TrialRef(trial), status, last, run_status, tags, member)
        if self.notify is not None:
            self.notify({"phase": self.phase, "trial_id": member.trial_key if member else trial.trial_id,
                         "status": status, "eval_loss": last.get("eval_loss")})


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
    res, total = spec.resources, ray.cluster_resources()
    gpus = _phase_gpus(spec, phase)
    slots = int(total.get("GPU", 0) // gpus) if gpus else int(total.get("CPU", 1) // res.cpus_per_trial)
    memory = worker_gpu_memory(gpus) if gpus and res.batch_members == "auto" else None
    k = auto_members(spec, planned, slots=max(slots, 1), memory_bytes=memory, gpu=gpus > 0)
    groups = batches(spec, planned, k)
    return [group[0].as_dict() if len(group) == 1 else
            {"members": [t.as_dict() for t in group], "batch": f"{i + 1}/{len(groups)}"}
            for i, group in enumerate(groups)]


GPU_PROBE_S = 120.0  # seconds the GPU nodes have to report their device's memory (`worker_gpu_memory`)


@ray.remote(num_cpus=0)
def _device_memory() -> int | None:
    """`gpu_memory` of the CUDA device this Ray worker was given."""
    return gpu_memory()


def worker_gpu_memory(gpus: float) -> float | None:
    """The device memory one trial of `gpus` GPUs holds, on the cluster's smallest GPU: each live GPU node is asked
    by a task pinned there that holds a trial's share of a GPU (min(gpus, 1): a batch trains on one device, and a
    fraction of a GPU holds that fraction of its memory). None: no node reported within `GPU_PROBE_S` (batches are
    then sized by the trial slots alone)."""
    share = min(gpus, 1.0)
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) >= share]
    refs = [_device_memory.options(num_gpus=share, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
            .remote() for node in nodes]
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=GPU_PROBE_S) if refs else ([], [])
    for ref in pending:
        ray.cancel(ref, force=True)
    sizes = []
    for ref in ready:
        with contextlib.suppress(ray.exceptions.RayError):
            sizes.append(ray.get(ref))
    known = [size for size in sizes if size]
    if len(known) < len(nodes):
        log.warning("%d of %d GPU nodes did not report their device memory: batches sized from %s", len(nodes) -
                    len(known), len(nodes), "the others" if known else "the trial slots alone")
    return min(known) * share if known else None


def _phase_gpus(spec: StudySpec, phase: str) -> float:
    """GPUs per trial of `phase`: tune's `gpus_per_trial`, the others' `transfer_gpus` (None: 1 if any GPU)."""
    res = spec.resources
    if phase == "tune":
        return res.gpus_per_trial
    return res.transfer_gpus if res.transfer_gpus is not None else (1.0 if has_gpus() else 0.0)


def study_trainable(spec: StudySpec, phase: str, experiment: str, gpus: float,
                    finished: dict[str, dict[str, Any]] | None = None) -> Callable[..., Any]:
    """`_trainable` with this study's spec and phase, registered with Ray Tune under a name of its own.

    Tune registers a trainable in a registry shared by the whole Ray job, under the function's name, and the
    service's drivers are detached actors of one job: under the shared name `_trainable`, concurrent studies
    replaced each other's registration, so a trial could start with another study's spec, or fail with
    `OwnerDiedError` once that study's driver had exited. `experiment` (`experiment_name`: study id and phase)
    names it instead; a restore registers the same name again."""
    res = spec.resources
    trainable = tune.with_resources(
        tune.with_parameters(_trainable, spec_dict=spec.as_dict(), phase=phase, cpus=res.cpus_per_trial,
                             finished=finished or {}),
        {"cpu": res.cpus_per_trial, "gpu": gpus})
    trainable._name = f"ptctl.{experiment}"  # type: ignore[attr-defined]  # Tune's registry name (`_name` first)
    return trainable


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
    check_gpus(phase, gpus, ray.cluster_resources().get("GPU", 0))
    finished = callback.use_ledger(FinishedTrials(storage / f"{experiment}.finished.jsonl"))
    trainable = study_trainable(spec, phase, experiment, gpus, finished)
    path = f"{root}/{experiment}"
    faults: dict[str, Any] = {
        "callbacks": [callback, NodeWatch(phase, res.cpus_per_trial, gpus)],  # no node for the trials: interrupted
        "failure_config": tune.FailureConfig(max_failures=res.max_retries),
        "checkpoint_config": tune.CheckpointConfig(num_to_keep=1)}  # the latest one is all a restart needs
    try:
        if tune.Tuner.can_restore(path):
            log.info("restoring the %s phase from %s", phase, path)
            # the plan again: a driver killed before Tune's first state save leaves only `tuner.pkl`, which keeps no
            # param_space, and Tune then restarts the experiment from the param_space given here
            tuner = tune.Tuner.restore(str(path), trainable, param_space=_param_space(planned), resume_unfinished=True,
                                       resume_errored=True)
            _renew(tuner, faults)
        else:
            tuner = tune.Tuner(trainable, param_space=_param_space(planned), tune_config=_tune_config(spec, phase),
                               run_config=tune.RunConfig(name=experiment, storage_path=root, verbose=0,
                                                         log_to_file=True, **faults))
        try:
            with tune_log(storage / f"{experiment}.log"):
                grid = tuner.fit()
        except BaseException:
            with contextlib.suppress(Exception):  # what the runs could still record; the fit's error is the cause
                callback.flush()
            raise
        callback.flush()  # the trials' runs are complete before the caller reads or prunes them
    except (ray.exceptions.RaySystemError, ray.exceptions.ActorDiedError, ray.exceptions.NodeDiedError,
            ray.exceptions.RpcError) as exc:
        raise InfrastructureLost(f"Ray failed during the {phase} phase ({type(exc).__name__}: {exc}); "
                                 "re-run to resume it") from exc
    check_all_ran(phase, grid, spec.tune.num_trials if planned is None else len(planned))
    return trial_table(spec, phase, grid, {k: r["trial_id"] for k, r in finished.items()})


# Tune's loggers, the TensorBoard writer under it, and the warnings shown meanwhile (`py.warnings`, as
# `logging.captureWarnings` names them)
CHATTER = ("ray.tune", "ray.train", "ray.air", "tensorboardX", "py.warnings")


def _log_warning(message, category, filename, lineno, file=None, line=None) -> None:  # warnings.showwarning's
    logging.getLogger("py.warnings").warning(warnings.formatwarning(message, category, filename, lineno, line).rstrip())


@contextlib.contextmanager
def tune_log(path: Path):
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


def check_all_ran(phase: str, grid, expected: int) -> None:
    """Raise `Interrupted` when Tune returned before every trial ran: on SIGINT it stops and returns the trials it
    has (fewer than planned; one that never started has no config); its saved state resumes the rest."""
    ran = sum(result.config is not None for result in grid)
    if ran < expected:
        raise Interrupted(f"the {phase} phase stopped with {ran} of its {expected} trials run "
                          "(interrupted): re-run the same command to resume it")


def _renew(tuner: tune.Tuner, faults: dict[str, Any]) -> None:
    """A restored Tuner runs with the RunConfig pickled at its start: its callback lost the driver's `notify`
    (the progress bar) and its retry and checkpoint settings may be older. Put this run's in (the Tuner runs in
    this process unless Ray Client is used, where the pickled ones stay)."""
    local = getattr(tuner, "_local_tuner", None)
    if local is None:
        log.warning("restored Tuner runs remotely (Ray Client): keeping its pickled callbacks and failure settings")
        return
    run_config = local.get_run_config()
    for key, value in faults.items():
        setattr(run_config, key, value)


def _param_space(planned: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {} if planned is None else {"trial": tune.grid_search(planned)}


def _tune_config(spec: StudySpec, phase: str) -> tune.TuneConfig:
    if phase != "tune":  # trial actors are reused: no process start, torch import or data load per trial
        return tune.TuneConfig(metric=OBJECTIVE, mode="min", reuse_actors=True)
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
                           num_samples=t.num_trials, max_concurrent_trials=t.max_concurrent, reuse_actors=True)


def trial_table(spec: StudySpec, phase: str, grid, originals: dict[str, str] | None = None) -> pd.DataFrame:
    """The tidy trial table (see `analysis`) of a finished Tune experiment, one row per trial; a trial that replayed
    a finished one (`FinishedTrials`) under a new id gets the id it first had (`originals`: content key → id)."""
    rows = []
    for result in grid:
        m = result.metrics or {}
        members = batch_of(result.config)
        if members is not None:
            rows += _member_rows(spec, result, members)
            continue
        trial_id = (originals or {}).get(content_key(result.config)) or m.get("trial_id") or Path(result.path).name
        planned = planned_trial(spec, phase, result.config, trial_id)
        status = m.get("status") or (TrialStatus.FAILED if result.error else TrialStatus.STOPPED)
        message = failure_cause(str(result.error)) if result.error else m.get("message") or ""
        rows.append(trial_row(spec, planned, status, {**m, "wall_time_s": m.get("wall_time_s", m.get("time_total_s"))},
                              message))
    return trial_frame(list({row["trial_id"]: row for row in rows}.values()))  # a replayed trial once


def _member_rows(spec: StudySpec, result, members: list[PlannedTrial]) -> list[dict[str, Any]]:
    """The table rows of a batched Tune trial's members: each one's final result, or `failed` with the batch's
    error."""
    finals = json.loads((result.metrics or {}).get(MEMBER_FINALS) or "{}")
    tag = batch_tag(result.config["trial"]["batch"], len(members))
    rows = []
    for member in members:
        final = finals.get(member.trial_key)
        if final is None:
            message = failure_cause(str(result.error)) if result.error else "the batch ended without its result"
            rows.append(trial_row(spec, member, TrialStatus.FAILED, {}, message, batch=tag))
        else:
            rows.append(trial_row(spec, member, final["status"], {**final, "step": final["steps"]},
                                  final.get("message") or "", batch=tag))
    return rows
