"""Ray itself: joining or starting it (`ensure_ray`), the cluster's GPUs and their memory, and `NodeWatch`, which
ends a phase that no live node can run."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import ray
from ray import tune
from ray.tune.experiment import Trial
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from studies.spec import StudySpec
from workers.errors import InfrastructureLost, StudyFailed
from workers.ray import keep_loopback
from workers.runner import gpu_memory

log = logging.getLogger(__name__)


def ensure_ray() -> None:
    """Join `RAY_ADDRESS` when set (e.g. `auto` or `ray://head:10001`), else start a private local Ray."""
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or "local"
        if address == "local" and "RAY_AUTH_MODE" not in os.environ:
            # Ray turns token authentication on for a new local cluster and says so on the terminal unless
            # RAY_AUTH_MODE is set: the private Ray keeps that default, chosen here, so the terminal stays ptctl's
            os.environ["RAY_AUTH_MODE"] = "token"
            ray._raylet.Config.initialize("")  # type: ignore[attr-defined]  # Ray read the mode at import
        if address == "local":
            keep_loopback()  # the private Ray serves this process alone: on loopback, like the embedded head
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=False)
        except (ConnectionError, ray.exceptions.RayError) as exc:
            raise InfrastructureLost(f"cannot reach Ray at RAY_ADDRESS={address!r} ({exc}); start the cluster "
                                     "or unset RAY_ADDRESS for a local Ray, then re-run to resume") from exc


def resources() -> dict[str, float]:
    """The cluster's resources in all (Ray's `cluster_resources`, untyped in Ray 2.60)."""
    return ray.cluster_resources()  # type: ignore[no-untyped-call,no-any-return]


def ray_memory(found: dict[str, float]) -> float | None:
    """The memory Ray counts in `found` (its resources, a node's or the cluster's): the heap and the object store."""
    total = found.get("memory", 0) + found.get("object_store_memory", 0)
    return float(total) if total > 0 else None


def has_gpus() -> bool:
    return resources().get("GPU", 0) > 0


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

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles callbacks with the experiment: no clock state, no function
        return {**self.__dict__, "nodes": None, "checked": None, "since": None}

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
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
    live: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    nodes = [n["NodeID"] for n in live if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) >= share]
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
