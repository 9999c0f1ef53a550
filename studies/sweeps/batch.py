"""The batch sweep (`validate.batch_sizes`): lr swept at 2–4 batch sizes at every validate width under each
parametrization, the other hparams at the centre, `-b<batch size>` in the trial key
(`validate-mup-w64-b32-lr0.004-s0`); at a fixed token budget by default (a trial at batch B trains
`batch_steps(spec, B)` steps; `validate.batch_fixed: steps` keeps the steps). Judged per width into the lr optimum's
drift per doubling of the batch size beside the textbook rules (`RULES`) and the regret of carrying the base batch's
optimal lr unchanged (`analysis.carried_regrets`; the base batch is the tune batch when swept, else the swept batch
size nearest it in log2); its flag says when tune's batch differs from the target's.

Two rules say how the optimal lr grows with the batch size B. The square-root rule (lr ∝ √B: +0.5 log2(lr) per
doubling of B) keeps the update's noise scale for Adam-type optimizers (Malladi et al., 2022, "On the SDEs and
scaling rules for adaptive gradient algorithms"); the linear rule (lr ∝ B: +1.0) is SGD's (Goyal et al., 2017).
A drift of 0 means the lr carries unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator

from analysis.constants import Axis
from studies.arch import PosInt
from studies.sweeps.base import Sweep, increasing

if TYPE_CHECKING:
    import pandas as pd

    from analysis import LRDrift, Regret
    from studies.plan import PlannedTrial
    from studies.spec import StudySpec
    from studies.sweeps import ValidateSpec

RULES = {"unchanged": 0.0, "√B": 0.5, "linear": 1.0}
"""Each rule's drift of the optimal lr in log2(lr) per doubling of the batch size."""


class Fields(BaseModel):
    sweep: ClassVar[Sweep]  # set below: this sweep
    batch_sizes: list[PosInt] | None = Field(
        None, description="2–4 strictly increasing batch sizes: lr is also swept at each, at every validate width "
                          "(the lr optimum's drift per doubling of batch, beside the √B and linear rules)")
    batch_fixed: Literal["tokens", "steps"] = Field(
        "tokens", description="what the batch sweep holds fixed: 'tokens' (a trial at batch B trains "
                              "round(steps · B_base / B) steps, B_base the tune batch) or 'steps'")

    @field_validator("batch_sizes")
    @classmethod
    def _batch_sizes(cls, sizes: list[int] | None) -> list[int] | None:
        return increasing(sizes, f"batch_sizes {sizes}: give 2–4 strictly increasing batch sizes, e.g. [8, 16, 32], "
                                 "or leave batch_sizes out")


def batch_steps(spec: StudySpec, batch_size: int) -> int:
    """The steps of a batch sweep's trial at `batch_size`: the validate horizon, scaled by the base batch /
    batch_size at a fixed token budget (`validate.batch_fixed: tokens`, at least 1 step), unscaled at fixed steps."""
    steps = spec.validate_horizon()
    if spec.validate_ is not None and spec.validate_.batch_fixed == "steps":
        return steps
    return max(1, round(steps * spec.base_batch() / batch_size))


def nearest_rule(drift: float) -> str:
    """The rule of `RULES` whose drift lies nearest `drift` (the smaller drift on a tie)."""
    return min(RULES, key=lambda name: (abs(drift - RULES[name]), RULES[name]))


def _value(name: str, named: bool = False) -> str:
    """A rule's drift as "+0.5" (0 unsigned), after its name when `named`."""
    value = f"{RULES[name]:+.1f}" if RULES[name] else "0"
    return f"{name} {value}" if named else value


def rules_text(drift: LRDrift, parametrization: str | None = None) -> str:
    """The measured drift beside the rules, e.g. "mup's optimal lr at width 64 moves +0.42 [95 % CI +0.21, +0.63]
    log2(lr) per doubling of the batch size: nearest the √B rule (+0.5; linear +1.0, unchanged 0); the interval
    holds √B only". `parametrization`: default the judged one (mup)."""
    param = parametrization or drift.judged[0]
    value, ci = drift.drift[param], drift.drift_ci.get(param)
    width = f" at width {drift.width}" if drift.optima else ""
    interval = f" [95 % CI {ci[0] + 0.0:+.2f}, {ci[1] + 0.0:+.2f}]" if ci else " (too few optima for an interval)"
    near = nearest_rule(value)
    others = ", ".join(_value(name, True) for name in RULES if name != near)
    rule = "carrying it unchanged" if near == "unchanged" else f"the {near} rule"
    said = (f"{param}'s optimal {drift.hparam}{width} moves {value + 0.0:+.2f}{interval} log2({drift.hparam}) per "
            f"doubling of the batch size: nearest {rule} ({_value(near)}; {others})")
    if ci is None:
        return said
    held = [name for name, rule in RULES.items() if ci[0] <= rule <= ci[1]]
    return said + (f"; the interval holds {' and '.join(held)}" if held else "; the interval holds none of them")


