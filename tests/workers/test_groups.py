"""A dead study driver's placement groups are removed (`workers.ray.actors`), and nobody else's.

Seen on a loaded machine: a cancel's `ray.kill` reached a driver just as Tune asked for two trial groups; Ray recorded
the death, then created the groups, and kept them. They held both CPUs of the service's Ray head, and every study
submitted after waited for a trial slot for as long as the head lived. That ordering cannot be forced from outside
Ray; the same end state is: a dead actor's groups that Ray keeps, made here by actors that are not detached (Ray
keeps their groups while their job lives). In a private Ray in a child process."""

from __future__ import annotations

import pytest

from tests.workers.test_gpu_batches import child_json

# a child's lines that make an actor named `name` in the namespace ptctl that makes a placement group of one CPU,
# and kill it (`made`), and wait for an event (`until`)
MAKER = """
import json, time
import workers.ray  # Ray's environment first
import ray
from ray.util.placement_group import placement_group, placement_group_table

@ray.remote(num_cpus=0)
class Maker:
    def make(self):
        group = placement_group([{"CPU": 1}])
        ray.get(group.ready())
        return group.id.hex()

def until(predicate, timeout=120):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)

def made(name, kill):
    maker = Maker.options(name=name, namespace="ptctl").remote()
    group = ray.get(maker.make.remote())
    if kill:
        ray.kill(maker, no_restart=True)
        until(lambda: ray._private.state.state.actor_table(maker._actor_id.hex())["State"] == "DEAD")
    return group, maker
"""
CHILD = MAKER + """
from workers.ray.actors import release_dead_actors_groups

ray.init(num_cpus=3, namespace="ptctl", include_dashboard=False, log_to_driver=False)
groups = {"dead driver": made("ptctl-driver-gone", True), "dead stranger": made("someone-else", True),
          "live driver": made("ptctl-driver-live", False)}
states = lambda: {k: placement_group_table()[g]["state"] for k, (g, _) in groups.items()}
before = states()
released = release_dead_actors_groups("ptctl", "ptctl-driver-")
until(lambda: states()["dead driver"] == "REMOVED" and ray.available_resources().get("CPU") == 1)
print(json.dumps({"ids": {k: g for k, (g, _) in groups.items()}, "before": before, "released": released,
                  "after": states(), "again": release_dead_actors_groups("ptctl", "ptctl-driver-")}))
"""


@pytest.mark.slow  # a private Ray in a child process: ≈ 10 s
def test_a_dead_drivers_placement_groups_are_released_and_no_one_elses(tmp_path):
    out = child_json(CHILD, tmp_path)
    assert set(out["before"].values()) == {"CREATED"}  # Ray keeps the dead actors' groups, holding 2 of the 3 CPUs
    assert out["released"] == [out["ids"]["dead driver"]]
    assert out["after"] == {"dead driver": "REMOVED", "dead stranger": "CREATED", "live driver": "CREATED"}
    assert out["again"] == []  # the released group's CPU came back (the child waits for it); the others' stay held
