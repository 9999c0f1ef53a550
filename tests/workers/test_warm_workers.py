"""The local Ray that ptctl starts (`workers.ray_runner.ensure_ray`) starts its workers with the trial modules
already imported, so a phase's first trial actors do not pay torch's import; a worker of a plain `ray.init` does."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

PROBE = textwrap.dedent("""
    import sys, time, ray
    {start}

    @ray.remote(num_cpus=1)
    class Probe:
        def imported(self):
            return "workers.ray_runner" in sys.modules and "torch" in sys.modules

    time.sleep(3)  # the pre-started workers import while the driver prepares its data
    print("WARM" if ray.get(Probe.remote().imported.remote()) else "COLD")
""")


def _probe(start: str) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE.format(start=start)], capture_output=True, text=True,
                         timeout=180, env={**__import__("os").environ, "RAY_ADDRESS": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_a_trial_actor_of_ptctls_local_ray_starts_with_torch_and_the_trial_code_imported():
    assert _probe("from workers.ray_runner import ensure_ray; ensure_ray()") == "WARM"


def test_a_plain_ray_worker_does_not():
    """The control: an actor of a Ray started without ptctl's settings imports nothing of ptctl."""
    assert _probe("ray.init(include_dashboard=False, num_cpus=2)") == "COLD"
