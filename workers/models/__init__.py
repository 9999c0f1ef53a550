"""Model registry: `build_model(name, **hp)` turns a family name and hyperparameters into a model.

Each family is one file in this folder with a frozen `Config` dataclass beside its `nn.Module`.
Every model exposes `groups` (parameter group → parameters), `lr_multipliers()` (group → factor on
the base learning rate; μP lives here) and `forward(input_ids, attention_mask, trace=None, select=None)`;
a model may define `aux_loss()` (a term `train_trial` adds to the MLM loss, e.g. UT's ACT ponder cost).
"""

from __future__ import annotations

from dataclasses import fields

from torch import nn

from workers.models.bert import Bert, BertConfig
from workers.models.pt import ProbabilisticTransformer, PTConfig
from workers.models.universal import UniversalTransformer, UTConfig

MODELS = {
    "pt": (PTConfig, ProbabilisticTransformer),
    "bert": (BertConfig, Bert),
    "ut": (UTConfig, UniversalTransformer),
}


def build_model(name: str, **hp) -> nn.Module:
    """Build model `name` from keyword hyperparameters; unknown keys raise a ValueError listing valid ones."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: choose one of {sorted(MODELS)}")
    config_cls, model_cls = MODELS[name]
    valid = {f.name for f in fields(config_cls)}
    unknown = sorted(set(hp) - valid)
    if unknown:
        raise ValueError(f"unknown {name} hyperparameter(s) {unknown}: valid ones are {sorted(valid)}")
    return model_cls(config_cls(**hp))
