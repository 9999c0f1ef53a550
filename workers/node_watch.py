"""A phase whose Ray cluster has no node left that can run its trials ends `interrupted`, not never.

Tune waits for resources forever: when every worker node of a cluster is lost, the trials that ran there fail,
are restarted (`resources.max_retries`) and stay pending, and `Tuner.fit` never returns (Tune logs "No trial is
running and no new trial has been started within the last 60 seconds" once a minute, from the cluster size it
cached at the start). `NodeWatch`, a Tune callback of every phase (`workers.ray_runner.run_phase`), checks the live
nodes every few seconds: when none has had the CPUs and GPUs of one trial for `PTCTL_NO_NODE_S` seconds (default
`NO_NODE_S`, 60), it raises `InfrastructureLost` naming the fix. Tune's experiment state (saved at every trial
checkpoint) keeps the trials and their checkpoints, so re-running the same command once a node has joined
restores the phase and the trials resume from their last checkpoint. `PTCTL_NO_NODE_S=0` waits forever (a
cluster whose autoscaler adds nodes on demand).

Part of the Ray Tune glue (`workers.ray_runner`); imports Ray.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import ray
from ray import tune

from workers.errors import InfrastructureLost

log = logging.getLogger(__name__)
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
        """The cluster's GCS address, for the fix's `ray start --address=...`."""
        try:
            return ray.get_runtime_context().gcs_address or "<head:port>"
        except Exception:
            return "<head:port>"
