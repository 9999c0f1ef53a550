"""The control plane's verbs, independent of HTTP: submit, cancel, resume, reconcile.

The order of each verb keeps the store and Ray consistent whichever step fails (the states: `studies/status.py`):
- submit/resume: create the driver actor idle → store `running`, only from the status this request saw → launch
  it under the new attempt, answering once it has begun. If the store refuses (a concurrent cancel or resume won),
  the new actor is killed. A retry with the same `Idempotency-Key` finishes a submit whose driver never began.
- cancel: store `cancelled` first (it decides races with the driver's last write), then kill the driver and its
  trials, then close the MLflow runs it left open.
- reconcile (start-up, then every `PTCTL_RECONCILE_S`): a `running` study without a live driver becomes
  `interrupted`; the first pass that reaches Ray also starts the studies an earlier API process left before their
  driver began. The whole protocol: docs/control-plane.md.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import threading
from contextlib import suppress
from pathlib import Path
from typing import Any, Protocol

from service.progress import MlflowView
from service.store import IllegalTransition, Store, Study
from studies.spec import StudySpec
from studies.status import RESUMABLE, StudyStatus
from workers.folder import StudyFolder

log = logging.getLogger(__name__)
LOST = "its driver is gone (Ray restarted or the actor died): POST /studies/{id}/resume continues it"
NEVER_BEGAN = "the API stopped before its driver began"


class Executor(Protocol):
    """What `Control` needs from an execution backend (`execution.RayExecutor`)."""

    def connect(self) -> None: ...
    def alive(self, study_id: str) -> bool: ...
    def start(self, study_id: str) -> Any: ...
    def launch(self, handle: Any, spec: dict[str, Any], study_id: str, attempt: int) -> None: ...
    def idle(self, study_id: str) -> bool: ...
    def stop(self, study_id: str) -> bool: ...
    def lost(self) -> str | None: ...
    def release(self) -> list[str]: ...
    def check(self) -> str: ...


class DriverRunning(Exception):
    """A driver actor for this study is still alive (HTTP 409)."""


class ExecutionUnavailable(Exception):
    """Ray could not be reached to start a driver (HTTP 503)."""


class Control:
    def __init__(self, store: Store, executor: Executor, mlflow: MlflowView, data_dir: Path) -> None:
        self.store, self.executor, self.mlflow = store, executor, mlflow
        self.data_dir = data_dir  # the driver's study folders are under it (workers.folder.StudyFolder)
        self.since = dt.datetime.now(dt.UTC)  # studies written before were left by an earlier API process
        self._recovered = False  # the start-up pass has run
        self._lock = threading.Lock()
        self._starting: set[str] = set()  # studies whose unfinished start this process is finishing

    def submit(self, spec: StudySpec, idempotency_key: str | None = None) -> tuple[Study, bool]:
        """Store and start a study; with a known key, the earlier study, started if its driver never began."""
        study_id = f"{spec.name}-{secrets.token_hex(4)}"
        study, created = self.store.create(study_id, spec.as_dict(), spec.content_hash(), idempotency_key)
        if created:
            with suppress(IllegalTransition, DriverRunning):  # cancelled, or a retry is starting it: that stands
                self._start(study)
        elif self._unfinished(study):
            with suppress(IllegalTransition, DriverRunning):  # moved on meanwhile: answer it as it is now
                self._finish_start(study)
        return self.store.get(study.id), created

    def _unfinished(self, study: Study) -> bool:
        """Whether `study`'s submit never completed: no driver of it ever began, it was not cancelled, and it is
        not a submit this process is still carrying out (pending or running since before this process began)."""
        if study.began or study.status in (StudyStatus.CANCELLED, StudyStatus.SUCCEEDED):
            return False
        return study.status not in (StudyStatus.PENDING, StudyStatus.RUNNING) or study.updated_at < self.since

    def _finish_start(self, study: Study) -> bool:
        """Start a study whose driver never began (`_unfinished`), replacing any idle driver actor; False when
        another request of this process is already at it, or its driver began after all."""
        with self._lock:
            if study.id in self._starting:
                return False
            self._starting.add(study.id)
        try:
            if study.status == StudyStatus.RUNNING:
                if self.executor.alive(study.id) and not self.executor.idle(study.id):
                    return False  # its driver has its order: it runs
                self.executor.stop(study.id)
                study = self.store.transition(study.id, StudyStatus.INTERRUPTED, error=NEVER_BEGAN,
                                              expect=[StudyStatus.RUNNING], attempt=study.attempts)
            elif study.status == StudyStatus.PENDING:
                self.executor.stop(study.id)  # an idle driver actor the API that stored it had made
            log.warning("starting %s (%s), whose driver never began", study.id, study.status)
            self._start(study)
            return True
        finally:
            with self._lock:
                self._starting.discard(study.id)

    def resume(self, study_id: str) -> Study:
        study = self.store.get(study_id)
        if study.status not in RESUMABLE:
            raise IllegalTransition(study_id, study.status, StudyStatus.RUNNING, RESUMABLE)
        self._start(study)
        return self.store.get(study_id)

    def _start(self, study: Study) -> None:
        """Create the driver, move `study.status` → running (only from the status read), launch it. A start that
        failed because the study moved on meanwhile (a cancel's kill of the driver being created or launched) raises
        `IllegalTransition`: the study stands as it is now."""
        try:
            handle = self.executor.start(study.id)
        except DriverRunning:
            raise
        except Exception as exc:
            log.exception("could not start the driver of %s", study.id)
            message = f"could not start the study's driver on Ray ({type(exc).__name__}: {exc})"
            if study.status == StudyStatus.PENDING:  # IllegalTransition: cancelled meanwhile
                self.store.transition(study.id, StudyStatus.FAILED, error=message, expect=[StudyStatus.PENDING])
            raise ExecutionUnavailable(f"{message}; check GET /readyz, then POST /studies/{study.id}/resume") from exc
        try:
            running = self.store.transition(study.id, StudyStatus.RUNNING, expect=[study.status])
        except IllegalTransition:
            self.executor.stop(study.id)
            raise
        try:
            self.executor.launch(handle, study.spec, study.id, running.attempts)
        except Exception as exc:
            log.exception("the driver of %s did not begin", study.id)
            self.executor.stop(study.id)
            message = f"the study's driver did not begin on Ray ({type(exc).__name__}: {exc})"
            self.store.transition(study.id, StudyStatus.INTERRUPTED, error=f"{message}: resume it",
                                  expect=[StudyStatus.RUNNING], attempt=running.attempts)  # or cancelled meanwhile
            raise ExecutionUnavailable(f"{message}; check GET /readyz, then POST /studies/{study.id}/resume") from exc

    def cancel(self, study_id: str) -> Study:
        study = self.store.transition(study_id, StudyStatus.CANCELLED, error="cancelled by request")
        try:
            self.executor.stop(study_id)
        except Exception:  # the status stands; a driver that survived is reported by the reconciler's logs
            log.exception("could not stop the driver of %s", study_id)
        try:
            state = StudyFolder(study_id, self.data_dir).read_state()
            if state is not None and "study" in state.runs:  # else MLflow has nothing yet
                self.mlflow.mark_cancelled(study.spec, study_id, state.instance)
        except Exception:
            log.warning("could not close the MLflow runs of %s", study_id, exc_info=True)
        return study

    def reconcile(self, startup: bool = False) -> list[str]:
        """Mark studies whose driver is gone (every running one when Ray itself is gone), free what dead drivers
        left holding (`Executor.release`), and in the first pass that reaches Ray start those an earlier API process
        left before their driver began; returns the ids of the studies marked or started."""
        lost: list[str] = []
        gone = self.executor.lost()
        for study_id in self.store.ids_with_status(StudyStatus.RUNNING):
            error = None
            if gone:
                error = f"{gone}: POST /studies/{study_id}/resume continues it on a new one"
            elif not self.executor.alive(study_id):
                error = LOST.format(id=study_id)
            if error is not None:
                try:
                    self.store.transition(study_id, StudyStatus.INTERRUPTED, error=error)
                    lost.append(study_id)
                except IllegalTransition:  # it finished while we looked
                    pass
        if lost:
            log.warning("studies without a driver: %s", ", ".join(lost))
        if (startup or not self._recovered) and not gone:
            lost += self._start_left_studies()
            self._recovered = True
        if not gone:
            self._release()
        return lost

    def _release(self) -> None:
        """Remove what dead drivers left holding; a failure is logged and tried again next pass."""
        try:
            released = self.executor.release()
        except Exception:
            log.warning("could not look for placement groups left by dead drivers", exc_info=True)
            return
        if released:
            log.warning("removed %d placement group(s) that dead drivers left holding CPUs: %s", len(released),
                        ", ".join(released))

    def _start_left_studies(self) -> list[str]:
        """Start the `pending` studies, and the `running` ones with an idle driver, that an earlier API left."""
        left = [s for status in (StudyStatus.PENDING, StudyStatus.RUNNING)
                for s in self.store.list(status=status, limit=10_000)[0] if s.updated_at < self.since and not s.began]
        started = []
        for study in left:
            try:
                if self._finish_start(study):
                    started.append(study.id)
            except (IllegalTransition, DriverRunning):  # moved on meanwhile
                pass
            except Exception:  # ExecutionUnavailable: it is failed or interrupted, and its retry or resume starts it
                log.exception("could not start %s, left by an earlier API process", study.id)
                started.append(study.id)
        return started


class Reconciler(threading.Thread):
    """Runs `Control.reconcile` every `interval` seconds until `stop()`."""

    def __init__(self, control: Control, interval: float) -> None:
        super().__init__(name="ptctl-reconciler", daemon=True)
        self.control, self.interval, self._stop = control, interval, threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.control.reconcile()
            except Exception:  # Ray or the store briefly unreachable: try again next round
                log.warning("reconcile failed", exc_info=True)

    def stop(self) -> None:
        self._stop.set()
