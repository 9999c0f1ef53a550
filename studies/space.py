"""Search spaces: PT's seven transferred hparams (`lr` plus the six information weights), and the
baselines' (BERT, UT): `lr`, `init_std`, `output_mult`, `attn_mult` (mup's usual knobs), and TauGPT's:
`lr`, `init_std`, `output_mult`, `temperature`.

Each hparam has a `Range` (bounds, log or linear, and the default value it takes when it is not
searched); `SearchSpace.frozen` lists the hparams held at their default instead of being tuned.
A study's tune phase searches `searched()`; every trial also receives `fixed()`; `defaults()` is
the point the space is centred on (PT: lr 1e-2, every information weight 1.0: the original PT).
`space_class(family)` gives a model family's space (registered with it in `studies.family`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from analysis import HPARAMS

__all__ = ["BASELINE_HPARAMS", "HPARAMS", "INFORMATION_WEIGHTS", "TAU_HPARAMS", "BaselineSpace", "Range", "Space",
           "SearchSpace", "TauSpace",
           "check_hparam_names", "space_class", "validate_space"]

INFORMATION_WEIGHTS: tuple[str, ...] = tuple(h for h in HPARAMS if h != "lr")
"""PT's six message scalings (PT spec §3.2): every hparam but `lr`."""

BASELINE_HPARAMS: tuple[str, ...] = ("lr", "init_std", "output_mult", "attn_mult")
"""The BERT and UT hparams: `lr` and the three multipliers of `workers/models/bert.py`."""

TAU_HPARAMS: tuple[str, ...] = ("lr", "init_std", "output_mult", "temperature")
"""The TauGPT hparams: `lr`, the init std, the readout multiplier and the initial attention temperature."""


def check_hparam_names(names: Any, where: str, valid: tuple[str, ...] = HPARAMS) -> None:
    """Raise a `ValueError` naming the unknown hparams in `names` and listing the valid ones."""
    unknown = sorted(str(n) for n in names if n not in valid)
    if unknown:
        raise ValueError(f"unknown hparam(s) {unknown} in {where}: valid ones are {list(valid)}")


class Range(BaseModel):
    """One hparam's search range, and the value it takes when it is not searched."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    low: float = Field(description="lower bound of the search (inclusive)")
    high: float = Field(description="upper bound of the search (inclusive); must be > low")
    log: bool = Field(True, description="sample log-uniformly (True) or uniformly (False)")
    default: float | None = Field(
        None,
        description="the value used when the hparam is frozen (and the space's centre); "
        "omitted: the geometric mean of low and high when log, else their midpoint",
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("default") is None:
            try:
                low, high = float(data["low"]), float(data["high"])
            except (KeyError, TypeError, ValueError):
                return data  # the field validators report what is wrong
            log = data.get("log", True)
            if log and low > 0 and high > 0:
                data = {**data, "default": math.sqrt(low * high)}
            elif not log:
                data = {**data, "default": (low + high) / 2}
        return data

    @model_validator(mode="after")
    def _check(self) -> Range:
        if not self.low < self.high:
            raise ValueError(f"low={self.low} must be < high={self.high}: swap them or widen the range")
        if self.log and self.low <= 0:
            raise ValueError(f"low={self.low} must be > 0 for a log range: raise it or set log: false")
        if self.default is None or not self.low <= self.default <= self.high:
            raise ValueError(
                f"default={self.default} must lie in [low, high] = [{self.low}, {self.high}]: "
                "move the default or widen the range"
            )
        return self

    @property
    def centre(self) -> float:
        """`default`, which validation always fills (omitted: the geometric mean or the midpoint)."""
        assert self.default is not None  # `_check` rejects a range without one
        return float(self.default)


def _weight() -> Range:
    return Range(low=0.25, high=4.0, log=True, default=1.0)


def _weight_field(name: str, what: str) -> Any:
    return Field(default_factory=_weight, description=f"{name}: the scale of {what} (PT spec §3.2)")


class Space(BaseModel):
    """What every family's space shares: validation of names and `frozen`, and the views of the ranges."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    HPARAMS: ClassVar[tuple[str, ...]] = ()
    frozen: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_hparam_names([k for k in data if k != "frozen"], "space", cls.HPARAMS)
        return data

    @model_validator(mode="after")
    def _check_frozen(self) -> Space:
        check_hparam_names(self.frozen, "space.frozen", self.HPARAMS)
        repeated = sorted({n for n in self.frozen if self.frozen.count(n) > 1})
        if repeated:
            raise ValueError(f"space.frozen lists {repeated} more than once: list each hparam once")
        if set(self.frozen) >= set(self.HPARAMS):
            raise ValueError("space.frozen freezes every hparam, leaving nothing to tune: unfreeze one")
        return self

    def ranges(self) -> dict[str, Range]:
        """Every hparam's range, in `HPARAMS` order."""
        return {name: getattr(self, name) for name in self.HPARAMS}

    def searched(self) -> dict[str, Range]:
        """The ranges the tune phase searches: every hparam not in `frozen`, in `HPARAMS` order."""
        return {name: r for name, r in self.ranges().items() if name not in self.frozen}

    def fixed(self) -> dict[str, float]:
        """The frozen hparams and the default values they are held at."""
        return {name: r.centre for name, r in self.ranges().items() if name in self.frozen}

    def defaults(self) -> dict[str, float]:
        """The default point: every hparam at its range's default."""
        return {name: r.centre for name, r in self.ranges().items()}

    def complete(self, hparams: dict[str, float]) -> dict[str, float]:
        """`hparams` with every missing hparam at its default (frozen ones included); unknown names raise."""
        check_hparam_names(hparams, "the hparams given", self.HPARAMS)
        return {**self.defaults(), **{k: float(v) for k, v in hparams.items()}}


