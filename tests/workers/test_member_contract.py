"""The member contract of batched trials (`Family.batchable`, `workers.batched`): every member of a batch trains
with its own hparams, whichever way they reach its model, or the batch is refused with the fix.

For every registered family that declares batchable hparams (the built-ins and a plugin whose forward multiplies
its logits by a readout multiplier stored on the module when it is built), two members that differ in every
batchable hparam equal their solo trials (float64, 20 steps, ≤ 1e-8 relative). A family that declares none (the
example nanogpt, a from_mup family, and a plugin that says nothing) trains each trial alone, and the plan says so.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from service.cli import _print_batches
from studies import load_catalog
from studies.arch import ModelSize
from studies.cost import planned_trials
from studies.family import FAMILIES, Family, get_family, register
from studies.members import batches, solo_note
from studies.space import Range, Space
from studies.spec import DataSpec, StudySpec, TrialConfig
from tests.conftest import float64_default
from workers.batched import BatchingError
from workers.models.contract import LanguageModel
from workers.train import train, train_trial

MLM = DataSpec(max_tokens=60_000, seq_len=16, vocab_size=500)
CLM = DataSpec(max_tokens=60_000, seq_len=16, vocab_size=500, objective="clm")
SIZES = {"pt": {"width": 16, "base_width": 8, "n_channels": 2, "rank": 4, "n_iter": 2, "gamma": 2},
         "bert": {"width": 32, "base_width": 16, "head_dim": 16, "n_layers": 1, "max_len": 16},
         "ut": {"width": 32, "base_width": 16, "head_dim": 16, "n_steps": 2, "max_len": 16, "act": True},
         "tauformer": {"width": 32, "base_width": 16, "head_dim": 8, "n_layers": 1, "max_len": 16},
         "hf": {"width": 32, "base_width": 16, "head_dim": 8, "kv_group": 2, "config": {"max_position_embeddings": 16}},
         "scaled": {"width": 32}, "silent": {"width": 32}}


class TinyArch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def width_steps(self, base_width: int) -> dict[str, int]:
        return {}


class TinyConfig(TinyArch, ModelSize):
    readout_mult: float = 1.0
    init_std: float = 0.02


class TinySpace(Space):
    HPARAMS: ClassVar[tuple[str, ...]] = ("lr", "readout_mult", "init_std")
    lr: Range = Field(default_factory=lambda: Range(low=1e-4, high=1e-1, default=1e-2))
    readout_mult: Range = Field(default_factory=lambda: Range(low=0.1, high=10.0, default=1.0))
    init_std: Range = Field(default_factory=lambda: Range(low=0.005, high=0.5, default=0.02))
    frozen: list[str] = Field(default_factory=list)


class ScaledLM(LanguageModel):
    """A user's model in the usual style: it keeps no `cfg`, and its readout multiplier is an attribute set when it
    is built (what a batch must stack per member, or train every member with member 0's value)."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.readout_mult = cfg.readout_mult
        self.emb = nn.Embedding(cfg.vocab_size, cfg.width)
        self.decoder = nn.Linear(cfg.width, cfg.vocab_size)
        for p in self.parameters():
            nn.init.normal_(p, std=cfg.init_std)
        self.groups = {"hidden": [self.emb.weight, self.decoder.weight], "bias": [self.decoder.bias]}

    def lr_multipliers(self) -> dict[str, float]:
        return dict.fromkeys(self.groups, 1.0)

    def forward(self, input_ids, attention_mask=None, trace=None, select=None) -> torch.Tensor:
        x = torch.tanh(self.emb(input_ids))
        return self.decoder(x if select is None else x[select]) * self.readout_mult


class CountedLM(ScaledLM):
    """Keeps a count derived from its hparam (an int: nothing a batch can stack)."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__(cfg)
        self.n_scaled = round(10 * cfg.readout_mult)


class DeafLM(ScaledLM):
    """Takes the readout multiplier and keeps it nowhere a batch can see."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__(cfg)
        del self.readout_mult
        self.scale = _GLOBAL_SCALE.setdefault("scale", cfg.readout_mult)

    def forward(self, input_ids, attention_mask=None, trace=None, select=None) -> torch.Tensor:
        x = torch.tanh(self.emb(input_ids))
        return self.decoder(x if select is None else x[select])


_GLOBAL_SCALE: dict[str, float] = {}


@pytest.fixture
def plugins():
    names = {"scaled": ScaledLM, "silent": ScaledLM, "counted": CountedLM, "deaf": DeafLM}
    for name, model in names.items():
        batchable = None if name == "silent" else TinySpace.HPARAMS
        register(Family(name, TinyArch, TinyConfig, TinySpace, model, readout="logits", batchable=batchable))
    yield
    for name in names:
        del FAMILIES[name]


def _members(family: str, **kw) -> list[TrialConfig]:
    """Two trials of `family`: one at the space's defaults, one with every batchable hparam 1.25 × its default."""
    defaults = get_family(family).space().defaults()
    batchable = get_family(family).batchable or tuple(defaults)
    other = {h: v * 1.25 if h in batchable else v for h, v in defaults.items()}
    base = {"model": family, "data": CLM if get_family(family).objective == "clm" else MLM, "steps": 20,
            "batch_size": 8, "eval_every": 10, "eval_batches": 2, "warmup_steps": 3, "device": "cpu", **kw}
    size = {**SIZES.get(family, {}), **({"parametrization": "mup"} if family in ("pt", "bert", "ut", "tauformer", "hf")
                                        else {})}
    return [TrialConfig(**base, lr=hp["lr"], model_hp={**size, **{h: v for h, v in hp.items() if h != "lr"}})
            for hp in (defaults, other)]


@pytest.mark.parametrize("family", ["pt", "bert", "ut", "tauformer", "hf", "scaled"])
def test_members_differing_in_every_batchable_hparam_equal_their_solo_trials(plugins, family):
    with float64_default():
        cfgs = _members(family)
        batched = train(cfgs)
        for cfg, got in zip(cfgs, batched, strict=True):
            alone = train_trial(cfg)
            assert got.status == alone.status == "completed", (got.message, alone.message)
            for mine, theirs in zip(got.rows, alone.rows, strict=True):
                for key in ("train_loss", "eval_loss"):
                    if key in theirs:
                        assert mine[key] == pytest.approx(theirs[key], rel=1e-8), (key, mine["step"])
            assert got.eval_loss == pytest.approx(alone.eval_loss, rel=1e-8)
        assert batched[0].eval_loss != pytest.approx(batched[1].eval_loss, rel=1e-6)  # the hparams matter


def _spec(family: str) -> StudySpec:
    data = load_catalog("tiny").as_dict()
    if family != "nanogpt":
        data["model"] = {"family": family, "parametrization": "mup", "arch": {}}
        data["space"] = {}
    else:
        data = load_catalog("nanogpt_mup").as_dict()
    data["resources"] = {**(data.get("resources") or {}), "batch_members": 8}
    return StudySpec.model_validate(data)


@pytest.mark.parametrize("family", ["nanogpt", "silent"])
def test_a_family_that_declares_no_batchable_hparams_trains_alone_and_the_plan_says_so(plugins, family, capsys):
    if family not in FAMILIES:
        pytest.skip("the example plugin is not installed (make install)")
    spec = _spec(family)
    for trials in planned_trials(spec).values():
        assert all(len(group) == 1 for group in batches(spec, trials, 8))
    why = {"nanogpt": "its model brings its own optimiser (mup's MuAdamW), which a batch cannot stack",
           "silent": "it declares no batchable hparams (Family.batchable)"}[family]
    assert solo_note(spec) == f"family {family!r} trains each trial alone: {why}"
    assert solo_note(spec.model_copy(update={"resources": spec.resources.model_copy(update={"batch_members": 1})})) \
        is None  # K = 1: every family's trials train alone, nothing to say
    _print_batches(spec)
    assert f"batches: family {family!r} trains each trial alone: {why}" in " ".join(capsys.readouterr().out.split())
    if family == "silent":
        with pytest.raises(BatchingError, match="declares no batchable hparams"):
            train(_members(family, steps=2))


def test_a_difference_a_batch_cannot_stack_is_an_error_naming_it(plugins):
    with pytest.raises(BatchingError, match=r"CountedLM\.n_scaled \(int\)"):
        train(_members("counted", steps=2))


def test_an_hparam_that_reaches_the_model_unseen_is_refused(plugins):
    _GLOBAL_SCALE.clear()
    a, b = _members("deaf", steps=2)  # only the readout multiplier differs (and lr, which the optimiser takes)
    b = b.model_copy(update={"model_hp": {**b.model_hp, "init_std": a.model_hp["init_std"]}})
    with pytest.raises(BatchingError, match="hold the same values"):
        train([a, b])


def test_members_that_differ_outside_the_batchable_hparams_are_refused(plugins):
    a, b = _members("scaled", steps=2)
    with pytest.raises(BatchingError, match="differ in more than its batchable"):
        train([a, b.model_copy(update={"seed": 7})])
