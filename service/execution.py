"""Study execution on Ray: one detached, named driver actor per study. The service never trains.

    StudyDriverActor.options(name="ptctl-driver-<study id>", namespace="ptctl", lifetime="detached",
                             num_cpus=0).remote()  →  .run(spec, study_id, database_url)

`run` calls `workers.driver.run_study` in the actor process; the Tune trials it spawns are actors
owned by it, so `ray.kill(driver)` takes them down too (checked by the cancel test). Being detached,
the driver outlives the API process: a restarted API finds it again by name (`alive`).

Status reporting: the actor writes to the study store itself (same SQLAlchemy URL, handed to `run`):
the current phase and its planned trial count at each phase start, `succeeded` at the end, `failed`
with the error (type and message) if the driver raises. The API writes `running`, `cancelled` and
`interrupted` (a study whose driver actor is gone; see `reconcile`). Status changes are conditional
updates (`store.py`), so a cancel racing the driver's last write ends in exactly one of the two.

Where Ray runs: with `RAY_ADDRESS` the API joins that cluster (token auth as the cluster is set up:
`RAY_AUTH_TOKEN` or `RAY_AUTH_TOKEN_PATH`); without it, it starts or reuses the embedded head of
`ray_head.py`. The driver gets `PTCTL_DATA_DIR` and `MLFLOW_TRACKING_URI` through its runtime_env,
which its Tune trials inherit; on a cluster the data directory must be shared storage mounted at the
same path on the API and every Ray node (docker-compose.yml mounts one volume at /data).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import ray

from service import ray_head
from service.control import DriverRunning
from service.settings import Settings

log = logging.getLogger(__name__)
NAMESPACE = "ptctl"


def actor_name(study_id: str) -> str:
    return f"ptctl-driver-{study_id}"


@ray.remote(num_cpus=0, max_restarts=0)
class StudyDriverActor:
    """Runs one study to its end in a Ray worker process, reporting to the store."""

    def run(self, spec: dict[str, Any], study_id: str, database_url: str) -> str:
        from service.policy import public_error
        from service.store import IllegalTransition, Store
        from studies.spec import StudySpec
        from workers.driver import run_study

        store = Store(database_url)

        def on_event(kind: str, data: dict[str, Any]) -> None:
            if kind == "phase_start":
                store.set_phase(study_id, data["phase"], data["trials"])

        try:
            run_study(StudySpec.model_validate(spec), study_id, on_event)
            outcome, error = "succeeded", None
        except Exception as exc:  # the study failed, not the actor: record why, then exit
            log.exception("study %s failed", study_id)
            outcome, error = "failed", public_error(exc)  # no text a remote server sent
        try:
            store.transition(study_id, outcome, error=error)
        except IllegalTransition as exc:  # cancelled meanwhile: the cancel stands
            log.warning("not recording %s: %s", outcome, exc)
        ray.actor.exit_actor()
        return outcome  # not reached: exit_actor raises


class RayExecutor:
    """Starts, finds and kills study drivers; connects to Ray lazily (thread-safe)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()

    def connect(self) -> None:
        with self._lock:
            if ray.is_initialized():
                return
            address = self.settings.ray_address
            if address is None:
                head = ray_head.ensure(self.settings.data_dir, self.settings.ray_num_cpus)
                ray_head.use_token(head.token_path)
                # Ray reads RAY_AUTH_MODE when it is imported; re-read it (as Ray's own _enable_token_auth does)
                ray._raylet.Config.initialize("")
                address = head.address
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING,
                     configure_logging=False)
            log.info("connected to Ray at %s", address)

    def _handle(self, study_id: str):
        try:
            return ray.get_actor(actor_name(study_id), namespace=NAMESPACE)
        except ValueError:  # no live actor of that name
            return None

    def alive(self, study_id: str) -> bool:
        self.connect()
        return self._handle(study_id) is not None

    def start(self, study_id: str):
        """Create the study's (idle) driver actor; `launch` sets it running. Raises `DriverRunning`."""
        self.connect()
        env = {"PTCTL_DATA_DIR": str(self.settings.data_dir), "MLFLOW_TRACKING_URI": self.settings.tracking_uri}
        options = dict(name=actor_name(study_id), namespace=NAMESPACE, lifetime="detached",
                       runtime_env={"env_vars": env})
        for _ in range(20):  # a just-killed actor may hold its name for a moment
            try:
                return StudyDriverActor.options(**options).remote()
            except ValueError:
                if self._handle(study_id) is not None:
                    raise DriverRunning(f"study {study_id} already has a running driver: cancel it first") from None
                time.sleep(0.5)
        raise DriverRunning(f"the driver name of study {study_id} is still taken; retry in a few seconds")

    def launch(self, handle, spec: dict[str, Any], study_id: str) -> None:
        handle.run.remote(spec, study_id, self.settings.db_url)

    def stop(self, study_id: str) -> bool:
        """Kill the study's driver (and so its Tune trials); False if it had none."""
        self.connect()
        handle = self._handle(study_id)
        if handle is None:
            return False
        ray.kill(handle, no_restart=True)
        return True

    def check(self) -> str:
        """A one-line readiness detail; raises if Ray is unreachable."""
        self.connect()
        cpus = ray.cluster_resources().get("CPU", 0)
        return f"{len(ray.nodes())} node(s), {cpus:g} CPUs"