class Batch(Sweep):
    name: ClassVar[str] = "batch"
    key: ClassVar[str] = "batch_sizes"
    axis = Axis(name="batch", column="batch_size", words="batch size")
    header: ClassVar[str] = "batch size"
    legend: ClassVar[str] = "batch {}"
    figure: ClassVar[str | None] = "batch"
    caption: ClassVar[str] = "batch size"
    flag_label: ClassVar[str] = "batch"
    drift_key: ClassVar[str] = "batch"
    verdict_words: ClassVar[str] = "batch"
    regret_key: ClassVar[str] = "b"
    regret_title: ClassVar[str] = "Batch"
    regret_label: ClassVar[str] = "batch"

    def present(self, v: ValidateSpec) -> bool:
        return bool(v.batch_sizes)

    def trials(self, spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
        from studies.plan import PlannedTrial

        v = spec.validate_
        assert v is not None
        return [PlannedTrial(f"validate-{p}-w{w}-b{b}-lr{x:.3g}-s{s}", "validate", w, s, {**centre, "lr": x},
                             parametrization=p, swept="lr", sweep=self.name, at={"batch_size": b})
                for p in v.parametrizations for w in v.widths for b in v.batch_sizes or [] for x in v.lrs
                for s in range(v.seeds)]

    def apply(self, spec: StudySpec, at: Mapping[str, Any], config: dict[str, Any]) -> None:
        config.update(batch_size=at["batch_size"], steps=batch_steps(spec, at["batch_size"]))

    def base(self, spec: StudySpec) -> int:
        return spec.base_batch()

    def figure_note(self) -> str:
        return "(rules: " + ", ".join(f"{name} {value:+.1f}" for name, value in RULES.items() if value) + ")"

    def problems(self, spec: StudySpec) -> list[str]:
        """Its shortest trials (the largest batch, at a fixed token budget) must outlast the warmup."""
        v = spec.validate_
        assert v is not None and v.batch_sizes
        largest = v.batch_sizes[-1]
        if v.batch_fixed == "tokens" and spec.compare is None and spec.train.warmup_steps >= batch_steps(spec, largest):
            return [f"train.warmup_steps={spec.train.warmup_steps} must be < the {batch_steps(spec, largest)} steps "
                    f"the batch sweep trains at validate.batch_sizes[{len(v.batch_sizes) - 1}]={largest} "
                    f"({spec.validate_horizon()} steps × the base batch {spec.base_batch()} / {largest}, a fixed "
                    "token budget): lower warmup_steps, raise validate.steps, drop the largest batch size or set "
                    "validate.batch_fixed: steps"]
        return []

    def lines(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret]) -> list[str]:
        """Per width: the drift beside the rules, then the regret line."""
        return [line for d in drifts for line in (f"Batch size: {rules_text(d)}.",
                                                  *Sweep.lines(self, spec, [d], regrets))]

    def section(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret],
                table: pd.DataFrame | None) -> tuple[list[str], list[str]]:
        """The drift beside the rules and the regret lines in bold, then every regret as a table."""
        import pandas as pd

        from analysis.report import markdown_table

        if not drifts and not regrets:
            return [], []
        v = spec.validate_
        held = (f"a fixed token budget: {spec.validate_horizon()} steps at the base batch size {spec.base_batch()}, "
                "round(steps · base / B) at batch size B" if v is None or v.batch_fixed == "tokens" else
                f"fixed steps: {spec.validate_horizon()} at every batch size")
        frame = pd.DataFrame([{"width": r.width, "parametrization": r.parametrization, "batch size": r.at,
                               "carried lr": r.transferred, "optimum": r.optimum, "optimum_loss": r.optimum_loss,
                               "regret (nats)": r.regret, "regret %": r.regret_pct,
                               "95 % CI (nats)": f"[{r.ci[0]:+.3g}, {r.ci[1]:+.3g}]" if r.ci else "—",
                               "seeds": r.n_seeds, "note": r.note or "—"} for r in regrets])
        return [], [f"Batch sweep ({held}):", *(f"**{line}**" for line in self.lines(spec, drifts, regrets)),
                    *([markdown_table(frame)] if regrets else [])]

    def flag(self, spec: StudySpec, drifts: Sequence[LRDrift] = ()) -> str | None:
        """A warning when tune's batch (tune.batch_size) differs from the target's (train.batch_size): with this
        sweep's drifts, how far mup's optimum moves to the target's batch; without, how to measure it."""
        tune, target = spec.base_batch(), spec.train.batch_size
        if spec.compare is not None or tune == target:
            return None
        doublings = math.log2(target / tune)
        said = (f"tune trains at batch size {tune}, the target at {target} (train.batch_size; {abs(doublings):.2g} "
                f"doublings {'larger' if doublings > 0 else 'smaller'})")
        measured = [d for d in drifts if d.optima]
        if measured:
            moved = ", ".join(f"{d.mup_drift * doublings:+.2f}" for d in measured)
            lines = "; ".join(rules_text(d) for d in measured)
            return (f"{said}: {lines}; so the optimal lr at batch size {target} lies ≈ {moved} log2(lr) from the "
                    f"optimum at the batch size {tune} tune trained at")
        if spec.validate_ is not None and self.present(spec.validate_):
            return f"{said}: the validate batch sweep (validate.batch_sizes) will measure how far the lr optimum moves"
        low, high = sorted((tune, target))
        return (f"{said}: the lr optimum may move with the batch size (the √B rule: +0.5 log2(lr) per doubling, the "
                f"linear rule: +1.0): measure it with validate.batch_sizes: [{low}, ..., {high}]")


SWEEP = Batch()
Fields.sweep = SWEEP
