"""NodeWatch without Ray: a phase with no live node that fits its trials ends `InfrastructureLost` after the wait,
and a node that (re)joins in time resets it. (With real nodes: tests/service/test_cluster.py.)"""

import pytest
import ray

from workers.errors import InfrastructureLost
from workers.ray.cluster import NO_NODE_S, NodeWatch, fits, no_node_wait_s

HEAD = {"Alive": True, "Resources": {"node:__internal_head__": 1.0}}  # a head with no CPUs for trials
WORKER = {"Alive": True, "Resources": {"CPU": 1.0}}
GPU_WORKER = {"Alive": True, "Resources": {"CPU": 4.0, "GPU": 1.0}}


def test_a_trial_fits_a_live_node_with_its_cpus_and_gpus():
    assert fits([HEAD, WORKER], 1, 0) and fits([GPU_WORKER], 2, 0.5)
    assert not fits([HEAD], 1, 0) and not fits([WORKER], 2, 0) and not fits([WORKER], 1, 1)
    assert not fits([{**WORKER, "Alive": False}], 1, 0)  # a lost node stays listed, not alive


def test_no_fitting_node_for_the_wait_ends_the_phase_naming_the_fix():
    now, nodes = [0.0], [[HEAD, WORKER]]
    watch = NodeWatch("verify", 1, 0, wait_s=10, every_s=2, nodes=lambda: nodes[0], clock=lambda: now[0])
    watch.on_step_begin(0, [])
    nodes[0] = [HEAD, {**WORKER, "Alive": False}]  # the worker node lost
    for now[0] in (1.0, 3.0, 8.0, 12.0):  # 1.0: not looked at (every_s); lost seen at 3.0
        watch.on_step_begin(0, [])
    nodes[0] = [HEAD, WORKER]  # it came back within the wait: the clock restarts
    now[0] = 14.0
    watch.on_step_begin(0, [])
    nodes[0] = [HEAD]
    for now[0] in (16.0, 20.0, 24.0):
        watch.on_step_begin(0, [])
    now[0] = 26.0
    with pytest.raises(InfrastructureLost) as lost:
        watch.on_step_begin(0, [])
    message = str(lost.value)
    assert lost.value.status == "interrupted" and "no live node that can run the verify phase's trials" in message
    assert "1 CPU each" in message and "ray start --address=" in message and "resume" in message, message
    # with no Ray connected the head is a placeholder: naming it must not start a local Ray (ray.get_runtime_context
    # would, taking seconds and leaving its processes running)
    assert "--address=<head:port>" in message and not ray.is_initialized()


def test_zero_waits_forever_and_the_wait_is_a_setting(monkeypatch):
    watch = NodeWatch("tune", 1, 0, wait_s=0, nodes=lambda: [HEAD], clock=lambda: 1e9)
    watch.on_step_begin(0, [])
    monkeypatch.delenv("PTCTL_NO_NODE_S", raising=False)
    assert no_node_wait_s() == NO_NODE_S == 60
    monkeypatch.setenv("PTCTL_NO_NODE_S", "5")
    assert NodeWatch("tune", 1, 0).wait_s == 5
    monkeypatch.setenv("PTCTL_NO_NODE_S", "soon")
    assert no_node_wait_s() == NO_NODE_S
