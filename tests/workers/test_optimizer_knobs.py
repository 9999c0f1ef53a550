"""The optimiser's knobs per family (issue 36): Adam's ε (`train.adam_eps`, else `Family.adam_eps`), its width
scaling (`train.adam_eps_scaling: width`: × base_width/width in the groups whose lr μP divides by width_mult) and
per-group weight decay (`train.weight_decay_groups`), in ptctl's AdamW (`workers.train.make_optimizer`), the batched
engine's (`workers.batched._AdamW`) and a `from_mup` family's MuAdamW (`MupModel.make_optimizer`); unknown group
names are a ConfigError naming the valid ones; the fields' bounds; and specs that leave them unset keep their
content hash."""

from __future__ import annotations

import dataclasses

import mup
import pytest
import torch
from pydantic import ValidationError

from studies.family import FAMILIES, _malformed, family_names
from studies.spec import CATALOG_DIR, StudySpec, TrainSpec, TrialConfig
from workers.batched import Stacked
from workers.errors import ConfigError
from workers.models import build_model
from workers.models.contract import ADAM_EPS
from workers.train import make_optimizer

V = 50
BERT = {"head_dim": 8, "n_layers": 1, "max_len": 16, "tie_decoder": False}  # an output group of its own
PT = {"n_channels": 2, "rank": 4, "n_iter": 2, "gamma": 2}
GPT = {"n_layers": 1, "n_heads": 4, "max_len": 16}
# each built-in's groups whose lr μP divides by width_mult: their ε scales under adam_eps_scaling: width
SCALED = {"bert": {"hidden"}, "pt": {"hidden", "output"}}


def _net(name: str, width: int = 64, base: int = 16, parametrization: str = "mup", **hp):
    torch.manual_seed(0)
    arch = {"bert": BERT, "pt": PT, "nanogpt": GPT}[name]
    return build_model(name, vocab_size=V, width=width, base_width=base, parametrization=parametrization,
                       **{**arch, **hp})


def _groups(net, **train) -> dict[str, dict]:
    cfg = TrialConfig(model=train.pop("model", "bert"), lr=1e-2, **train)
    return {g["name"]: g for g in make_optimizer(net, cfg).param_groups}


# ----------------------------------------------------------------------------- ε
def test_unset_the_built_ins_keep_todays_eps_and_decay_exactly():
    for name in ("bert", "pt"):
        groups = _groups(_net(name), model=name, weight_decay=0.1)
        assert {n: g["eps"] for n, g in groups.items()} == dict.fromkeys(groups, ADAM_EPS)
        assert {n: g["weight_decay"] for n, g in groups.items()} == {n: 0.0 if n == "bias" else 0.1 for n in groups}


@pytest.mark.parametrize("name", ["bert", "pt"])
def test_the_familys_default_eps_reaches_every_group(name, monkeypatch):
    monkeypatch.setitem(FAMILIES, name, dataclasses.replace(FAMILIES[name], adam_eps=1e-12))
    groups = _groups(_net(name), model=name)
    assert {n: g["eps"] for n, g in groups.items()} == dict.fromkeys(groups, 1e-12)


def test_adam_eps_overrides_the_familys_default_and_keeps_the_depth_factor(monkeypatch):
    monkeypatch.setitem(FAMILIES, "bert", dataclasses.replace(FAMILIES["bert"], adam_eps=1e-12))
    net = _net("bert", n_layers=8, depth_parametrization="completep", base_depth=2)  # blocks' ε × m_L^-1 = 1/4
    groups = _groups(net, adam_eps=1e-6)
    assert {n: g["eps"] for n, g in groups.items()} == {
        "input": 1e-6, "hidden": 1e-6, "output": 1e-6, "bias": 1e-6, "block": 1e-6 * 0.25, "block_bias": 1e-6 * 0.25}


@pytest.mark.parametrize("name", ["bert", "pt"])
def test_width_scaling_divides_the_hidden_groups_eps_by_width_mult_and_leaves_the_others(name):
    groups = _groups(_net(name, width=64, base=16), model=name, adam_eps=1e-6, adam_eps_scaling="width")
    assert set(groups) == {"input", "hidden", "output", "bias"}
    assert {n: g["eps"] for n, g in groups.items()} == {
        n: 1e-6 * 16 / 64 if n in SCALED[name] else 1e-6 for n in groups}
    # at the base width the factor is 1
    base = _groups(_net(name, width=16, base=16), model=name, adam_eps=1e-6, adam_eps_scaling="width")
    assert {g["eps"] for g in base.values()} == {1e-6}


