"""The `compare` section of a `StudySpec`: model families at equal parameter budgets (the μP-PT paper's §3.2).

The study's own `model` is tuned once, at the width that meets `proxy_budget`, and its hparams are carried
zero-shot to the width of every budget (μP). Each `baselines` entry is tuned afresh at every budget (the
paper tuned BERT and UT at every scale). Every final run trains on the same number of tokens.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationInfo,
    field_validator,
    model_validator,
)

from studies.arch import nested
from studies.budget import width_for_budget
from studies.model import ModelSpec, validate_space
from studies.schema import FamilySpace, by_family

_STRICT = ConfigDict(extra="forbid", frozen=True)
PosInt = Annotated[int, Field(gt=0)]


class BaselineSpec(BaseModel):
    """A family tuned at every budget: its model, its search space and its tune trials per budget."""

    model_config = _STRICT

    model: ModelSpec = Field(description="family (e.g. bert, ut), parametrization and arch")
    space: FamilySpace = Field(None, validate_default=True,
                               description="the family's search space (None: its defaults)")
    num_trials: PosInt = Field(8, description="tune trials at each budget")

    @field_validator("space", mode="wrap")
    @classmethod
    def _space_of_family(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        model = info.data.get("model")
        return validate_space(value, model.family if model is not None else "pt", **nested(info))

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        """One variant per family a compare study takes, with its arch and space (`studies.schema`)."""
        json_schema: dict[str, Any] = handler(schema)
        by_family(json_schema, handler, ModelSpec.model_fields["family"].default, study=False)
        return json_schema


def _increasing(budgets: list[float]) -> list[float]:
    if any(b <= a for a, b in zip(budgets, budgets[1:], strict=False)):
        raise ValueError(f"budgets {budgets} must be strictly increasing, e.g. [5e5, 1e6, 2e6]")
    return budgets


class CompareSpec(BaseModel):
    """Families at equal parameter counts, each trained on `tokens` tokens; eval loss vs params and FLOPs."""

    model_config = _STRICT

    budgets: list[Annotated[float, Field(gt=0)]] = Field(
        min_length=1, description="parameter counts, increasing; each family's width is solved to meet each")
    proxy_budget: float | None = Field(
        None, gt=0, description="the study's model is tuned at the width of this count (None: the smallest budget)")
    tokens: PosInt = Field(description="training tokens of every final run: steps = ⌈tokens / (batch · seq_len)⌉")
    tune_tokens: PosInt | None = Field(None, description="training tokens of each tune trial (None: tokens)")
    seeds: PosInt = Field(2, description="seeds of every final run (the spread in the table and plot)")
    tolerance: float = Field(0.02, gt=0, lt=1, description="largest relative miss of a budget by the solved width")
    baselines: list[BaselineSpec] = Field(min_length=1, description="families tuned at every budget")

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, budgets: list[float]) -> list[float]:
        return _increasing(budgets)

    @model_validator(mode="after")
    def _distinct(self) -> CompareSpec:
        families = [b.model.family for b in self.baselines]
        if len(set(families)) != len(families):
            raise ValueError(f"compare.baselines lists families {families}: list each family once")
        return self

    def problems(self, model: ModelSpec, vocab_size: int, base_width: int, other_phases: list[str]) -> list[str]:
        """What is wrong with this section in a study of `model`: other phases asked for, a family listed twice,
        a budget no width meets (checked with the vocabulary cap; the driver re-solves with the real vocabulary)."""
        problems = []
        if other_phases:
            problems.append(f"a compare study runs the compare phase only: remove {other_phases} (or set them "
                            "to null)")
        families = [model.family] + [b.model.family for b in self.baselines]
        if len(set(families)) != len(families):
            problems.append(f"compare families {families} repeat one: model.family is tuned once and "
                            "transferred, each baseline is tuned at every budget; list each family once")
        from studies.family import FAMILIES, get_family

        causal = [f for f in families if get_family(f).objective != "mlm"]
        if causal:
            mlm = [name for name, f in FAMILIES.items() if f.objective == "mlm"]
            return problems + [f"compare families {families} include {', '.join(causal)}, a causal LM: a compare "
                               f"study pairs the MLM families ({', '.join(mlm)}) on one objective; compare TauGPT "
                               "with its dot-product twin through model.arch.attention instead"]
        for m in [model, *(b.model for b in self.baselines)]:
            for budget in sorted({*self.budgets, self.proxy()}):
                try:
                    width_for_budget(m.family, m.arch, budget, vocab_size, base_width, self.tolerance)
                except ValueError as err:
                    problems.append(f"compare.budgets: {err}")
        return problems

    def proxy(self) -> float:
        """The budget the study's own model is tuned at."""
        return self.proxy_budget if self.proxy_budget is not None else self.budgets[0]

    def steps(self, tokens: int, batch_size: int, seq_len: int) -> int:
        """Optimizer steps that see `tokens` tokens at `batch_size` sequences of `seq_len`."""
        return math.ceil(tokens / (batch_size * seq_len))
