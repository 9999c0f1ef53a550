"""BERT and the Universal Transformer: the model contract, μP against mup's own rules, the coordinate check."""

import math

import pytest
import torch

from analysis.coord import coord_slopes, coord_verdict
from workers.coord_check import coord_data
from workers.models import build_model

WIDTHS = (32, 64, 128, 256)
LR = 1e-2  # the PT check's base learning rate; the models are the registered `coord_hp` (init_std 0.15)
SMALL = {"vocab_size": 50, "width": 48, "head_dim": 16, "max_len": 16}


def _batch(n: int = 12, vocab: int = 50):
    torch.manual_seed(0)
    ids = torch.randint(3, vocab, (2, n))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, -3:] = False
    return ids, mask


@pytest.mark.parametrize("name", ["bert", "ut"])
def test_contract_groups_select_and_trace(name):
    model = build_model(name, **SMALL, parametrization="mup", base_width=16)
    grouped = [p for params in model.groups.values() for p in params]
    assert len(grouped) == len({id(p) for p in grouped}) == len(list(model.parameters()))  # each param once
    assert model.lr_multipliers() == {"input": 1.0, "hidden": 16 / 48, "output": 1.0, "bias": 1.0}
    ids, mask = _batch()
    trace = {}
    full = model(ids, mask, trace=trace)
    assert full.shape == (2, 12, 50) and torch.allclose(model(ids, mask), full, atol=1e-5)  # SDPA == explicit
    select = torch.zeros_like(mask)
    select[0, 2] = select[1, 5] = True
    assert torch.allclose(model(ids, mask, select=select), full[select], atol=1e-5)
    layers = 2 if name == "bert" else 4
    expected = {"embed", "mlm_logits"} | {f"{k}.layer{i}" for k in ("attn_logits", "attn_out", "ffn_out", "hidden")
                                          for i in range(layers)}
    assert set(trace) == expected


def test_padding_does_not_leak_into_real_tokens():
    model = build_model("bert", **SMALL)
    ids, mask = _batch()
    other = ids.clone()
    other[1, -3:] = 7  # change only padded positions
    assert torch.allclose(model(ids, mask)[1, :-3], model(other, mask)[1, :-3], atol=1e-5)


def test_tied_and_untied_decoders_and_post_ln():
    tied = build_model("bert", **SMALL)
    untied = build_model("bert", **SMALL, tie_decoder=False, norm="post", mlm_transform=False)
    assert tied.head.weight is tied.tok_emb.weight
    assert untied.head.weight is not untied.tok_emb.weight and untied.groups["output"] == [untied.head.decoder.weight]
    extra = 50 * 48 - (48 * 48 + 48 + 2 * 48)  # the untied decoder, minus the transform's dense and LayerNorm
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == extra


def test_heads_scale_with_width_at_fixed_head_dim():
    for width, heads in ((32, 2), (48, 3), (40, 3), (256, 16), (8, 1)):
        layer = build_model("bert", **{**SMALL, "width": width}).layers[0]
        assert layer.n_heads == heads and layer.q.weight.shape == (heads * 16, width)


def test_ut_shares_one_layer_and_act_adds_a_ponder_cost():
    ut = build_model("ut", **SMALL, n_steps=3, timing="learned")
    assert not hasattr(ut, "layers") and ut.step_emb.weight.shape == (3, 48)
    assert float(ut.aux_loss()) == 0.0
    act = build_model("ut", **SMALL, n_steps=3, act=True, act_penalty=0.5)
    ids, mask = _batch()
    act(ids, mask)
    ponder = float(act.aux_loss().detach()) / 0.5
    assert 1.0 <= ponder <= 3.0 + 1.0  # steps used plus the remainder, at most T + 1
    act.aux_loss().backward()
    assert act.halt.weight.grad is not None and act.halt.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["bert", "ut"])