def test_width_scaling_multiplies_the_blocks_depth_factor_and_spares_the_block_biases():
    net = _net("bert", width=64, base=16, n_layers=8, depth_parametrization="completep", base_depth=2)
    groups = _groups(net, adam_eps_scaling="width")
    eps = {n: g["eps"] for n, g in groups.items()}
    assert eps["block"] == pytest.approx(ADAM_EPS * 0.25 * 0.25) and eps["hidden"] == pytest.approx(ADAM_EPS * 0.25)
    assert eps["block_bias"] == pytest.approx(ADAM_EPS * 0.25)
    assert eps["input"] == eps["output"] == eps["bias"] == ADAM_EPS


# ----------------------------------------------------------------------------- weight decay per group
def test_per_group_decay_reaches_the_named_groups_and_weight_decay_the_others():
    groups = _groups(_net("bert"), weight_decay=0.1, weight_decay_groups={"hidden": 0.3, "bias": 0.05, "input": 0.0})
    assert {n: g["weight_decay"] for n, g in groups.items()} == {
        "input": 0.0, "hidden": 0.3, "output": 0.1, "bias": 0.05}


def test_unknown_group_names_are_a_config_error_naming_family_names_and_valid_groups():
    with pytest.raises(ConfigError) as err:
        _groups(_net("bert"), weight_decay_groups={"hidden": 0.1, "matrix": 0.1, "attn": 0.2})
    text = str(err.value)
    assert "'bert'" in text and "['attn', 'matrix']" in text
    assert "['bias', 'hidden', 'input', 'output']" in text


# ----------------------------------------------------------------------------- the batched engine
def test_the_batched_engine_gives_each_parameter_the_solo_optimisers_eps_and_decay():
    hp = {"width": 64, "base_width": 16, "parametrization": "mup", **BERT}
    knobs = {"adam_eps": 1e-7, "adam_eps_scaling": "width", "weight_decay": 0.1,
             "weight_decay_groups": {"output": 0.2, "bias": 0.01}}
    cfgs = [TrialConfig(model="bert", lr=lr, model_hp=hp, device="cpu", **knobs) for lr in (1e-2, 3e-3)]
    stacked = Stacked(cfgs, V, torch.device("cpu"))
    solo = make_optimizer(stacked.models[0], cfgs[0])
    names = {id(p): n for n, p in stacked.models[0].named_parameters()}
    want = {names[id(p)]: (g["eps"], g["weight_decay"]) for g in solo.param_groups for p in g["params"]}
    assert {n: (stacked.opt.eps[n], stacked.opt.decay[n]) for n in want} == want
    assert {e for e, _ in want.values()} == {1e-7, 1e-7 * 16 / 64}  # the knobs reached both
    assert {d for _, d in want.values()} == {0.1, 0.2, 0.01}


def test_the_batched_engine_refuses_unknown_group_names():
    hp = {"width": 32, "base_width": 16, "parametrization": "mup", **BERT}
    cfgs = [TrialConfig(model="bert", lr=lr, model_hp=hp, device="cpu", weight_decay_groups={"vector": 0.1})
            for lr in (1e-2, 3e-3)]
    with pytest.raises(ConfigError, match=r"\['vector'\]"):
        Stacked(cfgs, V, torch.device("cpu"))


# ----------------------------------------------------------------------------- a from_mup family (MuAdamW)
MUP_GROUPS = ("matrix", "vector", "bias")  # mup's matrix-like and vector-like groups, and the undecayed ones
def test_the_example_plugin_is_installed():
    assert "nanogpt" in family_names(), "install the example plugin: pip install -e examples/nanogpt_mup"