class SearchSpace(Space):
    """PT's space: a `Range` per hparam (each optional: omitted ones take the documented default range)."""

    HPARAMS: ClassVar[tuple[str, ...]] = HPARAMS
    lr: Range = Field(
        default_factory=lambda: Range(low=1e-4, high=1e-1, log=True, default=1e-2),
        description="base learning rate of AdamW (μP scales it per parameter group)",
    )
    w_H: Range = _weight_field("w_H", "the ternary → H message (the attention logits)")
    w_topic: Range = _weight_field("w_topic", "the binary → topic message (the topic logits)")
    w_unary: Range = _weight_field("w_unary", "the unary → Z message S")
    w_dep: Range = _weight_field("w_dep", "the ternary → Z message with the word as dependent (G_dep)")
    w_head: Range = _weight_field("w_head", "the ternary → Z message with the word as head (G_head)")
    w_topic_z: Range = _weight_field("w_topic_z", "the binary → Z message (from the topic variables)")
    frozen: list[str] = Field(
        default_factory=list,
        description="hparams held at their default instead of searched, e.g. [w_topic, w_topic_z] "
        "when model.arch.topic is 'none' (those weights then have no effect)",
    )


class BaselineSpace(Space):
    """The BERT / UT space (`workers/models/bert.py`): lr, the init std and the output and attention multipliers.

    Defaults: lr 3e-3 (Adam, small encoders), init_std 0.05 (BERT's 0.02 is ≈ 0.55/√768; at the widths of
    a CPU study, ~100, the same fan-in-relative std is ≈ 0.05), both multipliers 1.
    """

    HPARAMS: ClassVar[tuple[str, ...]] = BASELINE_HPARAMS
    lr: Range = Field(
        default_factory=lambda: Range(low=1e-4, high=1e-1, log=True, default=3e-3),
        description="base learning rate of AdamW (μP scales the hidden group's by base_width/width)",
    )
    init_std: Range = Field(
        default_factory=lambda: Range(low=0.005, high=0.5, log=True, default=0.05),
        description="std of the embeddings and readout; hidden weights at base_width (μP: ∝ 1/√width above)")
    output_mult: Range = Field(
        default_factory=lambda: Range(low=0.1, high=10.0, log=True, default=1.0),
        description="multiplier of the MLM logits (μP: output_mult · base_width/width)")
    attn_mult: Range = Field(
        default_factory=lambda: Range(low=0.25, high=4.0, log=True, default=1.0),
        description="multiplier of the attention logits (μP: q·k/head_dim; standard: q·k/√head_dim)")
    frozen: list[str] = Field(default_factory=list, description="hparams held at their default, e.g. [attn_mult]")


class TauSpace(Space):
    """The TauGPT space (`workers/models/tauformer.py`): lr, the init std, the output multiplier and the
    initial attention temperature.

    Defaults: lr 3e-3 (Adam, small GPTs; the 30M post used 5e-4 at width 384), init_std 0.5 (the reference's
    Kaiming-uniform gain), output_mult 1, temperature 0.03 (Tauformer spec §3.2: ≈ the λ spread at init).
    """

    HPARAMS: ClassVar[tuple[str, ...]] = TAU_HPARAMS
    lr: Range = Field(
        default_factory=lambda: Range(low=1e-4, high=3e-2, log=True, default=3e-3),
        description="base learning rate of AdamW (μP scales the hidden group's by base_width/width)",
    )
    init_std: Range = Field(
        default_factory=lambda: Range(low=0.1, high=2.0, log=True, default=0.5),
        description="matrix init std × √fan_in (the reference's Kaiming gain 0.5)")
    output_mult: Range = Field(
        default_factory=lambda: Range(low=0.1, high=10.0, log=True, default=1.0),
        description="multiplier of the LM logits (μP: output_mult · base_width/width)")
    temperature: Range = Field(
        default_factory=lambda: Range(low=0.005, high=0.5, log=True, default=0.03),
        description="initial per-head temperature of the λ logits −|λq − λk|/T (learned from there by default)")
    frozen: list[str] = Field(default_factory=list, description="hparams held at their default, e.g. [temperature]")


def space_class(family: str) -> type[Space]:
    """The search-space class of model `family` (its registration in `studies.family`)."""
    from studies.family import get_family  # the registry imports this module

    return get_family(family).space


def validate_space(value: Any, family: str, **options: Any) -> Space:
    """`value` (None, a dict or a space) as `family`'s space; a space of another family is re-validated
    (`options`: `model_validate`'s strict and context)."""
    cls = space_class(family)
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return cls.model_validate(value, **options)
