"""The search space of the seven transferred hparams: `lr` plus PT's six information weights.

Each hparam has a `Range` (bounds, log or linear, and the default value it takes when it is not
searched); `SearchSpace.frozen` lists the hparams held at their default instead of being tuned.
A study's tune phase searches `searched()`; every trial also receives `fixed()`; `defaults()` is
the point the space is centred on (lr 1e-2, every information weight 1.0: the original PT).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from analysis import HPARAMS

__all__ = ["HPARAMS", "INFORMATION_WEIGHTS", "Range", "SearchSpace", "check_hparam_names"]

INFORMATION_WEIGHTS: tuple[str, ...] = tuple(h for h in HPARAMS if h != "lr")
"""PT's six message scalings (PT spec §3.2): every hparam but `lr`."""


def check_hparam_names(names: Any, where: str) -> None:
    """Raise a `ValueError` naming the unknown hparams in `names` and listing the valid ones."""
    unknown = sorted(str(n) for n in names if n not in HPARAMS)
    if unknown:
        raise ValueError(f"unknown hparam(s) {unknown} in {where}: valid ones are {list(HPARAMS)}")


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


def _weight() -> Range:
    return Range(low=0.25, high=4.0, log=True, default=1.0)


def _weight_field(name: str, what: str) -> Any:
    return Field(default_factory=_weight, description=f"{name}: the scale of {what} (PT spec §3.2)")


class SearchSpace(BaseModel):
    """A `Range` per hparam (each optional: omitted ones take the documented default range)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_hparam_names([k for k in data if k != "frozen"], "space")
        return data

    @model_validator(mode="after")
    def _check_frozen(self) -> SearchSpace:
        check_hparam_names(self.frozen, "space.frozen")
        repeated = sorted({n for n in self.frozen if self.frozen.count(n) > 1})
        if repeated:
            raise ValueError(f"space.frozen lists {repeated} more than once: list each hparam once")
        if set(self.frozen) >= set(HPARAMS):
            raise ValueError("space.frozen freezes every hparam, leaving nothing to tune: unfreeze one")
        return self

    def ranges(self) -> dict[str, Range]:
        """Every hparam's range, in `HPARAMS` order."""
        return {name: getattr(self, name) for name in HPARAMS}

    def searched(self) -> dict[str, Range]:
        """The ranges the tune phase searches: every hparam not in `frozen`, in `HPARAMS` order."""
        return {name: r for name, r in self.ranges().items() if name not in self.frozen}

    def fixed(self) -> dict[str, float]:
        """The frozen hparams and the default values they are held at."""
        return {name: float(r.default) for name, r in self.ranges().items() if name in self.frozen}

    def defaults(self) -> dict[str, float]:
        """The default point: every hparam at its range's default."""
        return {name: float(r.default) for name, r in self.ranges().items()}

    def complete(self, hparams: dict[str, float]) -> dict[str, float]:
        """`hparams` with every missing hparam at its default (frozen ones included); unknown names raise."""
        check_hparam_names(hparams, "the hparams given")
        return {**self.defaults(), **{k: float(v) for k, v in hparams.items()}}
