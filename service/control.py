"""The control plane's verbs, independent of HTTP: submit, cancel, resume, reconcile.

Ordering keeps the store and Ray consistent whichever step fails:
- submit/resume: create the named driver actor (idle) → store `running` → tell the actor to run.
  The reconciler only judges `running` studies, and those always have an actor by then; if the
  store refuses `running` (a concurrent cancel or resume won), the new actor is killed.
- cancel: store `cancelled` first (it decides races with the driver's own last write), then kill
  the driver (its Tune trials die with it), then close the MLflow runs it left open.
- reconcile (API start-up, then every `PTCTL_RECONCILE_S`): a `running` study without a live
  driver actor becomes `interrupted` (resumable); at start-up a `pending` study older than a minute
  (the API died between storing and starting it) becomes `failed` (resumable too).
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import threading
from pathlib import Path
from typing import Any, Protocol

from service.progress import MlflowView, read_state
from service.store import RESUMABLE, IllegalTransition, Store, Study
from studies.spec import StudySpec

log = logging.getLogger(__name__)
LOST = "its driver is gone (Ray restarted or the actor died): POST /studies/{id}/resume continues it"


class Executor(Protocol):
    """What `Control` needs from an execution backend (`execution.RayExecutor`)."""

    def connect(self) -> None: ...
    def alive(self, study_id: str) -> bool: ...
    def start(self, study_id: str) -> Any: ...
    def launch(self, handle: Any, spec: dict[str, Any], study_id: str) -> None: ...
    def stop(self, study_id: str) -> bool: ...
    def check(self) -> str: ...


class DriverRunning(Exception):
    """A driver actor for this study is still alive (HTTP 409)."""


class ExecutionUnavailable(Exception):
    """Ray could not be reached to start a driver (HTTP 503)."""


class Control:
    def __init__(self, store: Store, executor: Executor, mlflow: MlflowView, data_dir: Path) -> None:
        self.store, self.executor, self.mlflow = store, executor, mlflow
        self.studies = data_dir / "studies"  # the driver's study folders (workers/driver.py)

    def submit(self, spec: StudySpec, idempotency_key: str | None = None) -> tuple[Study, bool]:
        """Store and start a study; with a known key, the earlier study (not started twice)."""
        study_id = f"{spec.name}-{secrets.token_hex(4)}"
        study, created = self.store.create(study_id, spec.as_dict(), spec.content_hash(), idempotency_key)
        if created:
            self._start(study)
        return self.store.get(study.id), created

    def resume(self, study_id: str) -> Study:
        study = self.store.get(study_id)
        if study.status not in RESUMABLE:
            raise IllegalTransition(study_id, study.status, "running")
        self._start(study)
        return self.store.get(study_id)

    def _start(self, study: Study) -> None:
        try:
            handle = self.executor.start(study.id)
        except DriverRunning:
            raise
        except Exception as exc:
            log.exception("could not start the driver of %s", study.id)
            message = f"could not start the study's driver on Ray ({type(exc).__name__}: {exc})"
            if study.status == "pending":
                self.store.transition(study.id, "failed", error=message)
            raise ExecutionUnavailable(f"{message}; check GET /readyz, then POST /studies/{study.id}/resume") from exc
        try:
            self.store.transition(study.id, "running")
        except IllegalTransition:
            self.executor.stop(study.id)
            raise
        self.executor.launch(handle, study.spec, study.id)

    def cancel(self, study_id: str) -> Study:
        study = self.store.transition(study_id, "cancelled", error="cancelled by request")
        try:
            self.executor.stop(study_id)
        except Exception:  # the status stands; a driver that survived is reported by the reconciler's logs
            log.exception("could not stop the driver of %s", study_id)
        try:
            if "study" in read_state(self.studies / study_id).get("runs", {}):  # else MLflow has nothing yet
                self.mlflow.mark_cancelled(study.spec, study_id)
        except Exception:
            log.warning("could not close the MLflow runs of %s", study_id, exc_info=True)
        return study

    def reconcile(self, startup: bool = False) -> list[str]:
        """Mark studies whose driver is gone; returns their ids."""
        lost = []
        for study_id in self.store.ids_with_status("running"):
            if not self.executor.alive(study_id):
                try:
                    self.store.transition(study_id, "interrupted", error=LOST.format(id=study_id))
                    lost.append(study_id)
                except IllegalTransition:  # it finished while we looked
                    pass
        if startup:
            cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
            stale, _ = self.store.list(status="pending", limit=1000)
            for study in stale:
                if study.created_at < cutoff and not self.executor.alive(study.id):
                    self.store.transition(study.id, "failed", error="the API stopped before starting its driver: "
                                          f"POST /studies/{study.id}/resume starts it")
                    lost.append(study.id)
        if lost:
            log.warning("studies without a driver: %s", ", ".join(lost))
        return lost


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
