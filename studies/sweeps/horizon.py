"""The horizon sweep (`validate.steps` a list of 2–4 step counts): lr swept at each training length at every
validate width (the main horizon's rows are the width sweep's: `StudySpec.validate_horizon`), `-t<steps>` in the
trial key; the optimum's drift per doubling of the steps at each width, and the flag on tune's setup when tune trains
fewer steps than the target."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from analysis.constants import Axis
from studies.sweeps.base import Sweep

if TYPE_CHECKING:
    import pandas as pd

    from analysis import LRDrift
    from studies.plan import PlannedTrial
    from studies.spec import StudySpec
    from studies.sweeps import ValidateSpec


class Horizon(Sweep):
    name: ClassVar[str] = "horizon"
    key: ClassVar[str] = "steps"
    axis = Axis(name="horizon", column="horizon", words="training steps")
    header: ClassVar[str] = "steps"
    legend: ClassVar[str] = "{} steps"
    figure: ClassVar[str | None] = "horizon"
    caption: ClassVar[str] = "horizon"
    flag_label: ClassVar[str] = "horizon"
    drift_key: ClassVar[str] = "horizon"
    verdict_words: ClassVar[str] = "horizon"

    def present(self, v: ValidateSpec) -> bool:
        return bool(v.horizons())

    def trials(self, spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
        """lr at each listed step count but the main horizon (the width sweep trains that one), every
        (parametrization, width, lr, seed): `validate-mup-w64-t150-lr0.004-s0`."""
        from studies.plan import PlannedTrial

        v = spec.validate_
        assert v is not None
        main = spec.validate_horizon()
        return [PlannedTrial(f"validate-{p}-w{w}-t{t}-lr{x:.3g}-s{s}", "validate", w, s, {**centre, "lr": x},
                             parametrization=p, swept="lr", sweep=self.name, at={"horizon": t})
                for p in v.parametrizations for w in v.widths for t in v.horizons() if t != main
                for x in v.lrs for s in range(v.seeds)]

    def apply(self, spec: StudySpec, at: Mapping[str, Any], config: dict[str, Any]) -> None:
        config["steps"] = at["horizon"]

    def problems(self, spec: StudySpec) -> list[str]:
        v = spec.validate_
        assert v is not None
        shortest = min(v.horizons())
        if spec.train.warmup_steps >= shortest:
            return [f"train.warmup_steps={spec.train.warmup_steps} must be < validate.steps[0]={shortest}: lower "
                    "warmup_steps or raise the shortest horizon"]
        return []

    def rows(self, table: pd.DataFrame) -> pd.DataFrame:
        """lr's rows at every horizon: its own and the width sweep's at the main horizon."""
        swept = table["swept"].fillna("lr") if "swept" in table else "lr"
        return table[table["sweep"].isin(["width", self.name]) & (swept == "lr") & table["horizon"].notna()]

    def flag(self, spec: StudySpec, drifts: Sequence[LRDrift] = ()) -> str | None:
        """A warning when the lr tuned at the proxy may not be the target's because of training length: tune trains
        fewer steps than the transfer runs (with the drift per doubling of steps that a horizon sweep measured, or
        how to measure it), or a horizon sweep shows mup's optimum drifting past `validate.drift_threshold`."""
        if spec.compare is not None:  # a compare study's budgets set every length
            return None
        tune, target = spec.steps_for("tune"), spec.train.steps
        measured = "; ".join(f"at width {d.width} mup's optimal lr drifts {d.mup_drift:+.2f}"
                             + (f" [{c[0]:+.2f}, {c[1]:+.2f}]" if (c := d.drift_ci.get("mup")) else "")
                             + " log2(lr) per doubling of steps" for d in drifts if d.optima)
        if tune < target:
            doublings = math.log2(target / tune)
            said = f"tune trains {tune} steps, the target {target} (train.steps; {doublings:.2g} doublings longer)"
            if measured:
                moved = ", ".join(f"{d.mup_drift * doublings:+.2f}" for d in drifts)
                return (f"{said}: {measured}, so the optimal lr at {target} steps lies ≈ {moved} log2(lr) from the "
                        f"optimum at the {tune} steps tune trained")
            how = ("the validate horizon sweep (validate.steps) will measure how far the lr optimum moves"
                   if spec.validate_ is not None and self.present(spec.validate_) else
                   f"the lr optimum may move with training length: measure it with validate.steps: [{tune}, ..., "
                   f"{target}]")
            return f"{said}: {how}"
        if any(not d.passed for d in drifts):
            return f"the lr optimum moves with training length ({measured}): tune at the target's training length"
        return None


SWEEP = Horizon()


class Fields(BaseModel):
    """The horizon sweep adds no field: `validate.steps` as a list asks for it."""

    sweep: ClassVar[Sweep] = SWEEP
