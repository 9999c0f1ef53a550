"""Model registry, workers side: `build_model(name, **hp)` turns a family name and hyperparameters into a model.

Each family is registered once, in `studies.family` (torch-free): its config (the arch, width, parametrization and
hparams, validated), its objective, readout and the "module:Class" of its `nn.Module`, which is imported here on
first use. Every model is a `workers.models.contract.LanguageModel`: it owns its loss and may hook the trainer.
"""

from __future__ import annotations

import importlib
from typing import Any

from studies.arch import ModelSize
from studies.family import BROKEN, ENTRY_POINT_GROUP, Family, get_family
from workers.errors import ConfigError
from workers.models.contract import LanguageModel


def family(name: str) -> Family:
    """The registration of family `name`; a `ConfigError` listing the registered ones if there is none, and saying
    that a plugin's family needs its package here (a Ray worker registers the plugins installed on its node)."""
    try:
        return get_family(name)
    except ValueError as err:
        hint = "" if name in BROKEN else (
            f"; if {name!r} is a plugin's family, the package that provides it (its {ENTRY_POINT_GROUP!r} entry "
            "point) must be installed in this Python environment: on a Ray cluster, on every node")
        raise ConfigError(f"{err}{hint}") from None


def model_class(name: str) -> type[LanguageModel]:
    """The `nn.Module` class of family `name` (its registered "module:Class", imported)."""
    model = family(name).model
    if isinstance(model, str):
        module, _, cls = model.partition(":")
        try:
            model = getattr(importlib.import_module(module), cls)
        except ModuleNotFoundError as err:
            if err.name != "mup":
                raise
            raise ConfigError(f"model family {name!r} needs the package mup, which is not installed: pip install "
                              "--no-deps mup==1.0.0 (`make install` does; --no-deps: mup declares torchvision, "
                              "which it never imports)") from None
    return model


def build_model(name: str, **hp: Any) -> LanguageModel:
    """Build model `name` from keyword hyperparameters; unknown keys raise a ValueError listing the valid ones a user
    sets (`--set`, `model_hp`): the arch's fields and the hparams, not the sizes a trial adds (`ModelSize`)."""
    config_cls = family(name).config
    unknown = sorted(set(hp) - set(config_cls.model_fields))
    if unknown:
        valid = sorted(set(config_cls.model_fields) - set(ModelSize.model_fields))
        raise ConfigError(f"unknown {name} hyperparameter(s) {unknown}: valid ones are {valid}")
    return model_class(name)(config_cls(**hp))


def objective_of(name: str) -> str:
    """The data objective model `name` trains with: "clm" (next tokens) or "mlm" (masked tokens)."""
    return family(name).objective
