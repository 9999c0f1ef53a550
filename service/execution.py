"""Study execution on Ray: one detached, named driver actor per study. The service never trains.

`StudyDriverActor` (name `ptctl-driver-<study id>`, namespace `ptctl`, detached, no CPUs): `.run(spec, study_id,
database_url, attempt)` runs `workers.driver.run_study`; `.ordered(timeout)` says whether `run` has begun. The Tune
trials are actors it owns, so `ray.kill(driver)` takes them down too; being detached, the driver outlives the API,
which finds it again by name. The actor writes its own status to the store, every write fenced by its attempt, and
exits without training when its attempt is no longer the study's current one (docs/control-plane.md).

Ray is the `RAY_ADDRESS` cluster (token auth as the cluster is set up) or the embedded head of `ray_head.py`. The
driver gets `PTCTL_DATA_DIR` and `MLFLOW_TRACKING_URI` through its runtime_env, which its Tune trials inherit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, cast

from service import ray_head
from service.control import DriverRunning, ExecutionUnavailable
from service.settings import Settings
from workers.ray import actors, keep_loopback

log = logging.getLogger(__name__)
NAMESPACE = "ptctl"
LAUNCH_S = 120.0  # how long a submit or resume waits for its driver actor to begin (start-up included)
STOP_S = 30.0  # how long a cancel waits for its killed driver's process to end


def actor_name(study_id: str) -> str:
    return f"ptctl-driver-{study_id}"


@actors.actor_class
class StudyDriverActor:
    """Runs one study to its end in a Ray worker process, reporting to the store. `ordered` answers on a
    thread of its own while `run` trains."""

    def __init__(self) -> None:
        self._ordered = threading.Event()

    @actors.control_method
    def ordered(self, timeout: float) -> bool:
        """Whether `run` has begun, waiting up to `timeout` s: a live driver that never began is idle."""
        return self._ordered.wait(timeout)

    def run(self, spec: dict[str, Any], study_id: str, database_url: str, attempt: int) -> str:
        self._ordered.set()
        from service.policy import public_error
        from service.store import IllegalTransition, Store
        from studies.spec import StudySpec
        from studies.status import StudyStatus
        from workers.driver import run_study

        store = Store(database_url)
        if not store.begin(study_id, attempt):  # cancelled or resumed again before this driver ran
            log.warning("study %s is no longer running under attempt %d: not starting", study_id, attempt)
            actors.exit_actor()

        def on_event(kind: str, data: dict[str, Any]) -> None:
            if kind == "phase_start":
                store.set_phase(study_id, data["phase"], data["trials"], attempt=attempt)

        try:
            run_study(StudySpec.model_validate(spec), study_id, on_event)
            outcome, error = StudyStatus.SUCCEEDED, None
        except Exception as exc:  # the study failed (or lost its infrastructure), not the actor: record why
            log.exception("study %s did not succeed", study_id)
            outcome = StudyStatus(getattr(exc, "status", StudyStatus.FAILED))  # workers.errors.StudyError's
            error = public_error(exc)  # no text a remote server sent
        try:
            store.transition(study_id, outcome, error=error, expect=[StudyStatus.RUNNING], attempt=attempt)
        except IllegalTransition as exc:  # cancelled meanwhile: the cancel stands
            log.warning("not recording %s: %s", outcome, exc)
        actors.exit_actor()
        return outcome  # not reached: exit_actor raises


def running_driver(pid: int) -> bool:
    """Whether `pid` is a live study driver's process on this machine (Ray titles it `ray::StudyDriverActor…`;
    a zombie has no command line)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::StudyDriverActor")
    except OSError:
        return False


