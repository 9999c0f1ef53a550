"""Ray Tune glue: the only place ptctl imports Ray.

`experiment` runs a phase as a Tune experiment (`RayRunner`, `run_phase`); `trainable` is one trial; `callback`
writes the trials' MLflow runs from the driver (`MlflowTrials`); `ledger` keeps the phase's finished trials
(`FinishedTrials`); `cluster` joins or starts Ray and watches its nodes and GPUs (`ensure_ray`, `NodeWatch`).
Importing the package loads Ray alone, for the service's driver actors (the names below); the modules, which load
Tune and torch, are imported by name.
"""

import os

os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's console boxes; the CLI draws its own progress

import ray  # noqa: E402
from ray._private import ray_constants  # noqa: E402
from ray.actor import ActorClass  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

__all__ = ["ActorClass", "NodeAffinitySchedulingStrategy", "ray", "ray_constants"]
