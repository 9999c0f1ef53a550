"""`MlflowTrials`: the Tune callback, in the driver process, that writes a phase's trials as nested MLflow runs.

Trials report to Tune at every evaluation. A restarted or restored trial logs only the steps its MLflow run does
not have yet, so its history holds each step once. Why a trial diverged or failed is a tag on its run and the
table's `message`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import tune
from ray.tune.experiment import Trial
from ray.tune.result import AUTO_RESULT_KEYS

from analysis.table import TrialStatus
from studies.plan import PlannedTrial
from studies.spec import StudySpec
from workers.ray.ledger import FinishedTrials, content_key
from workers.ray.trainable import LAST, REPORTS, batch_of, final_reports, planned_trial
from workers.report import Row, TrialReport, load_reports
from workers.runner import TrialRecorder, batch_tag

if TYPE_CHECKING:
    from workers.tracker import RunTracker


def failure_cause(text: str | None) -> str:
    """One line from an error's text: the last `SomethingError: ...` line of a traceback, else its first line."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    blocks = [i for i, line in enumerate(lines) if line.startswith("Failure # ")]  # Tune's error file
    lines = lines[blocks[-1] + 1:] if blocks else lines
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", line)]
    return (raised[-1] if raised else lines[0] if lines else "unknown error")[:500]


def _trial_error(trial: Trial) -> str:
    path = trial.error_file
    return failure_cause(Path(path).read_text(errors="replace") if path and Path(path).exists() else None)


TUNE_KEYS = frozenset({*AUTO_RESULT_KEYS, "trial_id", "done", "experiment_tag", "should_checkpoint", "date"})


class _TrialRef:
    """What the deferred writes need of a Tune trial, read when Tune hands it over (the trial object changes)."""

    def __init__(self, trial: Trial) -> None:
        self.trial_id, self.config = trial.trial_id, dict(trial.config)
        self.experiment_tag = getattr(trial, "experiment_tag", None)


