"""Ray Tune glue: the only place ptctl imports Ray.

`experiment` runs a phase as a Tune experiment (`RayRunner`, `run_phase`); `trainable` is one trial; `callback`
writes the trials' MLflow runs from the driver (`MlflowTrials`); `ledger` keeps the phase's finished trials
(`FinishedTrials`); `cluster` joins or starts Ray and watches its nodes and GPUs (`ensure_ray`, `NodeWatch`);
`actors` makes every Ray call of the service, whose study drivers are actors (the service imports no Ray). The
package sets Ray's environment first and imports no Ray itself (nor re-exports it); `actors` loads Ray alone, the
other modules Tune and torch too.
"""

import os

os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's console boxes; the CLI draws its own progress
# Ray runs its workers at niceness 15: beside any process at 0 a trial or a study's driver then gets a 28th of its
# share of a core (a phase 13x slower beside two busy loops on 2 cores). The Ray ptctl starts runs them at 0.
os.environ.setdefault("RAY_worker_niceness", "0")

__all__ = ["keep_loopback"]


def keep_loopback() -> None:
    """Keep 127.0.0.1 as this process's Ray node address, so what it starts or serves listens on loopback alone.

    Ray swaps a node address of 127.0.0.1 for the machine's own (then binds every interface) unless it runs as a
    single-machine cluster: the switch for that, read once at import, is set here for this process and its children."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
