"""A planned trial: what one trial of a phase trains, as plain data (no torch, no Ray); each phase plans its own
(`studies.phases`).

A planned trial is a frozen `PlannedTrial`: `trial_key` (stable across restarts: the MLflow run and the
trial table row are keyed by it), `phase`, `width`, `seed`, `hparams` (all of the family's), `is_centre`,
for validate and compare its `parametrization`, for validate the `swept` hparam, the `sweep` that planned it
(`studies.sweeps.SWEEPS`) and its values `at` along that sweep's axis (`{"horizon": 300}`, `{"batch_size": 32}`),
and for compare its family, budget, role, stage and FLOPs with its own `config` (its family differs from the spec's).
A runner turns each into a trial config with `PlannedTrial.trial_config`; Ray Tune carries it as `as_dict()` in the
trial's config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from studies.spec import StudySpec

PLANNED_COLUMNS = ("family", "budget", "role", "tuned_at", "train_flops",  # compare trials' extra table columns
                   "swept", "sweep")  # validate trials': the hparam their sweep varies, and the sweep
LEGACY_AT = {"horizon": "horizon", "depth": "depth", "depth_parametrization": "depth", "batch_size": "batch"}
"""A planned trial's keys from before `sweep` and `at` (Ray Tune's stored trial configs), and the sweep of each."""


def ledger_form(config: Mapping[str, Any]) -> dict[str, Any]:
    """A Tune trial config (a planned trial's `as_dict()`, or a batch of them) as the ledger of finished trials knows
    it: `at` spread out and `sweep` left out, the form every config had before them, so a study interrupted by an
    older ptctl finds its finished trials."""
    if "members" in config:
        return {**config, "members": [ledger_form(m) for m in config["members"]]}
    return {**{k: v for k, v in config.items() if k not in ("sweep", "at")}, **(config.get("at") or {})}


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
    sweep: str | None = None  # validate: the sweep that planned it (`studies.sweeps.SWEEPS`)
    at: Mapping[str, Any] | None = None  # its values along that sweep's axis, by trial-table column
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
        if legacy := {k: data[k] for k in LEGACY_AT if k in data}:  # a trial config from before `sweep`
            sweep = "width" if data.get("swept", "lr") != "lr" else LEGACY_AT[next(iter(legacy))]
            data = {**{k: v for k, v in data.items() if k not in LEGACY_AT}, "sweep": sweep, "at": legacy}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"a planned trial has unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, without the fields that are not set (Ray Tune's trial config)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def trial_config(self, spec: StudySpec) -> dict[str, Any]:
        """The trial config dict `workers.train` takes: a compare trial's own, else the spec's at this trial (its
        phase's steps and batch, then its sweep's values `at`: `Sweep.apply`)."""
        if self.config is not None:
            return dict(self.config)
        config = spec.trial_config(self.width, dict(self.hparams), self.seed, spec.steps_for(self.phase),
                                   self.parametrization, batch_size=spec.batch_for(self.phase))
        if self.sweep is not None and self.at:
            from studies.sweeps import SWEEPS

            SWEEPS[self.sweep].apply(spec, self.at, config)
        return config

    def steps(self, spec: StudySpec) -> int:
        """The steps this trial trains."""
        return int(self.trial_config(spec)["steps"])

    def batch_size(self, spec: StudySpec) -> int:
        """The sequences per step this trial trains at."""
        return int(self.trial_config(spec)["batch_size"])

    @property
    def depth(self) -> int | None:
        """The depth a depth sweep's trial builds (None: the arch's)."""
        return (self.at or {}).get("depth")

    def columns(self, spec: StudySpec) -> dict[str, Any]:
        """The trial table's planned columns (`analysis/__init__.py`): identity, parametrization, validate's and
        compare's extras, and the hparams."""
        return {"trial_id": self.trial_key, "phase": self.phase, "width": self.width, "seed": self.seed,
                "is_centre": self.is_centre, "parametrization": self.parametrization or spec.model.parametrization,
                **{k: getattr(self, k) for k in PLANNED_COLUMNS if getattr(self, k) is not None}, **(self.at or {}),
                **self.hparams}
