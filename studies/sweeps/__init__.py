"""The validate phase's sweeps, one file per axis (`studies.sweeps.base.Sweep`), and the `validate` section of the
spec they share (`ValidateSpec`).

The registry is `ValidateSpec`'s bases: each sweep's `Fields` (the spec fields it adds to `validate`, and its
`Sweep` as `Fields.sweep`), the last planned first (pydantic lays a model's fields out from its last base, so
`validate`'s YAML reads width, horizon, depth, batch, context, optimizer). `SWEEPS` lists them in order. Adding an
axis is its file and its `Fields` in that line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, get_args

from pydantic import BaseModel, Field, field_validator, model_validator

from studies.arch import _STRICT, LaterFields, Parametrization, PosInt, Widths
from studies.space import MAX_WEIGHT_DECAY, WEIGHT_DECAY
from studies.sweeps import batch, depth, horizon, optimizer, seq_len, width
from studies.sweeps.base import Judged, Sweep, increasing

if TYPE_CHECKING:
    import pandas as pd

    from analysis import LRDrift
    from studies.spec import StudySpec

__all__ = ["SWEEPS", "Judged", "Sweep", "ValidateSpec", "flags", "with_sweep"]


def either(words: Iterable[str]) -> str:
    """"a, b or c"."""
    listed = list(words)
    return ", ".join(listed[:-1]) + f" or {listed[-1]}" if len(listed) > 1 else "".join(listed)


class Lr(BaseModel):
    """`validate`'s fields of every sweep: where lr is swept, how and how it is judged."""

    widths: Widths = Field(min_length=1, max_length=4,
                           description="2–4 increasing widths (one with a list of steps, with depths, batch_sizes or "
                                       "seq_lens: a horizon, depth, batch or context sweep alone)")
    lrs: list[float] = Field(min_length=3, description="the lr sweep: >= 3 distinct values > 0 (kept sorted)")
    parametrizations: list[Parametrization] = Field(
        default_factory=lambda: list(get_args(Parametrization)), min_length=1, description="must include 'mup'")
    seeds: PosInt = Field(1, description="training seeds per (width, lr, parametrization)")
    steps: PosInt | list[PosInt] | None = Field(
        None, description="override train.steps for validate trials; a list of 2–4 increasing step counts also "
                          "sweeps lr at each (the horizon: the lr optimum's drift per doubling of steps)")

    @field_validator("lrs")
    @classmethod
    def _lrs(cls, lrs: list[float]) -> list[float]:
        if any(not lr > 0 for lr in lrs) or len(set(lrs)) != len(lrs):
            raise ValueError(f"lrs {lrs} must be distinct and > 0, e.g. [0.001, 0.003, 0.01, 0.03]")
        return sorted(lrs)

    @field_validator("steps")
    @classmethod
    def _steps(cls, steps: int | list[int] | None) -> int | list[int] | None:
        if isinstance(steps, list):
            increasing(steps, f"steps {steps}: give one step count, or 2–4 strictly increasing ones, e.g. "
                              "[150, 300, 600]")
        return steps

    @field_validator("parametrizations")
    @classmethod
    def _parametrizations(cls, values: list[str]) -> list[str]:
        if "mup" not in values or len(set(values)) != len(values):
            raise ValueError(f"parametrizations {values} must include 'mup', each once")
        return values


ALWAYS_DUMPED = ("hparams", "drift_threshold")  # `validate` fields dumped at their defaults since before `later`


