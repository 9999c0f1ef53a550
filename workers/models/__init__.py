"""Model registry: `build_model(name, **hp)` turns a family name and hyperparameters into a model.

Each family is one file in this folder with its `nn.Module`; its config (the arch, width, parametrization and
hparams, validated) is declared once in `studies.arch` (`CONFIGS`). Every model exposes `groups` (parameter group →
parameters), `lr_multipliers()` (group → factor on the base learning rate; μP lives here) and `forward(input_ids,
attention_mask, trace=None, select=None)`; a model may define `aux_loss()` (a term `train_trial` adds to the loss,
e.g. UT's ACT ponder cost), `objective` (the data objective it trains with: "mlm" unless it says "clm", like
TauGPT) and `calibrate`/`monitor` (TauGPT's τ)."""

from __future__ import annotations

from torch import nn

from studies.arch import CONFIGS
from workers.errors import ConfigError
from workers.models.bert import Bert
from workers.models.pt import ProbabilisticTransformer
from workers.models.tauformer import TauGPT
from workers.models.universal import UniversalTransformer

MODELS: dict[str, type[nn.Module]] = {
    "pt": ProbabilisticTransformer,
    "bert": Bert,
    "ut": UniversalTransformer,
    "tauformer": TauGPT,
}


def build_model(name: str, **hp) -> nn.Module:
    """Build model `name` from keyword hyperparameters; unknown keys raise a ValueError listing valid ones."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}: choose one of {sorted(MODELS)}")
    config_cls = CONFIGS[name]
    unknown = sorted(set(hp) - set(config_cls.model_fields))
    if unknown:
        valid = sorted(config_cls.model_fields)
        raise ConfigError(f"unknown {name} hyperparameter(s) {unknown}: valid ones are {valid}")
    return MODELS[name](config_cls(**hp))


def objective_of(name: str) -> str:
    """The data objective model `name` trains with: "clm" (next tokens) or "mlm" (masked tokens)."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}: choose one of {sorted(MODELS)}")
    return getattr(MODELS[name], "objective", "mlm")


READOUT = {"pt": "mlm_logits", "bert": "mlm_logits", "ut": "mlm_logits", "tauformer": "lm_logits"}
"""The name each family's output logits have in a `trace` (the coordinate check's one-sided output)."""
