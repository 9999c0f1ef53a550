"""A memory squeeze loses nothing (`workers.ray.experiment.run_phase`): trials that Ray's memory monitor kills are
resumed once with half the trials at once, and killed again the phase stops with an error in the user's words (the
memory, what to lower, how to resume). Each run is a child process with a private Ray: one whose memory monitor
kills every worker (its threshold at 1 % of the node's memory: every trial exceeds it), one whose first fit is
failed by Ray's own out-of-memory error and whose retry runs as usual."""

from __future__ import annotations

import json

import pytest

from tests.workers.test_gpu_batches import child_json

pytestmark = pytest.mark.slow  # private Ray clusters in child processes

STUDY = """
import json, logging, ray
from studies import load_catalog
from studies.spec import StudySpec
from workers.driver import run_study
from workers.errors import StudyError
{setup}
data = load_catalog("tiny").as_dict()
data["name"] = "tiny-squeeze"
data["tune"] |= {{"num_trials": 2, "max_concurrent": 2, "asha": {{"enabled": False}}}}
data["transfer"] = data["verify"] = None
try:
    state = run_study(StudySpec.model_validate(data), "squeeze")
    out = {{"status": state.status, "trials": len(state.phases["tune"].model_dump())}}
except StudyError as exc:
    out = {{"error": str(exc)}}
print(json.dumps({{**out, **extra}}))
"""

ALWAYS_KILLED = STUDY.format(setup="""
ray.init(num_cpus=2, include_dashboard=False,
         _system_config={"memory_usage_threshold": 0.01, "memory_monitor_refresh_ms": 100})
extra = {}
""")

KILLED_ONCE = STUDY.format(setup="""
import workers.ray.experiment as experiment
ray.init(num_cpus=2, include_dashboard=False)
extra = {"at_once": []}
real = experiment._tuner


class Squeezed:  # the first fit fails as Tune 2.60 fails it when a trial's task worker is killed for memory
    def fit(self):
        raise RuntimeError("Caught unexpected exception: 1 worker(s) were killed due to the node running low on memory")


def tuner(spec, phase, trainable, planned, root, experiment_name, faults, at_once):
    extra["at_once"].append(at_once)
    return Squeezed() if len(extra["at_once"]) == 1 else real(spec, phase, trainable, planned, root, experiment_name,
                                                              faults, at_once)


experiment._tuner = tuner
""")


def test_trials_killed_for_memory_twice_stop_the_phase_in_the_users_words(tmp_path):
    out = child_json(ALWAYS_KILLED, tmp_path)
    error = out["error"]
    assert error.startswith("the tune phase's trials were killed by Ray's memory monitor twice, "
                            "the second time with at most 1 at once (each trial needs about "), error
    assert "Lower tune.max_concurrent (or raise resources.cpus_per_trial), train.batch_size or data.seq_len" in error
    assert "POST /studies/squeeze/resume" in error and "killed due to the node running low on memory" in error
    state = json.loads((tmp_path / "studies" / "squeeze" / "state.json").read_text())
    assert state["status"] == "failed" and "memory monitor" in state["error"], state


def test_a_fit_failed_by_a_memory_kill_is_resumed_with_half_the_trials_at_once(tmp_path):
    out = child_json(KILLED_ONCE, tmp_path)
    assert out["status"] == "succeeded", out
    assert out["at_once"] == [2, 1], out  # the CPUs' two lanes, then one
