"""The placement groups of dead actors that Ray keeps: found and removed (loads Ray alone).

Ray removes the placement groups an actor created when it dies, but not a group whose creation reaches Ray just
after the actor's death was recorded: a `ray.kill` of a study's driver at the moment Tune asks for its trials' groups
leaves groups that hold their CPUs for as long as the cluster lives, and every later trial waits for them. No public
Ray API names a group's creator; the GCS tables are read the way `ray._private.state` reads them (Ray is pinned).
"""

from __future__ import annotations

import ray
from ray._private import state
from ray.core.generated import gcs_pb2
from ray.util.placement_group import PlacementGroup, remove_placement_group

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