def test_a_mup_familys_default_eps_and_adam_eps_reach_muadamw(monkeypatch):
    net = _net("nanogpt", width=128, base=32)
    assert {g["eps"] for g in _groups(net, model="nanogpt").values()} == {ADAM_EPS}
    monkeypatch.setitem(FAMILIES, "nanogpt", dataclasses.replace(FAMILIES["nanogpt"], adam_eps=1e-12))
    assert {n: g["eps"] for n, g in _groups(net, model="nanogpt").items()} == dict.fromkeys(MUP_GROUPS, 1e-12)
    assert {g["eps"] for g in _groups(net, model="nanogpt", adam_eps=1e-6).values()} == {1e-6}


def test_a_mup_familys_width_scaling_divides_the_matrix_groups_eps_only():
    net = _net("nanogpt", width=128, base=32)
    groups = _groups(net, model="nanogpt", adam_eps=1e-6, adam_eps_scaling="width")
    assert {n: g["eps"] for n, g in groups.items()} == {"matrix": 1e-6 * 32 / 128, "vector": 1e-6, "bias": 1e-6}
    assert {n: g["lr"] for n, g in groups.items()} == {"matrix": 1e-2 / 4, "vector": 1e-2, "bias": 1e-2}  # mup's


def test_a_mup_familys_per_group_decay_is_scaled_as_mup_scales_weight_decay():
    net = _net("nanogpt", width=128, base=32)
    unset = _groups(net, model="nanogpt", weight_decay=0.1)
    reference = mup.MuAdamW(net.net.parameters(), lr=1e-2, weight_decay=0.1)  # mup: matrix decay × width_mult
    assert sorted(g["weight_decay"] for n, g in unset.items() if n != "bias") == sorted(
        g["weight_decay"] for g in reference.param_groups if g["params"])
    assert unset["bias"]["weight_decay"] == 0.0  # biases and norm gains: not decayed
    groups = _groups(net, model="nanogpt", weight_decay=0.1, weight_decay_groups={"vector": 0.3})
    assert {n: g["weight_decay"] for n, g in groups.items()} == {"matrix": 0.1 * 4, "vector": 0.3, "bias": 0.0}
    groups = _groups(net, model="nanogpt", weight_decay=0.1, weight_decay_groups={"matrix": 0.05, "bias": 0.2})
    assert {n: g["weight_decay"] for n, g in groups.items()} == {"matrix": 0.05 * 4, "vector": 0.1, "bias": 0.2}


def test_a_mup_family_refuses_unknown_group_names_with_mups_group_names():
    with pytest.raises(ConfigError) as err:
        _groups(_net("nanogpt", width=128, base=32), model="nanogpt", weight_decay_groups={"hidden": 0.1})
    text = str(err.value)
    assert "'nanogpt'" in text and "['hidden']" in text and f"{sorted(MUP_GROUPS)}" in text


# ----------------------------------------------------------------------------- what weight decay leaves alone
def _biases_and_norm_gains(net: torch.nn.Module) -> set[str]:
    """What `train.weight_decay` must not decay (HF's Trainer and nanoGPT's rule): every parameter with fewer than
    2 dimensions, and every parameter of a normalisation layer."""
    norms = {f"{m}.{n}".lstrip(".") for m, mod in net.named_modules() if "Norm" in type(mod).__name__
             for n, _ in mod.named_parameters(recurse=False)}
    return {n for n, p in net.named_parameters() if p.dim() < 2} | norms


@pytest.mark.parametrize(("name", "hp"), [
    ("bert", {}), ("bert", {"depth_parametrization": "completep", "base_depth": 1}), ("pt", {}),
    ("ut", {}), ("tauformer", {}), ("nanogpt", {})])
def test_every_family_leaves_its_biases_and_norm_gains_undecayed(name, hp):
    torch.manual_seed(0)
    arch = {"bert": BERT, "pt": PT, "nanogpt": GPT}.get(name, {})
    net = build_model(name, vocab_size=V, width=64, base_width=32, parametrization="mup", **{**arch, **hp})
    names = {id(p): n for n, p in net.named_parameters()}
    groups = _groups(net, model=name, weight_decay=0.1)
    undecayed = {names[id(p)] for g in groups.values() if g["weight_decay"] == 0 for p in g["params"]}
    assert undecayed == _biases_and_norm_gains(net), name
    assert all(g["weight_decay"] > 0 for g in groups.values() if g["weight_decay"] != 0)


