"""A family is one registration: a throwaway family, defined here (an MLP language model over embeddings),
registered through `studies.family.register` alone, validates in a `ModelSpec`, trains with `train_trial`
through the model contract's loss and hooks, and runs the coordinate check."""

from __future__ import annotations

import warnings
from typing import ClassVar

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from studies import load_catalog
from studies.arch import ModelSize
from studies.family import FAMILIES, Family, register
from studies.model import ModelSpec, space_class
from studies.phases import phases_of
from studies.plan import PlannedTrial
from studies.space import Range, Space
from studies.spec import DataSpec, StudySpec, TrialConfig
from workers import coord_check as coord_check_module
from workers.coord_check import coord_check, coord_data
from workers.models.contract import LanguageModel
from workers.report import TrialReport
from workers.runner import InProcessRunner, PhaseJob
from workers.tracker import NullTracker
from workers.train import train_trial

_steps_seen: list[int] = []


class MLPArch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_mult: int = Field(2, gt=0, description="the MLP's hidden width / width")

    def width_steps(self, base_width: int) -> dict[str, int]:
        return {}


class MLPConfig(MLPArch, ModelSize):
    init_std: float = Field(0.02, gt=0)


class MLPSpace(Space):
    HPARAMS: ClassVar[tuple[str, ...]] = ("lr", "init_std")
    lr: Range = Field(default_factory=lambda: Range(low=1e-4, high=1e-1, default=1e-2))
    init_std: Range = Field(default_factory=lambda: Range(low=0.005, high=0.5, default=0.02))
    frozen: list[str] = Field(default_factory=list)