class RayExecutor:
    """Starts, finds and kills study drivers; connects to Ray lazily (thread-safe)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.RLock()
        self._failing_since: float | None = None
        self._dropping: threading.Thread | None = None
        self._lost: str | None = None  # a loss not yet reported by `lost()`

    def connect(self) -> None:
        """Connect once. A connection to an embedded head that has died is dropped first (a Ray call to a
        dead head blocks, and Ray ends the whole process 60 s after losing its head); while it is being
        dropped (`ray.shutdown` can take as long), `ExecutionUnavailable` says to retry."""
        with self._lock:
            if self._dropping is not None and self._dropping.is_alive():
                raise ExecutionUnavailable("the connection to a lost Ray head is being dropped: retry in a minute")
            if actors.connected():
                if self.settings.ray_address is not None or ray_head.running(self.settings.data_dir):
                    return
                self._drop("the embedded Ray head stopped")
                raise ExecutionUnavailable("the embedded Ray head stopped: retry in a minute (a new one starts)")
            address = self.settings.ray_address
            if address is None:
                head = ray_head.ensure(self.settings.data_dir, self.settings.ray_num_cpus, self.settings.ray_host)
                ray_head.use_token(head.token_path)
                if ray_head.head_host(head) == ray_head.LOOPBACK:
                    keep_loopback()  # else Ray would dial the machine's address, where a loopback head does not listen
                address = head.address
            actors.join(address, NAMESPACE, reread_auth=self.settings.ray_address is None)  # the head's token
            log.info("connected to Ray at %s", address)

    def _handle(self, study_id: str) -> Any:  # an actor handle or None (ActorHandle types its methods as Never)
        return actors.find(actor_name(study_id), NAMESPACE)

    def alive(self, study_id: str) -> bool:
        self.connect()
        return self._handle(study_id) is not None

    def start(self, study_id: str) -> Any:
        """Create the study's (idle) driver actor; `launch` sets it running. Raises `DriverRunning`."""
        self.connect()
        env = {"PTCTL_DATA_DIR": str(self.settings.data_dir), "MLFLOW_TRACKING_URI": self.settings.tracking_uri,
               **{k: os.environ[k] for k in ("PTCTL_ARTIFACT_ROOT", "PTCTL_STORAGE", "PTCTL_NO_NODE_S")
                  if os.environ.get(k)}}
        for _ in range(20):  # a just-killed actor may hold its name for a moment
            try:  # on this node: the driver writes the study folder the API reads
                return actors.start(StudyDriverActor, actor_name(study_id), NAMESPACE, env)
            except ValueError:
                if self._handle(study_id) is not None:
                    raise DriverRunning(f"study {study_id} already has a running driver: cancel it first") from None
                time.sleep(0.5)
        raise DriverRunning(f"the driver name of study {study_id} is still taken; retry in a few seconds")

    def launch(self, handle: Any, spec: dict[str, Any], study_id: str, attempt: int) -> None:
        """Tell the driver to run and return once it has begun: an order still queued in this process when it
        exits (a SIGTERM right after a submit's answer) would be lost, leaving an idle driver."""
        handle.run.remote(spec, study_id, self.settings.db_url, attempt)
        if not self._ordered(handle, LAUNCH_S):
            raise TimeoutError(f"the driver did not begin within {LAUNCH_S:.0f} s")

    def idle(self, study_id: str) -> bool:
        """Whether the study's driver is alive but never began (the API stopped between its two steps)."""
        handle = self._handle(study_id)
        return handle is not None and not self._ordered(handle, 5.0)

    @staticmethod
    def _ordered(handle: Any, timeout: float) -> bool:
        # gone: it began and has already exited (its study moved on)
        return cast(bool, actors.answer(handle.ordered.remote(timeout), timeout + 60, if_gone=True))

    def stop(self, study_id: str) -> bool:
        """Kill the study's driver (and so its Tune trials) and return once its process has ended; False if it had
        none. `ray.kill` only asks: until the process ends, its MLflow writer can still open or write runs, after a
        cancel has closed them. A driver not started yet never will be; one this process cannot see (in a container
        of its own) is not waited for."""
        self.connect()
        handle = self._handle(study_id)
        if handle is None:
            return False
        pid = self._driver_pid(handle)
        actors.kill(handle)
        deadline = time.monotonic() + STOP_S
        while pid is not None and running_driver(pid):
            if time.monotonic() > deadline:
                log.error("the killed driver of %s (pid %d) still runs after %.0f s", study_id, pid, STOP_S)
                break
            time.sleep(0.05)
        return True

    def release(self) -> list[str]:
        """Remove the placement groups dead drivers left holding CPUs (`workers.ray.actors`); returns their ids."""
        self.connect()
        return actors.release_dead_actors_groups(NAMESPACE, actor_name(""))

    @staticmethod
    def _driver_pid(handle: Any) -> int | None:
        """The pid of the driver's process if it has started on this node (None: the kill is asked all the same)."""
        return actors.pid_here(handle)

    def lost(self) -> str | None:
        """Why Ray went away, taking every driver with it, once per loss (None while it is there). The embedded
        head is judged by its processes, without a Ray call (a call to a dead head blocks); a cluster by
        `ray.nodes()`, failing for longer than `PTCTL_RAY_LOST_S`. A lost connection is dropped, so the next
        `connect` starts (embedded) or joins (cluster) afresh; a loss `connect` noticed first is told here."""
        with self._lock:
            dropping = self._dropping is not None and self._dropping.is_alive()
            if actors.connected() and not dropping:
                if self.settings.ray_address is None:
                    reason = None if ray_head.running(self.settings.data_dir) else "the embedded Ray head stopped"
                else:
                    reason = self._cluster_unreachable()
                if reason is not None:
                    self._drop(reason)
            reason, self._lost = self._lost, None
            return reason

    def _drop(self, reason: str) -> None:
        """`ray.shutdown()` in the background (with the head gone it can wait out Ray's 60-s GCS timeout);
        `reason` waits for `lost()`."""
        log.error("%s: dropping the connection; studies that were running are interrupted", reason)
        self._lost = reason
        self._dropping = threading.Thread(target=actors.shutdown, name="ptctl-ray-drop", daemon=True)
        self._dropping.start()

    def _cluster_unreachable(self) -> str | None:
        try:
            actors.node_count()
            self._failing_since = None
            return None
        except Exception as exc:
            now = time.monotonic()
            self._failing_since = self._failing_since or now
            if now - self._failing_since < self.settings.ray_lost_s:
                return None
            return f"the Ray cluster at {self.settings.ray_address} has been unreachable for " \
                   f"{now - self._failing_since:.0f} s ({type(exc).__name__})"

    def check(self) -> str:
        """A one-line readiness detail; raises if Ray is unreachable."""
        self.connect()
        cpus = actors.cpu_count()
        return f"{actors.node_count()} node(s), {cpus:g} CPUs"