def _trial_number(trial: Trial | _TrialRef) -> int | None:
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
        self._pending: list[Future[Any]] = []
        self.ledger: FinishedTrials | None = None  # set by `run_phase`
        self._finished: dict[str, dict[str, Any]] = {}  # the ledger as the phase (re)started
        self._reported: dict[str, list[dict[str, Any]]] = {}  # trial id → the results it reported so far
        self._ledgered: set[str] = set()  # trial ids in the ledger

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles callbacks with the experiment; clients stay behind
        return {**self.__dict__, "_tracker": None, "_recorder": None, "_runs": {}, "_logged": {}, "_tagged": {},
                "_stepped": False, "notify": None, "_writer": None, "_pending": [], "ledger": None, "_finished": {},
                "_reported": {}, "_ledgered": set()}

    def use_ledger(self, ledger: FinishedTrials) -> dict[str, dict[str, Any]]:
        """Record finished trials in `ledger`; what it held already (the trainables replay those)."""
        self.ledger, self._finished = ledger, ledger.read()
        return self._finished

    def original(self, trial: Trial | _TrialRef) -> tuple[str, int | None]:
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

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.flush()

    @property
    def recorder(self) -> TrialRecorder:
        from workers.mlflow_tracker import Tracker  # the driver's: trial actors import this module without MLflow

        if self._recorder is None:
            spec = StudySpec.model_validate(self.spec_dict)
            self._tracker = self._tracker or Tracker(spec.experiment_name(), self.uri)
            self._recorder = TrialRecorder(spec, self.study_id, self.phase, self.phase_run, self._tracker,
                                           self.instance, self.tags)
        return self._recorder

    def _run(self, trial: Trial | _TrialRef, member: PlannedTrial | None = None) -> str:
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

    def _runs_of(self, trial: Trial | _TrialRef) -> list[tuple[str, PlannedTrial | None]]:
        """(run key, member) of each run a Tune trial writes: itself, or each member of its batch."""
        members = batch_of(trial.config)
        if members is None:
            return [(trial.trial_id, None)]
        return [(f"{trial.trial_id}:{m.trial_key}", m) for m in members]

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
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
                self._end(trial, final_reports(last, len(self._runs_of(trial))), restored=True)

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        for _, member in self._runs_of(trial):
            self._later(self._run, _TrialRef(trial), member)

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any],
                        **info: Any) -> None:
        self._reported.setdefault(trial.trial_id, []).append({k: v for k, v in result.items() if k not in TUNE_KEYS})
        if LAST in result:  # in the ledger before Tune's loggers (callbacks after this one) write the result
            self._ledger(trial)
        self._later(self._result, _TrialRef(trial), dict(result))

    def _ledger(self, trial: Trial) -> None:
        """Durable before anything else records the trial finished: a finished trial never trains again."""
        if self.ledger is not None and trial.trial_id not in self._ledgered:
            trial_id, number = self.original(trial)
            self.ledger.add(trial.config, trial_id, number, self._reported.get(trial.trial_id, []))
            self._ledgered.add(trial.trial_id)

    def _result(self, trial: _TrialRef, result: dict[str, Any]) -> None:
        for (key, member), report in zip(self._runs_of(trial), load_reports(result.get(REPORTS)), strict=False):
            run = self._run(trial, member)
            where = {"resumed_from_step": result.get("resumed_from"), "node_id": result.get("node_id"),
                     "log": result.get("log")}  # the trial's log file (`trainable.trial_log`)
            changed = {k: v for k, v in where.items() if v and self._tagged.get((key, k)) != v}
            if changed:  # a restarted trial: the checkpoint it resumed from and the node it runs on now
                self.recorder.tracker.set_tags(run, changed)
                self._tagged.update({(key, k): v for k, v in changed.items()})
            rows: list[Row] = []  # a restart's repeats of steps the run has are dropped
            for each in report.rows:
                if each["step"] > max(self._logged.get(key, 0), rows[-1]["step"] if rows else 0):
                    rows.append(each)
            if rows:
                self.recorder.log_steps(run, rows)
                self._logged[key] = int(rows[-1]["step"])

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """The trial's worker failed and Tune restarts it (from its last checkpoint): the run stays `running`."""
        tags = {"retries": trial.num_failures, "last_failure": _trial_error(trial)}
        for _, member in self._runs_of(trial):
            self._later(lambda ref, m: self.recorder.tracker.set_tags(self._run(ref, m), tags), _TrialRef(trial),
                        member)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._ledger(trial)  # already there unless its last report came without LAST
        self._reported.pop(trial.trial_id, None)
        self._end(trial, final_reports(dict(trial.last_result or {}), len(self._runs_of(trial))))

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Retries used up (or none allowed): the trial is failed (each member of a batch), with the cause of its
        last failure."""
        why = {"failure": _trial_error(trial), "retries": trial.num_failures}
        failed = TrialReport(status=TrialStatus.FAILED)
        self._end(trial, [failed] * len(self._runs_of(trial)), "FAILED", why)

    def _end(self, trial: Trial, reports: list[TrialReport], run_status: str = "FINISHED",
             tags: dict[str, Any] | None = None, restored: bool = False) -> None:
        """Finish each run of a Tune trial with its report (how far it trained, its lr multipliers, its end)."""
        ref = _TrialRef(trial)
        for (_, member), report in zip(self._runs_of(trial), reports, strict=True):
            self._later(lambda m, r: self.recorder.finish(self._run(ref, m), r, run_status=run_status, tags=tags),
                        member, report)
            if self.notify is not None:
                loss = report.eval_loss if math.isfinite(report.eval_loss) else None
                self.notify({"phase": self.phase, "trial_id": member.trial_key if member else trial.trial_id,
                             "status": str(report.status), "eval_loss": loss,
                             **({"restored": True} if restored else {})})