class MLPLM(LanguageModel):
    """Each token's logits from its own embedding through one residual MLP (no attention)."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.cfg, d = cfg, cfg.width
        self.emb = nn.Embedding(cfg.vocab_size, d)
        self.fc, self.proj = nn.Linear(d, cfg.hidden_mult * d), nn.Linear(cfg.hidden_mult * d, d)
        self.decoder = nn.Linear(d, cfg.vocab_size)
        for p in self.parameters():
            nn.init.normal_(p, std=cfg.init_std)
        self.groups = {"input": [self.emb.weight], "hidden": [self.fc.weight, self.proj.weight],
                       "output": [self.decoder.weight], "bias": [self.fc.bias, self.proj.bias, self.decoder.bias]}

    def lr_multipliers(self) -> dict[str, float]:
        return dict.fromkeys(self.groups, 1.0)

    def forward(self, input_ids, attention_mask=None, trace=None, select=None) -> torch.Tensor:
        x = self.emb(input_ids)
        h = self.proj(F.gelu(self.fc(x)))
        x = x + h
        x = x if select is None else x[select]
        logits = self.decoder(x)
        if trace is not None:
            trace["embed"], trace["mlp_out"], trace["logits"] = self.emb(input_ids), h, logits
        return logits

    def before_step(self, batch, step: int) -> None:
        _steps_seen.append(step)

    def eval_metrics(self, batch, step: int, past: list[dict[str, float]]) -> dict[str, float]:
        return {"mlp.decoder_norm": float(self.decoder.weight.detach().norm()), "mlp.evals": float(len(past) + 1)}


@pytest.fixture
def mlp_family():
    entry = register(Family("mlp", MLPArch, MLPConfig, MLPSpace, MLPLM, readout="logits",
                            coord_hp={"hidden_mult": 2, "init_std": 0.1},
                            coord_may_vanish=lambda hp: ("mlp_out",) if hp["hidden_mult"] > 2 else (),
                            flag_tags={"mlp.flag.": "mlp_flagged"}))
    _steps_seen.clear()
    yield entry
    del FAMILIES["mlp"]


DATA = DataSpec(max_tokens=20_000, seq_len=32)


def test_a_family_registered_once_validates_and_trains_through_the_contract(mlp_family):
    spec = ModelSpec(family="mlp", parametrization="standard", arch={"hidden_mult": 3})
    assert spec.arch == MLPArch(hidden_mult=3) and space_class("mlp") is MLPSpace
    assert {"$ref": "#/$defs/MLPArch"} in ModelSpec.model_json_schema()["properties"]["arch"]["anyOf"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # serialised as its own arch, not as one of the built-in arches
        assert ModelSpec.model_validate_json(spec.model_dump_json()) == spec

    rows: list[dict] = []
    cfg = TrialConfig(model="mlp", model_hp={"width": 32, "hidden_mult": 2}, data=DATA, lr=1e-2, steps=12,
                      batch_size=8, eval_every=4, log_every=4, warmup_steps=2, eval_batches=2, device="cpu")
    result = train_trial(cfg, progress=rows.append)
    assert result.status == "completed", result.message
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in evals] == [4, 8, 12]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
    assert [r["mlp.evals"] for r in evals] == [1.0, 2.0, 3.0]  # `past` holds the earlier evaluations' rows
    assert _steps_seen == list(range(12))  # `before_step` before every step, with the updates done so far


def test_a_study_of_the_registered_family_validates(mlp_family):
    data = load_catalog("tiny").as_dict()  # PT's spec with the model swapped: no arch field is PT's or BERT's
    data["model"] = {"family": "mlp", "parametrization": "mup", "arch": {"hidden_mult": 2}}
    data["space"] = {}
    spec = StudySpec.model_validate(data)
    assert spec.model.arch == MLPArch(hidden_mult=2) and phases_of(spec)[0] == "tune"


def test_the_registered_family_runs_the_coordinate_check(mlp_family):
    df = coord_data("mlp", parametrization="standard", widths=(16, 32), steps=2, seeds=1, data=DATA)
    assert set(df.name) == {"embed", "mlp_out", "logits"} and set(df.width) == {16, 32}


def test_the_coordinate_check_lets_vanish_what_the_family_declares(mlp_family, monkeypatch):
    """`coord_may_vanish` sees the check's model hparams (`coord_hp` under `model_hp`); the names it returns
    may shrink with width (judged one-sidedly), and only then."""

    def table(widths, seeds, base_seed, **_) -> pd.DataFrame:  # mlp_out's rms ∝ 1/width, the rest flat
        rows = [("standard", w, s, t, name, 1 / w if name == "mlp_out" else 1.0)
                for w in widths for s in range(base_seed, base_seed + seeds) for t in range(2)
                for name in ("embed", "mlp_out", "logits")]
        return pd.DataFrame(rows, columns=["parametrization", "width", "seed", "step", "name", "rms"])

    monkeypatch.setattr(coord_check_module, "coord_data", table)
    check = {"model": "mlp", "parametrization": "standard", "widths": (16, 32), "steps": 2, "seeds": 2, "max_seeds": 2}
    _, _, verdict, _ = coord_check(**check, model_hp={"hidden_mult": 4})
    assert verdict.passed and "mlp_out judged one-sidedly" in verdict.verdict
    _, _, verdict, _ = coord_check(**check)  # hidden_mult 2: nothing may vanish
    assert verdict.status == "fail" and [o.name for o in verdict.offending] == ["mlp_out"]


class _Tags(NullTracker):
    def __init__(self) -> None:
        self.tags: dict[str, str] = {}

    def set_tags(self, run_id, tags) -> None:
        self.tags.update(tags)


def test_a_flag_metric_the_family_declares_tags_the_trial_run(mlp_family, tmp_path):
    """A nonzero metric under a `flag_tags` prefix tags the trial's run: "step S: <names>", the last such step
    (the in-process runner here; the Ray callback calls the same `workers.runner.flag_tags`)."""
    history = [{"step": 4, "mlp.flag.a": 0.0}, {"step": 8, "mlp.flag.b": 1.0, "mlp.flag.a": 1.0},
               {"step": 12, "mlp.flag.a": 0.0}]

    def train(cfgs: list[TrialConfig]) -> list[TrialReport]:
        return [TrialReport(status="completed", eval_loss=4.0, steps=12, tokens=1000, params=100, rows=history)]

    spec, tracker = load_catalog("tiny"), _Tags()
    trial = PlannedTrial("transfer-w32-s0", "transfer", spec.tune.base_width, 0, spec.space.defaults())
    InProcessRunner(train).run_phase(PhaseJob(spec, "transfer", [trial], "s1", None, "s1/transfer", tracker,
                                              tmp_path, "s1.transfer"))
    assert tracker.tags["mlp_flagged"] == "step 8: a, b" and tracker.tags["status"] == "completed"


def test_an_unregistered_family_is_refused_with_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown model family 'mlp': choose one of \['pt', 'bert', 'ut'"):
        TrialConfig(model="mlp")


def test_a_trial_on_a_node_without_the_plugin_names_the_package_to_install():
    """The Ray trainable checks the spec's family before anything else: a node that lacks the plugin fails the
    trial with the fix, not with a validation or pickling error."""
    from workers.errors import ConfigError
    from workers.ray.trainable import _trainable

    with pytest.raises(ConfigError, match="must be installed in this Python environment: on a Ray cluster, on every"):
        _trainable({}, {"model": {"family": "tinygpt"}}, "verify", 1)
