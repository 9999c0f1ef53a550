"""The service's study drivers as Ray actors: every Ray call the service makes (it imports no Ray), and the
placement groups dead actors leave that Ray keeps, found and removed (loads Ray alone).

A driver class is made an actor class by `actor_class` (no CPUs, never restarted, its `control_method`s answering on
a thread of their own); `start` creates one detached and named on this node, `find` finds it again by name, `answer`
waits for a call's answer, `kill` and `pid_here` end it. `join` connects this process to Ray; `connected`,
`shutdown`, `node_count` and `cpu_count` are Ray's own calls.

Placement groups: Ray removes the placement groups an actor created when it dies, but not a group whose creation
reaches Ray just after the actor's death was recorded: a `ray.kill` of a study's driver at the moment Tune asks for
its trials' groups leaves groups that hold their CPUs for as long as the cluster lives, and every later trial waits
for them. No public Ray API names a group's creator; the GCS tables are read the way `ray._private.state` reads
them (Ray is pinned).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

import ray
from ray._private import ray_constants, state
from ray.core.generated import gcs_pb2
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

if TYPE_CHECKING:
    from ray.actor import ActorClass

log = logging.getLogger(__name__)
CONTROL = "control"  # the concurrency group of an actor's `control_method`s: one thread beside its other calls
C = TypeVar("C")
F = TypeVar("F", bound=Callable[..., Any])


def actor_class(cls: type[C]) -> type[C]:
    """`cls` as a Ray actor class: no CPUs, never restarted, its `control_method`s on a thread of their own."""
    # Ray's overloads of `ray.remote` omit some actor options (concurrency_groups), hence the ignore
    remote = ray.remote(num_cpus=0, max_restarts=0, concurrency_groups={CONTROL: 1})  # type: ignore[call-overload]
    return cast("type[C]", remote(cls))  # mypy keeps the class's own type (a decorated class's, as before)


def control_method(method: F) -> F:
    """A method of an `actor_class` that answers while its other calls run (the `CONTROL` group)."""
    return cast(F, ray.method(concurrency_group=CONTROL)(method))


def exit_actor() -> None:
    """End the actor this runs in (raises, in an actor)."""
    ray.actor.exit_actor()  # type: ignore[no-untyped-call]  # Ray leaves it unannotated


@contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """`ray.init` in the main thread replaces the SIGTERM handler with `sys.exit`, which would raise inside a
    server's loop (uvicorn's: a traceback instead of a graceful stop): put the caller's handlers back. (Ray's C++
    failure handler, which would take SIGTERM from any thread, is off: RAY_DISABLE_FAILURE_SIGNAL_HANDLER.)"""
    main = threading.current_thread() is threading.main_thread()
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def join(address: str, namespace: str, reread_auth: bool) -> None:
    """Connect this process to the Ray at `address`, keeping its signal handlers and quiet (no worker logs, Ray's
    warnings only). `reread_auth`: Ray reads RAY_AUTH_MODE when it is imported; re-read it (as Ray's own
    _enable_token_auth does) after the caller has set it."""
    if reread_auth:
        ray._raylet.Config.initialize("")  # type: ignore[attr-defined]  # compiled; not in _raylet.pyi
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # Ray's C++ handler would take SIGTERM
    with _keep_signal_handlers():
        ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=False)


def connected() -> bool:
    return ray.is_initialized()


def shutdown() -> None:
    ray.shutdown()


def node_count() -> int:
    """The cluster's nodes (raises when Ray is unreachable)."""
    return len(ray.nodes())  # type: ignore[no-untyped-call]  # as cluster_resources: unannotated in Ray


def cpu_count() -> float:
    return float(ray.cluster_resources().get("CPU", 0))  # type: ignore[no-untyped-call]


def find(name: str, namespace: str) -> Any:  # an actor handle or None (ActorHandle types its methods as Never)
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:  # no live actor of that name
        return None


def start(cls: type, name: str, namespace: str, env: dict[str, str]) -> Any:
    """A detached actor of the `actor_class` `cls`, named `name`, on this node (it writes the files this process
    reads, and other nodes need not share its disk), `env` in its runtime_env; raises `ValueError` when an actor
    holds the name (a just-killed one may, for a moment)."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    options = dict(name=name, namespace=namespace, lifetime="detached", runtime_env={"env_vars": env},
                   scheduling_strategy=here)
    return cast("ActorClass[Any]", cls).options(**options).remote()


def answer(call: Any, timeout: float, if_gone: Any) -> Any:
    """The answer to `call` (an actor method's `.remote(...)`), waiting up to `timeout` s; `if_gone` when the
    actor has exited."""
    try:
        return ray.get(call, timeout=timeout)
    except ray.exceptions.RayActorError:
        return if_gone


def kill(handle: Any) -> None:
    """Ask Ray to kill the actor, never restarting it (its process ends a moment later)."""
    ray.kill(handle, no_restart=True)


def pid_here(handle: Any) -> int | None:
    """The pid of the actor's process if it has started on this node (Ray's actor table; no public API gives an
    actor's pid without the dashboard, which the embedded head does not run)."""
    try:
        info = state.state.actor_table(handle._actor_id.hex())
    except Exception:  # no pid: the caller goes on without it
        log.warning("could not read the driver's pid from Ray", exc_info=True)
        return None
    here = ray.get_runtime_context().get_node_id()
    return (info.get("Pid") or None) if info.get("Address", {}).get("NodeID") == here else None


# generated protobuf classes, which Ray's type stubs do not declare
GroupTable = gcs_pb2.PlacementGroupTableData  # type: ignore[attr-defined]
ActorTable = gcs_pb2.ActorTableData  # type: ignore[attr-defined]


def release_dead_actors_groups(namespace: str, name_prefix: str) -> list[str]:
    """Remove every live placement group whose creator is a dead actor of `namespace` named `name_prefix…`;
    returns their ids (hex). Groups of live actors, of other actors and of drivers (jobs) are left alone."""
    tables = state.state._connect_and_get_accessor()
    dead: dict[bytes, bool] = {}  # creator actor id → one of the dead actors meant
    released = []
    for raw in tables.get_placement_group_table():
        group = GroupTable.FromString(raw)
        if group.state == GroupTable.REMOVED or group.is_detached or not group.creator_actor_id:
            continue
        creator = group.creator_actor_id
        if creator not in dead:
            info = tables.get_actor_info(ray.ActorID(creator))
            actor = ActorTable.FromString(info) if info is not None else None
            dead[creator] = actor is not None and actor.state == ActorTable.DEAD \
                and actor.ray_namespace == namespace and actor.name.startswith(name_prefix)
        if dead[creator]:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(group.placement_group_id)))
            released.append(group.placement_group_id.hex())
    return released
