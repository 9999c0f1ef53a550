"""What every family's search space shares: `Range` (one hparam's bounds, log or linear, and the default value it
takes when it is not searched) and `Space` (the ranges of a family's hparams, and `frozen`: the hparams held at
their default instead of being tuned). Each family's space lives in its module under `studies/families/` (PT's
seven transferred hparams in `pt`, BERT's and UT's four in `encoder`, TauGPT's four in `tauformer`).

A study's tune phase searches `searched()`; every trial also receives `fixed()`; `defaults()` is the point the
space is centred on (`studies.model.space_class(family)`: a registered family's space); `space_model` builds a
space from one declaration of a family's hparams.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

__all__ = ["Range", "Space", "check_hparam_names", "space_model"]


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


def space_model(name: str, doc: str, ranges: dict[str, Any], frozen: Any, module: str) -> type[Space]:
    """A `Space` subclass named `name` (defined in `module`) with one `Range` field per entry of `ranges` (a
    hparam's `Field`), in that order (its `HPARAMS`), and `frozen` (its `Field`)."""
    fields: dict[str, Any] = {n: (Range, info) for n, info in ranges.items()}
    cls: type[Space] = create_model(name, __base__=Space, __doc__=doc, __module__=module, **fields,
                                    frozen=(list[str], frozen))
    cls.HPARAMS = tuple(ranges)
    return cls
