"""A planned trial: what one trial of a phase trains, as plain data (no torch, no Ray); each phase plans its own
(`studies.phases`).

A planned trial is a frozen `PlannedTrial`: `trial_key` (stable across restarts: the MLflow run and the
trial table row are keyed by it), `phase`, `width`, `seed`, `hparams` (all of the family's), `is_centre`,
for validate and compare its `parametrization`, for validate the `swept` hparam (and the `horizon`, its steps, in a
horizon sweep; the `depth` and `depth_parametrization` in a depth sweep; the `batch_size` in a batch sweep), and
for compare its family, budget, role, stage and FLOPs with its own `config` (its family differs from the spec's). A
runner turns each into a trial config with `PlannedTrial.trial_config`; Ray Tune carries it as `as_dict()` in the
trial's config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from studies.arch import DepthParametrization
from studies.spec import StudySpec

PLANNED_COLUMNS = ("family", "budget", "role", "tuned_at", "train_flops",  # compare trials' extra table columns
                   "swept",  # validate trials': the hparam their sweep varies
                   "horizon",  # validate trials of a horizon sweep (validate.steps a list): the steps they train
                   "depth", "depth_parametrization",  # validate trials of a depth sweep (validate.depths)
                   "batch_size")  # validate trials of a batch sweep (validate.batch_sizes): the batch they train at


@dataclass(frozen=True)
class PlannedTrial:
    """One trial a phase runs (a TPE suggestion in tune, planned up front in the other phases)."""

    trial_key: str
    phase: str
    width: int
    seed: int
    hparams: Mapping[str, float]
    is_centre: bool = False
    parametrization: str | None = None  # None: the spec's
    swept: str | None = None  # validate: the hparam its sweep varies
    horizon: int | None = None  # validate with a list of steps: the steps this trial trains (None: the phase's)
    depth: int | None = None  # validate.depths: the depth this trial builds (None: the arch's)
    depth_parametrization: DepthParametrization | None = None  # with depth: completep or none (`DEPTH_SWEEP`)
    batch_size: int | None = None  # validate.batch_sizes: the batch this trial trains at (None: the phase's)
    family: str | None = None  # compare: the family, its budget, role, tune stage and training FLOPs
    budget: float | None = None
    role: str | None = None
    tuned_at: str | None = None
    train_flops: float | None = None
    config: Mapping[str, Any] | None = field(default=None, repr=False)  # compare: the family's own trial config

    @classmethod
    def for_tune(cls, spec: StudySpec, trial_id: str, suggested: Mapping[str, float]) -> PlannedTrial:
        """A tune trial: the searcher's suggestion (frozen hparams at their defaults) at the base width."""
        hparams = spec.space.complete(dict(suggested))
        return cls(f"tune-{trial_id}", "tune", spec.tune.base_width, spec.tune.seed, hparams)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannedTrial:
        """The inverse of `as_dict` (also what Ray Tune restores from an experiment's trial configs)."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"a planned trial has unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, without the fields that are not set (Ray Tune's trial config)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def trial_config(self, spec: StudySpec) -> dict[str, Any]:
        """The trial config dict `workers.train` takes: a compare trial's own, else the spec's at this trial."""
        if self.config is not None:
            return dict(self.config)
        return spec.trial_config(self.width, dict(self.hparams), self.seed, self.steps(spec), self.parametrization,
                                 self.depth, self.depth_parametrization, self.batch_size or spec.batch_for(self.phase))

    def steps(self, spec: StudySpec) -> int:
        """The steps this trial trains: a horizon sweep's own, a batch sweep's (`StudySpec.batch_steps`), else its
        phase's."""
        if self.horizon is not None:
            return self.horizon
        return spec.batch_steps(self.batch_size) if self.batch_size is not None else spec.steps_for(self.phase)

    def columns(self, spec: StudySpec) -> dict[str, Any]:
        """The trial table's planned columns (`analysis/__init__.py`): identity, parametrization, validate's and
        compare's extras, and the hparams."""
        return {"trial_id": self.trial_key, "phase": self.phase, "width": self.width, "seed": self.seed,
                "is_centre": self.is_centre, "parametrization": self.parametrization or spec.model.parametrization,
                **{k: getattr(self, k) for k in PLANNED_COLUMNS if getattr(self, k) is not None}, **self.hparams}
