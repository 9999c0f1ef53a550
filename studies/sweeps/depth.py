"""The depth sweep (`validate.depths`): lr swept at 2–4 depths (model.arch's n_layers; UT: n_steps) at the first of
`validate.widths` under the model's parametrization, under CompleteP and none (`DEPTH_SWEEP`), the other hparams at
the centre, `-L<depth>` in the trial key and the depth parametrization in place of the parametrization
(`validate-completep-w64-L8-lr0.004-s0`); the optimum's drift per doubling of depth under each, CompleteP's judged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field, field_validator

from analysis.constants import Axis
from studies.arch import DEPTH_SWEEP, DepthArch, PosInt
from studies.family import FAMILIES
from studies.sweeps.base import Sweep, increasing

if TYPE_CHECKING:
    import pandas as pd

    from analysis import LRDrift, Regret
    from studies.phases.base import Verdict
    from studies.plan import PlannedTrial
    from studies.spec import StudySpec
    from studies.sweeps import ValidateSpec


class Fields(BaseModel):
    sweep: ClassVar[Sweep]  # set below: this sweep
    depths: list[PosInt] | None = Field(
        None, description="2–4 strictly increasing depths (model.arch's n_layers; UT: n_steps): lr is also swept at "
                          "each, at the first of validate.widths, under model.arch.depth_parametrization (completep) "
                          "and none beside it (the lr optimum's drift per doubling of depth)")

    @field_validator("depths")
    @classmethod
    def _depths(cls, depths: list[int] | None) -> list[int] | None:
        return increasing(depths, f"depths {depths}: give 2–4 strictly increasing depths (n_layers; UT: n_steps), "
                                  "e.g. [2, 4, 8], or leave depths out")


class Depth(Sweep):
    name: ClassVar[str] = "depth"
    key: ClassVar[str] = "depths"
    forecast: ClassVar[bool] = False
    axis = Axis(name="depth", column="depth", words="depth", judged=("completep", "none"))
    header: ClassVar[str] = "depth"
    legend: ClassVar[str] = "depth {}"
    figure: ClassVar[str | None] = "depth"
    caption: ClassVar[str] = "depth"
    drift_key: ClassVar[str] = "depth"
    verdict_words: ClassVar[str] = "depth"

    def present(self, v: ValidateSpec) -> bool:
        return bool(v.depths)

    def trials(self, spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
        from studies.plan import PlannedTrial

        v = spec.validate_
        assert v is not None
        width = v.widths[0]
        return [PlannedTrial(f"validate-{d}-w{width}-L{depth}-lr{x:.3g}-s{s}", "validate", width, s,
                             {**centre, "lr": x}, swept="lr", sweep=self.name,
                             at={"depth": depth, "depth_parametrization": d})
                for d in DEPTH_SWEEP for depth in v.depths or [] for x in v.lrs for s in range(v.seeds)]

    def apply(self, spec: StudySpec, at: Mapping[str, Any], config: dict[str, Any]) -> None:
        """The arch at that depth under that depth parametrization (`DepthArch.at_depth`)."""
        arch = spec.model.arch
        assert isinstance(arch, DepthArch)
        hp = {k: v for k, v in config["model_hp"].items() if k not in arch.model_dump()}
        config["model_hp"] = {**arch.at_depth(at["depth"], at["depth_parametrization"]).model_dump(), **hp}

    def problems(self, spec: StudySpec) -> list[str]:
        """A family with a depth (`DepthArch`) at depth_parametrization completep."""
        depths, arch = spec.validate_.depths if spec.validate_ is not None else None, spec.model.arch
        if not isinstance(arch, DepthArch):
            deep = [name for name, f in FAMILIES.items() if issubclass(f.arch, DepthArch)]
            return [f"validate.depths={depths}: model.family {spec.model.family!r} has no depth parametrization to "
                    f"sweep (its arch is not a DepthArch): drop validate.depths, or use one of {deep}"]
        if arch.depth_parametrization != "completep":
            return [f"validate.depths={depths} compares model.arch.depth_parametrization completep with none, but it "
                    f"is {arch.depth_parametrization!r}: set model.arch.depth_parametrization: completep (and "
                    f"base_depth, the depth tuned at), or drop validate.depths"]
        return []

    def rows(self, table: pd.DataFrame) -> pd.DataFrame:
        """Its rows, `parametrization` holding their depth parametrization (as `analysis.lr_drift` judges it)."""
        rows = table[table["sweep"] == self.name]
        return rows.assign(parametrization=rows["depth_parametrization"], depth=rows["depth"].astype(int))

    def metrics(self, drifts: Sequence[LRDrift], regrets: Sequence[Regret]) -> dict[str, float]:
        return {f"lr_depth_drift.{p}": x for d in drifts for p, x in d.drift.items()}

    def columns(self, spec: StudySpec, verdict: Verdict) -> list[tuple[int, str]]:
        from studies.phases.base import DRIFTS, PASS

        return [*verdict.shown(PASS, "tags", r"lr_depth_drift_passed"),
                *verdict.shown(DRIFTS, "metrics", r"lr_depth_drift\.\w+")]


SWEEP = Depth()
Fields.sweep = SWEEP
