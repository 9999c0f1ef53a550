"""The optimizer sweep (`validate.optimizers`): what the study's optimizer (train.optimizer) buys over each listed one,
both transferred. Each listed optimizer's lr is swept at every validate width under mup, the other hparams at the
centre, `-o<optimizer>` in the trial key (`validate-mup-w64-oadamw-lr0.01-s0`); the study's own optimizer is the
width sweep's mup rows. `analysis.optimizer_gain` carries each optimizer's own optimum at the narrowest width to the
widest and compares them there, seed by seed: the final eval loss at equal tokens, and the tokens the study's
optimizer needs to reach the other's final loss. The lr is each optimizer's own; the other hparams are the study's
tuned centre for both (the information weights are the model's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field, field_validator

import analysis
from analysis.constants import Axis
from studies.arch import Optimizer
from studies.sweeps.base import Judged, Sweep

if TYPE_CHECKING:
    import pandas as pd

    from analysis import LRDrift, OptimizerGain, Regret
    from studies.phases.base import Artifacts
    from studies.plan import PlannedTrial
    from studies.spec import StudySpec
    from studies.sweeps import ValidateSpec


class Fields(BaseModel):
    sweep: ClassVar[Sweep]  # set below: this sweep
    optimizers: list[Optimizer] | None = Field(
        None, description="optimizers train.optimizer is compared with, e.g. [adamw]: each's lr swept at every "
                          "validate width under mup, each carried from the narrowest to the widest, where the report "
                          "gives the loss at equal tokens and the speed-up in tokens (2–4 widths)")

    @field_validator("optimizers")
    @classmethod
    def _optimizers(cls, values: list[str] | None) -> list[str] | None:
        if values is not None and (not values or len(set(values)) != len(values)):
            raise ValueError(f"optimizers {values}: list each optimizer once, e.g. [adamw], or leave optimizers out")
        return values


class OptimizerSweep(Sweep):
    name: ClassVar[str] = "optimizer"
    key: ClassVar[str] = "optimizers"
    forecast: ClassVar[bool] = False  # another optimizer's optimum is not the study's
    alone: ClassVar[bool] = False  # it reads the width sweep's rows
    axis = Axis(name="optimizer", column="optimizer", words="optimizer")
    header: ClassVar[str] = "optimizer"
    legend: ClassVar[str] = "{}"
    caption: ClassVar[str] = "optimizer"

    def present(self, v: ValidateSpec) -> bool:
        return bool(v.optimizers)

    def trials(self, spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
        from studies.plan import PlannedTrial

        v = spec.validate_
        assert v is not None
        return [PlannedTrial(f"validate-mup-w{w}-o{o}-lr{x:.3g}-s{s}", "validate", w, s, {**centre, "lr": x},
                             parametrization="mup", swept="lr", sweep=self.name, at={"optimizer": o})
                for o in v.optimizers or [] for w in v.widths for x in v.lrs for s in range(v.seeds)]

    def apply(self, spec: StudySpec, at: Mapping[str, Any], config: dict[str, Any]) -> None:
        from studies.spec import MUON_KNOBS, TrainSpec

        config["optimizer"] = at["optimizer"]
        if at["optimizer"] != "muon":  # Muon's knobs are refused beside another optimizer
            config.update({k: TrainSpec.model_fields[k].default for k in MUON_KNOBS})

    def problems(self, spec: StudySpec) -> list[str]:
        from studies.family import get_family

        v = spec.validate_
        assert v is not None
        other = "muon" if spec.train.optimizer == "adamw" else "adamw"
        problems = [f"validate.optimizers[{i}]={o!r} is train.optimizer already: list the optimizers to compare it "
                    f"with, e.g. [{other}]" for i, o in enumerate(v.optimizers or []) if o == spec.train.optimizer]
        if "muon" in (v.optimizers or []) and get_family(spec.model.family).mup is not None:
            problems.append(f"validate.optimizers: model.family {spec.model.family!r} trains with mup's own "
                            "optimiser, which Muon cannot replace: drop muon from validate.optimizers")
        return problems

    # ----------------------------------------------------------------------------- the judgement
    def rows(self, table: pd.DataFrame) -> pd.DataFrame:
        """Its rows and the width sweep's mup lr rows (the study's own optimizer: `optimizer` empty)."""
        swept = table["swept"].fillna("lr") if "swept" in table else "lr"
        width = (table["sweep"] == "width") & (swept == "lr") & (table["parametrization"] == "mup")
        return table[(table["sweep"] == self.name) | width]

    def gains(self, spec: StudySpec, table: pd.DataFrame | None) -> list[OptimizerGain]:
        """train.optimizer against each of validate.optimizers (`analysis.optimizer_gain`); [] without rows."""
        v = spec.validate_
        if table is None or v is None or not v.optimizers or "sweep" not in table:
            return []
        rows = self.rows(table)
        own = spec.train.optimizer  # the width sweep's rows (no `optimizer`)
        rows = rows.assign(optimizer=rows["optimizer"].fillna(own) if "optimizer" in rows else own)
        return [analysis.optimizer_gain(rows[rows["optimizer"].isin([own, o])], own, o) for o in v.optimizers]

    def judge(self, spec: StudySpec, rows: pd.DataFrame, centre: Mapping[str, float], out: Artifacts) -> Judged:
        """The comparisons as an artifact (`optimizers.json`); they are told from the trial table."""
        out.write_artifact("optimizers.json", [g.model_dump(mode="json") for g in self.gains(spec, rows)])
        return Judged()

    # ----------------------------------------------------------------------------- what it says
    def told(self, spec: StudySpec, table: pd.DataFrame | None) -> list[str]:
        return [analysis.gain_line(g) for g in self.gains(spec, table)]

    def section(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret],
                table: pd.DataFrame | None) -> tuple[list[str], list[str]]:
        return [], [f"**{line}**" for line in self.told(spec, table)]

    def summary(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret],
                table: pd.DataFrame | None) -> tuple[list[str], Any]:
        return self.told(spec, table), None


SWEEP = OptimizerSweep()
Fields.sweep = SWEEP
