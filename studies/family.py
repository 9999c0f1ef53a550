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
one `register` call (its arch, config and space classes beside it). The built-in families are registered at the
end of this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from studies import budget
from studies.arch import BertArch, BertConfig, PTArch, PTConfig, TauArch, TauConfig, UTArch, UTConfig
from studies.space import BaselineSpace, SearchSpace, Space, TauSpace

Objective = Literal["mlm", "clm"]


@dataclass(frozen=True)
class Family:
    """One model family (module docstring)."""

    name: str
    arch: type[BaseModel]  # what a study fixes (`model.arch`)
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


def _pt_may_vanish(hp: dict[str, Any]) -> tuple[str, ...]:
    """With r ∝ width the random initial part of PT's 1/r head logits vanishes as r^-1/2 (μP allows it)."""
    return ("head_logits",) if hp.get("paradigm") == "rank" else ()


def _builtins() -> None:
    common = {"head_dim": 16, "max_len": 32}
    register(Family("pt", PTArch, PTConfig, SearchSpace, "workers.models.pt:ProbabilisticTransformer",
                    coord_hp={"n_channels": 2, "rank": 8, "n_iter": 3, "gamma": 3}, coord_may_vanish=_pt_may_vanish,
                    param_count=budget.pt_params, forward_flops=budget.pt_flops, width_multiples=True))
    # BERT and UT: heads of 16 dims, positions for the check's 32-token sequences, init_std 0.15 at the base width
    # 32 (≈ 0.85/√32, the order of BERT's 0.02 ≈ 0.55/√768 relative to fan-in; with 0.02 the random part is so
    # small at d0 = 32 that the first updates' attention logits shrink with width: slopes to −0.6 under μP)
    register(Family("bert", BertArch, BertConfig, BaselineSpace, "workers.models.bert:Bert",
                    coord_hp={"n_layers": 2, **common, "init_std": 0.15},
                    param_count=budget.bert_params, forward_flops=budget.bert_flops))
    register(Family("ut", UTArch, UTConfig, BaselineSpace, "workers.models.universal:UniversalTransformer",
                    coord_hp={"n_steps": 3, **common, "init_std": 0.15},
                    param_count=budget.ut_params, forward_flops=budget.ut_flops))
    # TauGPT widens by heads at a fixed head_dim (the Laplacian's size): 2 heads at width 32, 16 at 256
    register(Family("tauformer", TauArch, TauConfig, TauSpace, "workers.models.tauformer:TauGPT", objective="clm",
                    readout="lm_logits", coord_hp={"n_layers": 2, **common}, metric_prefixes=("tau.",),
                    flag_tags={"tau.collapse.": "taumode_collapse"}))  # `analysis.taumode.collapse_warning`'s flags


_builtins()