class ValidateSpec(optimizer.Fields, seq_len.Fields, batch.Fields, depth.Fields, horizon.Fields,  # the registry
                   width.Fields, Lr, LaterFields):
    """The optional validate phase: lr swept along each axis of `SWEEPS` the spec names (width: 2–4 widths under
    each parametrization, the lr drift)."""

    model_config = _STRICT

    drift_threshold: float = Field(0.5, gt=0, description="largest |Δlog2(lr*)| per doubling that passes")
    hparams: dict[str, list[float]] = Field(
        default_factory=dict, max_length=6,
        description="other searched hparams swept the same way, each alone with the rest at the centre, e.g. "
                    "{w_H: [0.25, 0.5, 1, 2, 4, 8]}: their optimum's drift is judged beside lr's")
    weight_decays: list[float] | None = Field(
        None, description="AdamW's λ swept the same way at the validate widths, the other hparams at the centre: "
                          ">= 3 distinct values in (0, 10], swept in log, e.g. [0.01, 0.03, 0.1, 0.3, 1]; λ*'s drift "
                          "per doubling of width is judged beside lr's (space.weight_decay need not be set)")

    @field_validator("weight_decays")
    @classmethod
    def _weight_decays(cls, values: list[float] | None) -> list[float] | None:
        if values is None:
            return None
        if len(values) < 3 or len(values) > 16 or len(set(values)) != len(values) or \
                any(not 0 < v <= MAX_WEIGHT_DECAY for v in values):
            raise ValueError(f"weight_decays {values} must be 3–16 distinct values in (0, {MAX_WEIGHT_DECAY:g}] "
                             "(swept in log), e.g. [0.01, 0.03, 0.1, 0.3, 1.0], or leave weight_decays out")
        return sorted(values)

    @field_validator("hparams")
    @classmethod
    def _hparams(cls, hparams: dict[str, list[float]]) -> dict[str, list[float]]:
        for name, values in hparams.items():
            if len(values) < 3 or any(not v > 0 for v in values) or len(set(values)) != len(values):
                raise ValueError(f"hparams.{name}={values} must be >= 3 distinct values > 0 (swept in log), "
                                 "e.g. [0.25, 0.5, 1, 2, 4]")
        return {name: sorted(values) for name, values in hparams.items()}

    @model_validator(mode="after")
    def _two_widths(self) -> ValidateSpec:
        alone = [s for s in SWEEPS.values() if s.name != "width" and s.alone]
        if len(self.widths) < 2 and not any(s.present(self) for s in alone):
            raise ValueError(f"validate.widths={self.widths}: give 2–4 widths (the optimum's drift per doubling of "
                             f"width), or one width with {either(f'validate.{s.key}' for s in alone)} (a "
                             f"{either(s.caption for s in alone)} sweep alone)")
        if len(self.widths) < 2 and (leaning := [s for s in SWEEPS.values() if not s.alone and s.present(self)]):
            raise ValueError(f"validate.{leaning[0].key} need 2–4 validate.widths (the sweep reads the width sweep's "
                             f"rows): add a width or drop validate.{leaning[0].key}")
        if len(self.widths) < 2 and self.hparams:
            raise ValueError("validate.hparams need 2–4 validate.widths (their drift is per doubling of width): "
                             "add a width or drop validate.hparams")
        if len(self.widths) < 2 and self.weight_decays:
            raise ValueError("validate.weight_decays need 2–4 validate.widths (λ*'s drift is per doubling of width): "
                             "add a width or drop validate.weight_decays")
        if WEIGHT_DECAY in self.hparams:
            raise ValueError("validate.hparams.weight_decay: sweep AdamW's λ with validate.weight_decays: "
                             f"{self.hparams[WEIGHT_DECAY]} instead (bounded, and judged with its timescale)")
        return self

    def horizons(self) -> list[int]:
        """The step counts of a horizon sweep (`steps` given as a list); [] for one training length."""
        return list(self.steps) if isinstance(self.steps, list) else []

    def sweeps(self) -> dict[str, list[float]]:
        """Each hparam swept along width: lr's first, then `hparams`, then `weight_decays` (as `weight_decay`)."""
        return {"lr": self.lrs, **self.hparams, **({WEIGHT_DECAY: self.weight_decays} if self.weight_decays else {})}

    def swept_hparams(self) -> dict[str, list[float]]:
        """The hparams but lr whose optimum's drift is judged: `hparams`, then `weight_decay` (`weight_decays`)."""
        return {h: v for h, v in self.sweeps().items() if h != "lr"}

    def present(self) -> list[Sweep]:
        """The sweeps this section names, in `SWEEPS` order."""
        return [s for s in SWEEPS.values() if s.present(self)]


ValidateSpec.later = tuple((name,) for name in ValidateSpec.model_fields if name not in Lr.model_fields
                           and name not in ALWAYS_DUMPED)  # each sweep's own fields: dumped only when set
SWEEPS: dict[str, Sweep] = {sweep.name: sweep for base in reversed(ValidateSpec.__mro__)
                            if isinstance(sweep := vars(base).get("sweep"), Sweep)}
"""Every sweep by name, in the order they are planned, judged and told (`ValidateSpec`'s bases, last first)."""


def with_sweep(spec: StudySpec, table: pd.DataFrame) -> pd.DataFrame:
    """The validate trial table with every row's `sweep`: rows from before the column (a study started by an older
    ptctl) get theirs from the axis columns they set."""
    import pandas as pd

    known = table["sweep"] if "sweep" in table else pd.Series(None, index=table.index, dtype=object)

    def column(name: str) -> pd.Series:
        return table[name] if name in table else pd.Series(float("nan"), index=table.index)

    legacy = pd.Series("width", index=table.index, dtype=object)
    legacy[column("horizon").notna() & (column("horizon") != spec.validate_horizon())] = "horizon"
    legacy[column("depth").notna()] = "depth"
    legacy[column("batch_size").notna()] = "batch"
    return table.assign(sweep=known.where(known.notna(), legacy))


def flags(spec: StudySpec, drifts: Sequence[LRDrift]) -> list[tuple[str, str]]:
    """Each sweep's warning on tune's setup, (its label, the flag), with the drifts the study measured along its axis
    (`Sweep.flag`)."""
    return [(s.flag_label, flag) for s in SWEEPS.values()
            if (flag := s.flag(spec, [d for d in drifts if d.axis == s.name]))]
