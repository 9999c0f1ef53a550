"""What every family's search space shares: `Range` (one hparam's bounds, log or linear, and the default value it
takes when it is not searched) and `Space` (the ranges of a family's hparams, and `frozen`: the hparams held at
their default instead of being tuned). Each family's space lives in its module under `studies/families/` (PT's
seven transferred hparams in `pt`, BERT's and UT's four in `encoder`, TauGPT's four in `tauformer`).

A study's tune phase searches `searched()`; every trial also receives `fixed()`; `defaults()` is the point the
space is centred on (`studies.model.space_class(family)`: a registered family's space); `space_model` builds a
space from one declaration of a family's hparams: each a config field with its default, its description and its
search bounds (`Searched`), made a search-space field by `searched_range`.

Every family's space may also search AdamW's weight decay λ (`weight_decay`, a `WeightDecayRange`; `WEIGHT_DECAY`):
left out (None, the default), λ is `train.weight_decay`, fixed, and not a hparam of the space (nor of its dump, so
a space's content hash is unchanged); given, it is one more searched (or frozen) hparam after the family's own,
and a trial's λ overrides `train.weight_decay` (`studies.spec.StudySpec.trial_config`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from pydantic.fields import FieldInfo

from studies.arch import Later, LaterFields

__all__ = ["MAX_WEIGHT_DECAY", "WEIGHT_DECAY", "Range", "Space", "WeightDecayRange", "check_hparam_names",
           "space_model"]

WEIGHT_DECAY = "weight_decay"  # the hparam name of AdamW's λ in every family's space (module docstring)
MAX_WEIGHT_DECAY = 10.0  # the largest λ a space or a validate sweep may name: η·λ per step stays well below 1


def check_hparam_names(names: Any, where: str, valid: tuple[str, ...]) -> None:
    """Raise a `ValueError` naming the unknown hparams in `names` and listing the valid ones."""
    from studies.words import did_you_mean

    unknown = sorted(str(n) for n in names if n not in valid)
    if unknown:
        hints = [f"{n}: {hint}" if len(unknown) > 1 else hint for n in unknown if (hint := did_you_mean(n, valid))]
        raise ValueError(f"{where}: unknown hparam(s) {unknown}: valid ones are {list(valid)}"
                         + "".join(f"; {h}" for h in hints))


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


class WeightDecayRange(Range):
    """The search range of AdamW's decoupled weight decay λ (`space.weight_decay`): 0 <= low < high <= 10."""

    @model_validator(mode="after")
    def _bounds(self) -> WeightDecayRange:
        if self.low < 0 or self.high > MAX_WEIGHT_DECAY:
            raise ValueError(f"space.weight_decay [{self.low:g}, {self.high:g}] must lie in [0, {MAX_WEIGHT_DECAY:g}] "
                             "(AdamW's λ; e.g. low: 0.001, high: 1.0, log: true)")
        return self


class Space(LaterFields):
    """What every family's space shares: validation of names and `frozen`, the optional weight decay, and the
    views of the ranges."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    HPARAMS: ClassVar[tuple[str, ...]] = ()
    later: ClassVar[Later] = ((WEIGHT_DECAY,),)
    frozen: list[str] = Field(default_factory=list)
    weight_decay: WeightDecayRange | None = Field(
        None, description="AdamW's decoupled weight decay λ searched like the family's hparams, e.g. {low: 0.001, "
        "high: 1.0, log: true}; null: λ is train.weight_decay, fixed")

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_hparam_names([k for k in data if k not in ("frozen", WEIGHT_DECAY)], "space",
                               (*cls.HPARAMS, WEIGHT_DECAY))
        return data

    @model_validator(mode="after")
    def _check_frozen(self) -> Space:
        check_hparam_names(self.frozen, "space.frozen", self.names())
        repeated = sorted({n for n in self.frozen if self.frozen.count(n) > 1})
        if repeated:
            raise ValueError(f"space.frozen lists {repeated} more than once: list each hparam once")
        if set(self.frozen) >= set(self.names()):
            raise ValueError("space.frozen freezes every hparam, leaving nothing to tune: unfreeze one")
        return self

    def names(self) -> tuple[str, ...]:
        """The space's hparams: the family's `HPARAMS`, then `weight_decay` when the space has a range for it."""
        return (*self.HPARAMS, WEIGHT_DECAY) if self.weight_decay is not None else self.HPARAMS

    def ranges(self) -> dict[str, Range]:
        """Every hparam's range, in `names()` order."""
        return {name: getattr(self, name) for name in self.names()}

    def searched(self) -> dict[str, Range]:
        """The ranges the tune phase searches: every hparam not in `frozen`, in `names()` order."""
        return {name: r for name, r in self.ranges().items() if name not in self.frozen}

    def fixed(self) -> dict[str, float]:
        """The frozen hparams and the default values they are held at."""
        return {name: r.centre for name, r in self.ranges().items() if name in self.frozen}

    def defaults(self) -> dict[str, float]:
        """The default point: every hparam at its range's default."""
        return {name: r.centre for name, r in self.ranges().items()}

    def complete(self, hparams: dict[str, float]) -> dict[str, float]:
        """`hparams` with every missing hparam at its default (frozen ones included); unknown names raise.
        `weight_decay` is known whether or not the space searches it (a validate sweep or the transfer phase's
        timescale rule sets it where `train.weight_decay` would be fixed)."""
        check_hparam_names(hparams, "the hparams given", (*self.HPARAMS, WEIGHT_DECAY))
        return {**self.defaults(), **{k: float(v) for k, v in hparams.items()}}


@dataclass(frozen=True)
class Searched:
    """An hparam's search bounds (log-uniform), beside its default and description in its config's `Field`."""

    low: float
    high: float


def searched_range(field: FieldInfo, description: str | None = None) -> Any:
    """The search-space `Field` of a config hparam declared with `Searched` bounds: a log `Range` over them whose
    default is the config's, described as the config field is (or by `description`)."""
    search = next(m for m in field.metadata if isinstance(m, Searched))
    low, high, default = search.low, search.high, float(field.default)
    return Field(default_factory=lambda: Range(low=low, high=high, log=True, default=default),
                 description=description or field.description)


def space_model(name: str, doc: str, ranges: dict[str, Any], frozen: Any, module: str) -> type[Space]:
    """A `Space` subclass named `name` (defined in `module`) with one `Range` field per entry of `ranges` (a
    hparam's `Field`), in that order (its `HPARAMS`), and `frozen` (its `Field`)."""
    fields: dict[str, Any] = {n: (Range, info) for n, info in ranges.items()}
    cls: type[Space] = create_model(name, __base__=Space, __doc__=doc, __module__=module, **fields,
                                    frozen=(list[str], frozen))
    cls.HPARAMS = tuple(ranges)
    return cls
