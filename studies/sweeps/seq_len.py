"""The context sweep (`validate.seq_lens`): lr swept at 2–4 sequence lengths at every validate width under each
parametrization, the other hparams at the centre, `-c<seq_len>` in the trial key (`validate-mup-w64-c128-lr0.004-s0`);
the tokens per step held fixed by default (a trial at context L trains at batch round(B · L_base / L), B
train.batch_size, L_base data.seq_len; `validate.seq_fixed: steps` keeps the batch), the steps the validate
horizon's. Judged per width into the lr optimum's drift per doubling of the context and the regret of carrying the
base context's optimal lr (data.seq_len's, the one tune trains at, else the swept context nearest it in log2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator

from analysis.constants import Axis
from studies.arch import PosInt, context_length
from studies.sweeps.base import Sweep, increasing

if TYPE_CHECKING:
    from studies.plan import PlannedTrial
    from studies.spec import StudySpec
    from studies.sweeps import ValidateSpec


class Fields(BaseModel):
    sweep: ClassVar[Sweep]  # set below: this sweep
    seq_lens: list[PosInt] | None = Field(
        None, description="2–4 strictly increasing sequence lengths: lr is also swept at each, at every validate "
                          "width (the lr optimum's drift per doubling of the context)")
    seq_fixed: Literal["tokens", "steps"] = Field(
        "tokens", description="what the context sweep holds fixed beside the steps: 'tokens' per step (a trial at "
                              "context L trains at batch round(train.batch_size · data.seq_len / L)) or 'steps' "
                              "alone (the batch stays train.batch_size: tokens grow with L)")

    @field_validator("seq_lens")
    @classmethod
    def _seq_lens(cls, values: list[int] | None) -> list[int] | None:
        return increasing(values, f"seq_lens {values}: give 2–4 strictly increasing sequence lengths, e.g. "
                                  "[64, 128, 256], or leave seq_lens out")


def seq_batch(spec: StudySpec, seq_len: int) -> int:
    """The batch of a context sweep's trial at `seq_len`: train.batch_size, scaled by data.seq_len / seq_len at
    fixed tokens per step (`validate.seq_fixed: tokens`, at least 1 sequence)."""
    batch = spec.batch_for("validate")
    if spec.validate_ is not None and spec.validate_.seq_fixed == "steps":
        return batch
    return max(1, round(batch * spec.data.seq_len / seq_len))


class SeqLen(Sweep):
    name: ClassVar[str] = "seq_len"
    key: ClassVar[str] = "seq_lens"
    axis = Axis(name="seq_len", column="seq_len", words="context length")
    header: ClassVar[str] = "context"
    legend: ClassVar[str] = "context {}"
    figure: ClassVar[str | None] = "seq_len"
    caption: ClassVar[str] = "context"
    drift_key: ClassVar[str] = "seq_len"
    verdict_words: ClassVar[str] = "context"
    regret_key: ClassVar[str] = "c"
    regret_title: ClassVar[str] = "Context"
    regret_label: ClassVar[str] = "context"

    def present(self, v: ValidateSpec) -> bool:
        return bool(v.seq_lens)

    def trials(self, spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
        from studies.plan import PlannedTrial

        v = spec.validate_
        assert v is not None
        return [PlannedTrial(f"validate-{p}-w{w}-c{c}-lr{x:.3g}-s{s}", "validate", w, s, {**centre, "lr": x},
                             parametrization=p, swept="lr", sweep=self.name,
                             at={"seq_len": c, "batch_size": seq_batch(spec, c)})
                for p in v.parametrizations for w in v.widths for c in v.seq_lens or [] for x in v.lrs
                for s in range(v.seeds)]

    def apply(self, spec: StudySpec, at: Mapping[str, Any], config: dict[str, Any]) -> None:
        config["data"] = {**config["data"], "seq_len": at["seq_len"]}
        config["batch_size"] = at["batch_size"]

    def base(self, spec: StudySpec) -> int:
        return spec.data.seq_len

    def problems(self, spec: StudySpec) -> list[str]:
        """Every context fits the model (its position rows: `Arch.context`)."""
        v = spec.validate_
        assert v is not None
        found = context_length(spec.model.arch)
        return [f"validate.seq_lens[{i}]={c} exceeds model.arch.{found[0]} {found[1]}, the longest sequence the model "
                f"takes: set model.arch.{found[0]} to at least {c}, or drop it from validate.seq_lens"
                for i, c in enumerate(v.seq_lens or []) if found is not None and found[1] < c]


SWEEP = SeqLen()
Fields.sweep = SWEEP
