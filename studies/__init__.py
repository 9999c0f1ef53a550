"""WHAT to run and how to judge it: the `StudySpec`, the hparam search space, the catalog of studies.

Imports only pydantic, pyyaml, the standard library and `analysis` (no torch, ray, mlflow or
fastapi), so the CLI and the API validate a spec without starting anything.

    spec = load_catalog("tiny")                       # or StudySpec.from_yaml("my_study.yaml")
    spec.trial_config(width=32, hparams={"lr": 3e-3}, seed=0, steps=spec.steps_for("tune"))
"""

from pathlib import Path

from studies.budget import forward_flops, param_count, train_flops, width_for_budget
from studies.families.bert import BertArch
from studies.families.encoder import BASELINE_HPARAMS, BaselineSpace
from studies.families.pt import HPARAMS, INFORMATION_WEIGHTS, PTArch, SearchSpace
from studies.families.tauformer import TAU_HPARAMS, TauArch, TauSpace
from studies.families.ut import UTArch
from studies.family import FAMILIES, Family, family_names, get_family, load_plugins, register
from studies.space import Range
from studies.spec import (
    CATALOG_DIR,
    AshaSpec,
    BaselineSpec,
    CompareSpec,
    DataSpec,
    ModelSpec,
    ResourcesSpec,
    StudySpec,
    TrackingSpec,
    TrainSpec,
    TransferSpec,
    TuneSpec,
    ValidateSpec,
    VerifySpec,
    width_error,
)


def catalog_names() -> list[str]:
    """The studies shipped in `studies/catalog/` (file names without `.yaml`), sorted."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.yaml"))


def catalog_path(name: str) -> Path:
    """The YAML file of catalog study `name`; a `ValueError` listing the catalog if there is none."""
    path = CATALOG_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"no catalog study {name!r}: choose one of {catalog_names()} or give a YAML file")
    return path


def load_catalog(name: str) -> StudySpec:
    """The validated `StudySpec` of catalog study `name` (e.g. "tiny", "cpu_demo")."""
    return StudySpec.from_yaml(catalog_path(name))


__all__ = [
    "BASELINE_HPARAMS",
    "CATALOG_DIR",
    "HPARAMS",
    "INFORMATION_WEIGHTS",
    "FAMILIES",
    "Family",
    "TAU_HPARAMS",
    "AshaSpec",
    "BaselineSpace",
    "BaselineSpec",
    "BertArch",
    "CompareSpec",
    "DataSpec",
    "ModelSpec",
    "PTArch",
    "Range",
    "ResourcesSpec",
    "SearchSpace",
    "StudySpec",
    "TauArch",
    "TauSpace",
    "TrackingSpec",
    "TrainSpec",
    "TransferSpec",
    "TuneSpec",
    "UTArch",
    "ValidateSpec",
    "VerifySpec",
    "catalog_names",
    "family_names",
    "get_family",
    "load_plugins",
    "register",
    "catalog_path",
    "forward_flops",
    "load_catalog",
    "param_count",
    "train_flops",
    "width_error",
    "width_for_budget",
]

load_plugins()  # the installed plugins' families, after the built-ins (`studies.family`)
