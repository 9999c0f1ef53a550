"""AdamW's weight decay in the built optimiser: a trial's `weight_decay` hparam reaches every decayed group, and
`train.weight_decay_form` ('coupled': torch's AdamW, a group decays by its own lr × λ per step; 'independent': each
group's λ scaled so that its lr × λ is the base lr × λ) in ptctl's AdamW and in the batched engine; a from_mup
family (MuAdamW, independent by construction) refuses the explicit form."""

from __future__ import annotations

import math

import pytest
import torch

from studies.spec import CATALOG_DIR, StudySpec, TrialConfig
from workers.batched import Stacked
from workers.errors import ConfigError
from workers.models import build_model
from workers.train import make_optimizer

V = 50
PT = {"n_channels": 2, "rank": 4, "n_iter": 2, "gamma": 2}
LR, LAMBDA = 1e-2, 0.1


def _optimiser(width: int, form: str, parametrization: str = "mup") -> dict[str, dict]:
    hp = {"width": width, "base_width": 16, "parametrization": parametrization, **PT}
    torch.manual_seed(0)
    net = build_model("pt", vocab_size=V, **hp)
    cfg = TrialConfig(model="pt", lr=LR, model_hp=hp, weight_decay=LAMBDA, weight_decay_form=form)
    return {g["name"]: g for g in make_optimizer(net, cfg).param_groups}


def _decay_per_step(groups: dict[str, dict]) -> dict[str, float]:
    return {n: g["lr"] * g["weight_decay"] for n, g in groups.items()}


def test_coupled_decays_each_group_by_its_own_lr_so_mups_hidden_groups_decay_less_as_width_grows():
    for width in (32, 128):
        groups = _optimiser(width, "coupled")
        assert {n: g["weight_decay"] for n, g in groups.items()} == {n: 0.0 if n == "bias" else LAMBDA
                                                                      for n in groups}
    narrow, wide = _decay_per_step(_optimiser(32, "coupled")), _decay_per_step(_optimiser(128, "coupled"))
    assert math.isclose(wide["hidden"], narrow["hidden"] / 4)  # lr / width_mult: 4× less decay per step at 4× width
    assert math.isclose(wide["input"], narrow["input"]) and math.isclose(narrow["input"], LR * LAMBDA)


def test_independent_holds_lr_times_decay_at_the_base_lrs_in_every_group_at_every_width():
    for width in (32, 128):
        groups = _optimiser(width, "independent")
        per_step = _decay_per_step(groups)
        for name, value in per_step.items():
            assert math.isclose(value, 0.0 if name == "bias" else LR * LAMBDA, rel_tol=1e-12), (width, name)
        scaled = [n for n, g in groups.items() if not math.isclose(g["lr"], LR) and n != "bias"]
        assert scaled and all(groups[n]["weight_decay"] > LAMBDA for n in scaled)  # λ × width_mult there
    assert math.isclose(_optimiser(128, "independent")["hidden"]["weight_decay"], LAMBDA * 128 / 16)


def test_under_standard_parametrization_the_two_forms_are_the_same_optimiser():
    coupled, independent = _optimiser(64, "coupled", "standard"), _optimiser(64, "independent", "standard")
    assert {n: (g["lr"], g["weight_decay"]) for n, g in coupled.items()} == \
        {n: (g["lr"], g["weight_decay"]) for n, g in independent.items()}


def test_a_trials_weight_decay_hparam_reaches_its_optimiser():
    spec = StudySpec.from_yaml(CATALOG_DIR / "weight_decay_cpu.yaml")
    config = TrialConfig.model_validate(spec.trial_config(32, {"weight_decay": 0.37, "lr": 0.01}, 0, 5))
    torch.manual_seed(0)
    net = build_model(config.model, vocab_size=V, **config.model_hp)
    groups = {g["name"]: g["weight_decay"] for g in make_optimizer(net, config).param_groups}
    assert config.weight_decay == 0.37 and {d for n, d in groups.items() if n != "bias"} == {0.37}


def test_the_batched_engine_gives_each_parameter_the_solo_optimisers_independent_decay():
    hp = {"width": 64, "base_width": 16, "parametrization": "mup", **PT}
    cfgs = [TrialConfig(model="pt", lr=lr, model_hp=hp, device="cpu", weight_decay=LAMBDA,
                        weight_decay_form="independent") for lr in (1e-2, 3e-3)]
    stacked = Stacked(cfgs, V, torch.device("cpu"))
    solo = make_optimizer(stacked.models[0], cfgs[0])
    names = {id(p): n for n, p in stacked.models[0].named_parameters()}
    want = {names[id(p)]: g["weight_decay"] for g in solo.param_groups for p in g["params"]}
    assert {n: stacked.opt.decay[n] for n in want} == want
    assert max(want.values()) == pytest.approx(LAMBDA * 64 / 16)  # the hidden groups' λ × width_mult


def test_a_mup_familys_own_optimiser_refuses_the_independent_form():
    hp = {"width": 64, "base_width": 16, "parametrization": "mup", "n_layers": 1, "n_heads": 4, "max_len": 16}
    torch.manual_seed(0)
    net = build_model("nanogpt", vocab_size=V, **hp)
    cfg = TrialConfig(model="nanogpt", lr=LR, model_hp=hp, weight_decay=LAMBDA, weight_decay_form="independent")
    with pytest.raises(ConfigError, match="independent form already"):
        make_optimizer(net, cfg)