def normed_lm(width: int, vocab_size: int, **_: object) -> torch.nn.Module:
    """A mup model whose norm layer has a weight of two dimensions, (3, width)."""
    net = torch.nn.Module()
    net.tokens, net.norm = torch.nn.Embedding(vocab_size, width), torch.nn.LayerNorm((3, width))
    net.hidden, net.readout = torch.nn.Linear(width, width), mup.MuReadout(width, vocab_size)
    return net


def test_a_mup_familys_norm_weights_of_two_dimensions_are_not_decayed(monkeypatch):
    from nanogpt_mup import GPTArch, GPTSpace

    from studies.family import from_mup

    monkeypatch.setitem(FAMILIES, "normed", from_mup("normed", f"{__name__}:normed_lm", GPTArch, GPTSpace))
    net = build_model("normed", vocab_size=V, width=64, base_width=32, parametrization="mup")
    groups = _groups(net, model="normed", weight_decay=0.1)
    names = {id(p): n for n, p in net.named_parameters()}
    assert {names[id(p)] for p in groups["bias"]["params"]} == {
        "net.norm.weight", "net.norm.bias", "net.hidden.bias", "net.readout.bias"}
    assert groups["bias"]["weight_decay"] == 0.0 and groups["matrix"]["weight_decay"] == 0.1 * 2


# ----------------------------------------------------------------------------- the spec
# each catalog spec's content hash before the knobs existed (computed at HEAD 1c9a1fb, before this change)
HASHES = {"cpu_demo.yaml": "e48352ede783facdc1e324124261902dcb3913ed98c6299a2d397066e60fb958",
          "tiny.yaml": "1a77d356e3a366eaa8fe40ebce02bbe681ede3afcff41fa4646bc374a640696d",
          "nanogpt_mup.yaml": "e05a64af9fb2065aa6c373bda00fdd5911777346ba72c0cbd7cefb59969b5fef"}


@pytest.mark.parametrize("file", sorted(HASHES))
def test_specs_that_leave_the_knobs_unset_keep_their_content_hash(file):
    spec = StudySpec.from_yaml(CATALOG_DIR / file)
    assert spec.content_hash() == HASHES[file]
    trial = spec.trial_config(spec.tune.base_width, {}, 0)
    assert not {"adam_eps", "adam_eps_scaling", "weight_decay_groups"} & set(trial)
    for knob in ({"adam_eps": 1e-12}, {"adam_eps_scaling": "width"}, {"weight_decay_groups": {"hidden": 0.1}}):
        changed = spec.model_copy(update={"train": spec.train.model_copy(update=knob)})
        assert changed.content_hash() != HASHES[file], knob


def test_a_set_knob_survives_the_trial_config():
    spec = StudySpec.from_yaml(CATALOG_DIR / "tiny.yaml")
    train = TrainSpec.model_validate({**spec.train.model_dump(), "adam_eps": 1e-12, "adam_eps_scaling": "width",
                                      "weight_decay_groups": {"hidden": 0.1}})
    cfg = TrialConfig.model_validate(spec.model_copy(update={"train": train}).trial_config(spec.tune.base_width, {}, 0))
    assert (cfg.adam_eps, cfg.adam_eps_scaling, cfg.weight_decay_groups) == (1e-12, "width", {"hidden": 0.1})


@pytest.mark.parametrize(("field", "value"), [
    ("adam_eps", -1e-8), ("adam_eps", 0.0), ("adam_eps", 1.0), ("adam_eps_scaling", "depth"),
    ("weight_decay_groups", {"hidden": -0.1}),
    ("weight_decay_groups", {f"g{i}": 0.1 for i in range(17)})])
def test_the_fields_are_bounded_and_the_error_names_the_field(field, value):
    with pytest.raises(ValidationError) as err:
        TrainSpec.model_validate({field: value})
    assert err.value.errors()[0]["loc"][0] == field


def test_a_plugins_family_with_a_bad_default_eps_is_malformed():
    assert _malformed(FAMILIES["bert"]) is None
    assert "adam_eps" in (_malformed(dataclasses.replace(FAMILIES["bert"], adam_eps=-1.0)) or "")