def test_config_errors_name_the_fix(name):
    with pytest.raises(ValueError, match=r"norm\n  Input should be 'pre' or 'post'.*input_value='mid'"):
        build_model(name, **SMALL, norm="mid")
    with pytest.raises(ValueError, match="unknown .* hyperparameter.*valid ones"):
        build_model(name, **SMALL, n_head=4)
    model = build_model(name, **SMALL)
    with pytest.raises(ValueError, match="exceeds max_len=16: raise max_len"):
        model(torch.randint(0, 50, (1, 20)))


@pytest.mark.parametrize("name", ["bert", "ut"])
def test_mup_groups_and_lrs_match_mup_set_base_shapes(name):
    """Our hidden group is exactly mup's matrix-like params (two infinite dims), and our lr multipliers are
    MuAdamW's: lr / width_mult for those, unchanged for the rest; the readout divides by width_mult."""
    mup = pytest.importorskip("mup")
    hp = {**SMALL, "tie_decoder": False, "parametrization": "mup", "base_width": 32}
    hp |= {"act": True} if name == "ut" else {}
    model = build_model(name, **{**hp, "width": 96})
    base, delta = build_model(name, **{**hp, "width": 32}), build_model(name, **{**hp, "width": 64})
    # do_assert=False: mup wants its MuReadout class for d → V layers; ours read out through readout_mult()
    mup.set_base_shapes(model, base, delta=delta, rescale_params=False, do_assert=False)
    readouts = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)
                and m.weight.infshape[1].isinf() and not m.weight.infshape[0].isinf()}
    assert readouts == {id(p) for p in model.groups["output"]}  # mup's readouts are exactly our output group
    hidden = {id(p) for p in model.groups["hidden"]}
    mult = model.lr_multipliers()
    for group, params in model.groups.items():
        for p in params:
            assert (p.infshape.ninf() == 2) == (id(p) in hidden), (group, tuple(p.shape))
            expected = 1 / p.infshape.width_mult() if p.infshape.ninf() == 2 else 1.0
            assert mult[group] == pytest.approx(expected), (group, tuple(p.shape))
    assert model.readout_mult() == pytest.approx(1 / model.head.decoder.weight.infshape.width_mult())


def _slopes(name, parametrization, **hp):
    df = coord_data(model=name, parametrization=parametrization, widths=WIDTHS, steps=4, lr=LR, seeds=2,
                    model_hp=hp)
    return coord_slopes(df)


@pytest.mark.slow  # the coordinate check at widths 32–256, 2 seeds, batch 16 (≈ 2 s each)
@pytest.mark.parametrize(("name", "hp"), [("bert", {}), ("bert", {"norm": "post", "tie_decoder": False}),
                                          ("ut", {}), ("ut", {"act": True})],
                         ids=["bert-pre-tied", "bert-post-untied", "ut", "ut-act"])
def test_mup_is_flat(name, hp):
    slopes = _slopes(name, "mup", **hp)
    judged = slopes[slopes.step.isin([1, 2, 3])]
    assert (judged[judged.name == "mlm_logits"].slope <= 0.2).all()
    hidden = judged[judged.name != "mlm_logits"]
    assert (hidden.slope.abs() <= 0.2).all(), hidden.sort_values("slope")
    assert coord_verdict(slopes, parametrization="mup").passed


@pytest.mark.slow  # the same size
@pytest.mark.parametrize("name", ["bert", "ut"])
def test_standard_grows(name):
    slopes = _slopes(name, "standard")
    step3 = slopes[(slopes.step == 3) & slopes.name.str.match(r"(attn_|ffn_out|hidden)")]
    assert step3.slope.max() >= 0.4, step3.sort_values("slope")
    assert not coord_verdict(slopes, parametrization="standard").passed


def test_standard_readout_keeps_bert_init_and_no_width_scaling():
    model = build_model("bert", **{**SMALL, "width": 256}, init_std=0.02)
    assert model.lr_multipliers() == dict.fromkeys(("input", "hidden", "output", "bias"), 1.0)
    assert model.readout_mult() == 1.0 and model.attn_scale() == pytest.approx(1 / math.sqrt(16))
    assert model.layers[0].ff1.weight.std().item() == pytest.approx(0.02, rel=0.05)
