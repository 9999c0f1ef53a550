"""The model families, each one registration: `register(Family(...))` is everything the rest of ptctl knows
about a family.

A `Family` names its fixed architecture (`model.arch`), its model config (the arch plus a trial's width,
parametrization and hparams), its search space, the data objective it trains with, the trace name of its output
logits (the coordinate check's one-sided readout), the coordinate check's small model and the activations it
lets vanish, the per-step metrics its monitoring adds and the MLflow tags they raise, its parameter and FLOP
counts (`studies.budget`; a family without them cannot join a compare study) and its `nn.Module` — as a
"module:Class" path, so `studies` imports no torch (`workers.models.build_model` imports it). `ModelSpec.family`,
`TrialConfig.model`, the arch and space a study validates and the objective it defaults to are all looked up
here; `family_names()` is the list every error message and schema offers.

Adding a family that needs no new training hook: its model file (a `workers.models.contract.LanguageModel`) and
one `register` call (its arch, config and space classes beside it). The built-in families are one module each
under `studies/families/`, which registers them when `studies` is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from studies.space import Space

Objective = Literal["mlm", "clm"]


@dataclass(frozen=True)
class Family:
    """One model family (module docstring)."""

    name: str
    arch: type[BaseModel]  # what a study fixes (`model.arch`): a `studies.arch.Arch`, or a model with `width_steps`
    config: type[BaseModel]  # what the model is built from: the arch, `ModelSize` and the hparams
    space: type[Space]  # the search space of its hparams
    model: str | type  # its nn.Module: "module:Class" (imported by `workers.models`), or the class itself
    objective: Objective = "mlm"  # masked tokens, or next tokens ("clm")
    readout: str = "mlm_logits"  # the output logits' name in a trace
    coord_hp: dict[str, Any] = field(default_factory=dict)  # the coordinate check's small model
    # the coordinate check's model hparams -> the activations (name prefixes) μP lets shrink with width, judged
    # one-sidedly like the readout
    coord_may_vanish: Callable[[dict[str, Any]], tuple[str, ...]] = lambda hp: ()
    metric_prefixes: tuple[str, ...] = ()  # per-step metrics its `eval_metrics` hook adds (kept by the runners)
    flag_tags: dict[str, str] = field(default_factory=dict)  # metric prefix -> the trial run's tag when one is nonzero
    param_count: Callable[..., int] | None = None  # (arch, width, vocab_size, base_width) -> parameters
    forward_flops: Callable[..., dict[str, float]] | None = None  # (arch, width, vocab, seq_len, n_dec, base_width)
    width_multiples: bool = False  # the budget solver steps by `width_step` (PT) instead of every integer

    @property
    def comparable(self) -> bool:
        """Whether a compare study takes this family: an MLM family with parameter and FLOP counts."""
        return self.objective == "mlm" and self.param_count is not None and self.forward_flops is not None


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add `family` to the registry (a name registered again is replaced: a reloaded module re-registers)."""
    FAMILIES[family.name] = family
    return family


def family_names() -> list[str]:
    """The registered families, in registration order."""
    return list(FAMILIES)


def get_family(name: str) -> Family:
    """The family registered as `name`; a `ValueError` listing the registered ones if none is."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}: choose one of {family_names()}")
    return FAMILIES[name]
