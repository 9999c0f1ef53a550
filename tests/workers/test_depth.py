"""The depth parametrization (CompleteP, α = 1): the residual-branch multiplier, the blocks' groups with their lr and
Adam-ε factors, `none` leaving every model and optimiser as they were, the arch fields' errors and the spec hash, and
the coordinate check over depth (`coord_check(..., depths=...)`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from pydantic import ValidationError

import studies.arch
from analysis.coord import coord_slopes
from studies.spec import CATALOG_DIR, StudySpec, TrialConfig
from workers.coord_check import _by_position, coord_check
from workers.errors import ConfigError
from workers.models import build_model
from workers.models.contract import ADAM_EPS
from workers.train import make_optimizer

V = 50
FAMILIES = {"bert": {"head_dim": 8, "max_len": 16}, "ut": {"head_dim": 8, "max_len": 16, "n_steps": 8},
            "tauformer": {"head_dim": 8, "max_len": 16}}
DEPTH = {"bert": "n_layers", "ut": "n_steps", "tauformer": "n_layers"}


def model(name: str, depth: int = 8, **hp):
    torch.manual_seed(0)
    kw = {**FAMILIES[name], DEPTH[name]: depth, **hp}
    return build_model(name, vocab_size=V, width=32, base_width=16, parametrization="mup", **kw)


def completep(name: str, depth: int = 8, base: int = 2, **hp):
    return model(name, depth, depth_parametrization="completep", base_depth=base, **hp)


def _batch(n: int = 12):
    torch.manual_seed(1)
    return torch.randint(3, V, (2, n)), torch.ones(2, n, dtype=torch.bool)


# ----------------------------------------------------------------------------- groups, lr and ε factors
@pytest.mark.parametrize("name", list(FAMILIES))
def test_blocks_get_their_own_groups_and_completeps_factors(name):
    net = completep(name, depth=8, base=2)  # m_L = 4, width_mult = 2
    ref = model(name, depth=8)
    blocks = {id(p) for p in (net.layer if name == "ut" else net.layers if name == "bert" else net.blocks).parameters()}
    assert {id(p) for p in net.groups["block"] + net.groups["block_bias"]} == blocks
    assert all(p.dim() == 2 for p in net.groups["block"]) and all(p.dim() == 1 for p in net.groups["block_bias"])
    for group in ("input", "hidden", "output", "bias"):  # what is outside the blocks keeps its group
        assert not blocks & {id(p) for p in net.groups[group]}
        assert len(net.groups[group]) == len(ref.groups[group]) - (len(net.groups["block"]) if group == "hidden"
                                                                   else len(net.groups["block_bias"]) if group == "bias"
                                                                   else 0)
    mult, eps = net.lr_multipliers(), net.eps_multipliers()
    assert mult == {"input": 1.0, "hidden": 0.5, "output": 1.0, "bias": 1.0, "block": 0.5, "block_bias": 1.0}
    shared = name == "ut"  # one block applied n_steps times: ε × m_L^(1-α) = 1 at α = 1
    assert eps == {"block": 1.0 if shared else 0.25, "block_bias": 1.0 if shared else 0.25}
    assert net.branch_mult() == pytest.approx(0.25)
    opt = make_optimizer(net, TrialConfig(model=name, lr=1e-2, weight_decay=0.1))
    by_name = {g["name"]: g for g in opt.param_groups}
    for group, g in by_name.items():
        assert g["lr"] == pytest.approx(1e-2 * mult[group])
        assert g["eps"] == pytest.approx(ADAM_EPS * eps.get(group, 1.0))
        assert g["weight_decay"] == (0.0 if group in ("bias", "block_bias") else 0.1)


def test_outside_the_blocks_bert_keeps_its_mlm_transform_and_final_layernorm_unscaled():
    net = completep("bert")
    assert [id(p) for p in net.groups["hidden"]] == [id(net.head.dense.weight)]
    assert {id(net.emb_ln.weight), id(net.emb_ln.bias), id(net.head.ln.weight)} <= {id(p) for p in net.groups["bias"]}
    tau = completep("tauformer")
    assert tau.groups["bias"] == [tau.log_temp] and tau.groups["hidden"] == []  # temperatures serve every block


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_depth_factors_follow_alpha(name, monkeypatch):
    """The rules in their general form (CompleteP Table 1, α ∈ [1/2, 1]): at α = 1/2, lr × m_L^-1/2, ε × m_L^-1/2
    (a shared block's ε: × m_L^+1/2) and the branch × m_L^-1/2."""
    monkeypatch.setitem(studies.arch.DEPTH_ALPHA, "completep", 0.5)
    net = completep(name, depth=8, base=2)  # m_L = 4
    assert net.branch_mult() == pytest.approx(0.5)
    assert net.lr_multipliers()["block"] == pytest.approx(0.5 * 0.5) and net.lr_multipliers()["block_bias"] == 0.5
    assert net.eps_multipliers()["block"] == pytest.approx(2.0 if name == "ut" else 0.5)


# ----------------------------------------------------------------------------- the branch multiplier
def _scaled_copy(name: str, net, ref, b: float) -> None:
    """Load `net`'s weights into `ref` (a `none` model), with every branch's last map (and UT's signals) × b."""
    state = {k: v.clone() for k, v in net.state_dict().items()}
    last = ("attn.c_proj.weight", "mlp_proj.weight") if name == "tauformer" else (".o.weight", ".o.bias",
                                                                                   ".ff2.weight", ".ff2.bias")
    for key in state:
        if key.endswith(last) or (name == "ut" and key in ("pos_emb.weight", "step_emb.weight")):
            state[key] *= b
    ref.load_state_dict(state)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_residual_branch_is_multiplied_by_base_depth_over_depth(name):
    """x + (L0/L)·F(x) equals the `none` model whose branches' last maps (UT: and its step signals) are × L0/L."""
    hp = {"timing": "learned"} if name == "ut" else {}
    net, ref = completep(name, depth=8, base=2, **hp), model(name, depth=8, **hp)
    _scaled_copy(name, net, ref, 0.25)
    ids, mask = _batch()
    assert torch.allclose(net(ids, mask), ref(ids, mask), atol=1e-5)
    plain = model(name, depth=8, **hp)
    plain.load_state_dict(net.state_dict())
    assert not torch.allclose(net(ids, mask), plain(ids, mask), atol=1e-3)  # the multiplier changes the output


# ----------------------------------------------------------------------------- `none` is today's model
@pytest.mark.parametrize("name", list(FAMILIES))
def test_none_is_the_default_and_trains_bit_identically_to_the_four_group_adamw(name):
    """`none` (given or omitted) builds the four groups every existing run has, multiplies nothing, and trains to the
    same losses, bit for bit, as AdamW over those groups at torch's ε (the optimiser ptctl built before)."""
    given, omitted = model(name, depth_parametrization="none"), model(name)
    assert list(given.groups) == ["input", "hidden", "output", "bias"] and given.eps_multipliers() == {}
    assert given.branch_mult() == 1.0
    cfg = TrialConfig(model=name, lr=3e-3)
    old = torch.optim.AdamW([{"params": ps, "lr": cfg.lr * omitted.lr_multipliers()[g],
                              "weight_decay": 0.0 if g == "bias" else cfg.weight_decay, "name": g}
                             for g, ps in omitted.groups.items() if ps], lr=cfg.lr, betas=cfg.betas)
    new = make_optimizer(given, cfg)
    ids, mask = _batch()
    labels = ids.clone()
    losses = []
    for net, opt in ((given, new), (omitted, old)):
        run = []
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(net(ids, mask).reshape(-1, V), labels.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    assert losses[0] == losses[1]


# ----------------------------------------------------------------------------- the arch fields
def _spec(arch: dict, family: str = "bert") -> dict:
    return {"name": "d", "model": {"family": family, "arch": arch}, "tune": {"base_width": 32},
            "transfer": {"widths": [64]}}


@pytest.mark.parametrize(("arch", "message"), [
    ({"base_depth": 0}, r"model\.arch\.base_depth\n  Input should be greater than 0"),
    ({"depth_parametrization": "depth_mup"}, r"depth_parametrization\n  Input should be 'none' or 'completep'"),
    ({"base_depth": 2}, r"base_depth=2 is set but model\.arch\.depth_parametrization is 'none'.*set "
                        r"depth_parametrization: completep, or drop base_depth"),
    ({"depth_parametrization": "completep", "norm": "post"}, r"needs pre-LN blocks.*set model\.arch\.norm: pre"),
])
def test_depth_fields_have_bounds_and_errors_that_name_the_fix(arch, message):
    with pytest.raises(ValidationError, match=message):
        StudySpec.model_validate(_spec(arch))


def test_the_depth_fields_are_dumped_only_when_set_so_existing_specs_keep_their_hash():
    plain = StudySpec.model_validate(_spec({"n_layers": 4}))
    explicit = StudySpec.model_validate(_spec({"n_layers": 4, "depth_parametrization": "none"}))
    assert explicit.content_hash() == plain.content_hash()
    assert "depth_parametrization" not in plain.as_dict()["model"]["arch"]
    deep = StudySpec.model_validate(_spec({"n_layers": 4, "depth_parametrization": "completep", "base_depth": 2}))
    assert deep.content_hash() != plain.content_hash()
    assert StudySpec.from_yaml(deep.to_yaml()) == deep
    hp = deep.model_hp(64, {})
    assert hp["depth_parametrization"] == "completep" and hp["base_depth"] == 2
    assert "depth_parametrization" not in plain.model_hp(64, {})  # a trial's config as before
    for path in CATALOG_DIR.glob("*.yaml"):  # no older catalog spec names them: their hashes are unchanged
        assert path.stem == "depth_cpu" or "depth_parametrization" not in path.read_text(), path.name


def test_the_api_bounds_base_depth_like_the_layers():
    from service.limits import Limits, check

    data = _spec({"depth_parametrization": "completep", "base_depth": 10**6})
    errors = check(data, Limits())
    assert [e["loc"] for e in errors] == [["body", "model", "arch", "base_depth"]]
    assert "PTCTL_MAX_LAYERS" in errors[0]["msg"]


# ----------------------------------------------------------------------------- the coordinate check over depth
def test_per_layer_names_are_compared_by_position():
    assert _by_position("hidden.layer0", 4) == "hidden.first" and _by_position("hidden.layer3", 4) == "hidden.last"
    assert _by_position("attn_out.layer1", 4) is None and _by_position("mlm_logits", 4) == "mlm_logits"


def test_the_depth_axis_gives_slopes_per_doubling_of_depth():
    rows = [(d, s, 1, "hidden.last", 3.0 * d ** 0.5 * (1 + 0.01 * s)) for d in (2, 4, 8) for s in range(3)]
    slopes = coord_slopes(pd.DataFrame(rows, columns=["depth", "seed", "step", "name", "rms"]), axis="depth")
    assert slopes["slope"].iloc[0] == pytest.approx(0.5) and slopes.attrs["axis"] == "depth"
    with pytest.raises(ValueError, match="axis='height'"):
        coord_slopes(pd.DataFrame(rows, columns=["depth", "seed", "step", "name", "rms"]), axis="height")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model": "pt"}, r"'pt' has no depth parametrization.*choose one of \['bert', 'ut', 'tauformer'"),
    ({"widths": (32, 64)}, r"widths=\[32, 64\]: a depth check varies depth at one width"),
    ({"depths": (4, 4)}, r"need at least two depths"),
])
def test_depth_check_arguments_name_the_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        coord_check(**{"model": "bert", "widths": (32,), "depths": (2, 4), "steps": 2, "seeds": 2, **kwargs})


@pytest.mark.slow  # a coordinate check, as the width checks of the families are
def test_completep_keeps_the_stream_put_over_depth_and_none_lets_it_grow():
    """TauGPT at width 32 (2 heads of 16), depths 2–8: CompleteP passes the check over depth, the standard residual
    (`none`) fails it on the residual stream, which grows with depth (docs/LOG.md has the full 2–16 tables)."""
    kw = {"model": "tauformer", "widths": (32,), "depths": (2, 4, 8), "steps": 3, "seeds": 3, "max_seeds": 6}
    _, slopes, verdict, _ = coord_check(**kw, model_hp={"depth_parametrization": "completep"})
    assert verdict.passed and verdict.axis == "depth", verdict.verdict
    _, slopes, verdict, _ = coord_check(**kw, model_hp={"depth_parametrization": "none"})
    assert verdict.status == "fail", verdict.verdict
    assert "hidden.last" in {o.name for o in verdict.offending}
    stream = slopes[(slopes.name == "hidden.last") & (slopes.step == 2)]
    assert float(stream.slope.iloc[0]) > 0.4


# ----------------------------------------------------------------------------- the validate depth sweep's trials
def test_a_planned_depth_trial_builds_and_trains_its_depth():
    """depth_cpu's validate trials at 8 blocks: the TrialConfig each plans builds 8 blocks, under completep with
    m_L = 8/2 (branches × 1/4, the blocks' ε × 1/4) and under none with no depth factor; a few Adam steps on one
    batch lower the loss under both."""
    from studies import load_catalog
    from studies.phases.validate import validate_trials

    spec = load_catalog("depth_cpu")
    planned = {t.trial_key: t for t in validate_trials(spec, {**spec.space.defaults(), "lr": 0.01})}
    for key, mult, eps in (("validate-completep-w32-L8-lr0.01-s0", 0.25, 0.25), ("validate-none-w32-L8-lr0.01-s0",
                                                                                 1.0, None)):
        cfg = TrialConfig.model_validate(planned[key].trial_config(spec))
        torch.manual_seed(cfg.seed)
        net = build_model(cfg.model, vocab_size=V, **cfg.model_hp)
        assert len(net.blocks) == 8 and net.branch_mult() == pytest.approx(mult)
        assert [b.branch for b in net.blocks] == pytest.approx([mult] * 8)
        assert net.eps_multipliers().get("block") == (pytest.approx(eps) if eps else None)
        opt = make_optimizer(net, cfg)
        ids = torch.randint(3, V, (4, 16))
        losses = []
        for _ in range(5):
            logits = net(ids[:, :-1], torch.ones_like(ids[:, :-1], dtype=torch.bool))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert all(np.isfinite(losses)) and losses[-1] < losses[0]
