"""`studies` stays light (no torch, ray, mlflow, fastapi) and mirrors the workers' configs exactly."""

import ast
from pathlib import Path
from typing import get_args

import pytest

import studies
from studies.arch import BertArch, TauArch, UTArch
from studies.spec import DataSpec as DataSpecModel
from studies.spec import PTArch, TrainSpec
from tests.studies._mirror import dataclass_defaults, local_constant, module_constant

FORBIDDEN = {"torch", "ray", "mlflow", "fastapi", "workers", "service"}
NOT_IN_ARCH = {"vocab_size", "width", "base_width", "parametrization", "w_H", "w_topic", "w_unary", "w_dep",
               "w_head", "w_topic_z"}
NOT_IN_TRAIN = {"model", "model_hp", "data", "lr", "seed"}
NOT_IN_TAU_ARCH = {"vocab_size", "width", "base_width", "parametrization", "init_std", "output_mult", "temperature"}
NOT_IN_ENCODER_ARCH = {"vocab_size", "width", "base_width", "parametrization", "init_std", "output_mult", "attn_mult"}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_studies_imports_no_heavy_framework():
    modules = sorted(Path(studies.__file__).parent.glob("*.py"))
    assert len(modules) >= 3
    offenders = {p.name: _imported_roots(p) & FORBIDDEN for p in modules}
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_public_api_is_exported():
    assert all(hasattr(studies, name) for name in studies.__all__)


def _defaults(model) -> dict[str, object]:
    return {name: f.default for name, f in model.model_fields.items()}


@pytest.mark.parametrize(
    ("model", "relpath", "cls", "left_out"),
    [
        (PTArch, "workers/models/pt.py", "PTConfig", NOT_IN_ARCH),
        (DataSpecModel, "workers/data.py", "DataConfig", set()),
        (TrainSpec, "workers/train.py", "TrialConfig", NOT_IN_TRAIN),
        (BertArch, "workers/models/bert.py", "BertConfig", NOT_IN_ENCODER_ARCH),
        (UTArch, "workers/models/universal.py", "UTConfig", NOT_IN_ENCODER_ARCH),
        (TauArch, "workers/models/tauformer.py", "TauConfig", NOT_IN_TAU_ARCH),
    ],
    ids=["PTArch", "DataSpec", "TrainSpec", "BertArch", "UTArch", "TauArch"],
)
def test_sections_mirror_the_worker_dataclasses(model, relpath, cls, left_out):
    worker = {k: v for k, v in dataclass_defaults(relpath, cls).items() if k not in left_out}
    assert _defaults(model) == worker


def test_allowed_values_match_the_workers():
    choices = local_constant("workers/models/pt.py", "__post_init__", "choices")
    fields = PTArch.model_fields
    for name, allowed in choices.items():
        if name != "parametrization":
            assert set(get_args(fields[name].annotation)) == set(allowed), name
    data = DataSpecModel.model_fields
    for name, const in (("source", "SOURCES"), ("packing", "PACKINGS"), ("mask_mode", "MASK_MODES"),
                        ("objective", "OBJECTIVES")):
        assert set(get_args(data[name].annotation)) == set(module_constant("workers/data.py", const)), name
    assert set(get_args(data["tokenizer"].annotation)) == set(module_constant("workers/tokenizer.py", "TOKENIZERS"))
    assert set(get_args(TrainSpec.model_fields["schedule"].annotation)) == set(
        module_constant("workers/train.py", "SCHEDULES"))
    for arch in (BertArch, UTArch):
        assert set(get_args(arch.model_fields["norm"].annotation)) == set(module_constant("workers/models/bert.py",
                                                                                            "NORMS"))
    assert set(get_args(UTArch.model_fields["timing"].annotation)) == set(
        module_constant("workers/models/universal.py", "TIMINGS"))
    for name, const in (("attention", "ATTENTIONS"), ("laplacian", "LAPLACIANS"), ("tau_mode", "TAU_MODES")):
        allowed = module_constant("workers/models/tauformer.py", const)
        assert set(get_args(TauArch.model_fields[name].annotation)) == set(allowed), name
