"""TauGPT: the taumode scalar, Laplacians, τ calibration, causality, the (V, λk) cache, μP groups, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from analysis.coord import coord_slopes, coord_verdict
from studies.family import FAMILIES, PLUGINS
from workers.coord_check import coord_data
from workers.laplacian import (
    chain_laplacian,
    check_laplacian,
    describe,
    from_weights,
    knn_laplacian,
    load_laplacian,
    rotated,
)
from workers.models import build_model, model_class, objective_of
from workers.models.tauformer import KVCache, apply_rope, rope_tables, taumode

V = 50


def tiny(**hp):
    torch.manual_seed(0)
    return build_model("tauformer", vocab_size=V, **{"width": 32, "head_dim": 8, "n_layers": 2, "max_len": 40, **hp})


def test_lambda_lies_in_zero_one_for_any_vector_scale():
    lap = chain_laplacian(16)
    x = torch.randn(500, 16) * torch.logspace(-4, 4, 500)[:, None]
    x[0] = 0.0  # the zero vector: E = 0
    energy, lam = taumode(x, lap, torch.tensor(1.0))
    assert float(lam.min()) >= 0.0 and float(lam.max()) < 1.0
    assert float(energy[0]) == 0.0 and float(lam[0]) == 0.0
    # scale-invariant (a Rayleigh quotient) wherever xᵀx ≫ ε, and bounded by L's spectrum
    big = x.pow(2).sum(1) > 1.0
    assert torch.allclose(taumode(3.0 * x[big], lap, torch.tensor(1.0))[1], lam[big], atol=1e-5)
    assert float(energy.max()) <= float(torch.linalg.eigvalsh(lap.double())[-1]) + 1e-5


def test_chain_laplacian_is_psd_with_a_constant_null_vector_and_the_path_spectrum():
    D = 12
    lap = chain_laplacian(D).double()
    assert torch.equal(lap, lap.T)
    assert lap.diagonal().tolist() == [1.0] + [2.0] * (D - 2) + [1.0]
    assert torch.allclose(lap @ torch.ones(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64))
    eig = torch.linalg.eigvalsh(lap)
    expected = torch.tensor([2 - 2 * math.cos(math.pi * k / D) for k in range(D)], dtype=torch.float64)
    assert torch.allclose(eig, expected, atol=1e-10)
    assert float(eig[0]) > -1e-12 and float(eig[1]) > 1e-3  # PSD, connected: one zero eigenvalue


def test_knn_laplacian_is_a_connected_laplacian_of_the_reduced_features():
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(400, 24)) @ rng.normal(size=(24, 24))  # correlated features
    lap = knn_laplacian(emb, 16, n_clusters=40)
    check_laplacian(lap, 16, "test")  # symmetric, rows sum to 0, PSD
    off = lap - torch.diag(lap.diagonal())
    assert float(off.max()) <= 0.0 and int((off < 0).sum()) > 0
    weights = -off[off < 0]
    assert float(weights.min()) >= 1 / (1 + (1.31 / 0.535) ** 1.8) - 1e-6 and float(weights.max()) <= 1.0
    with pytest.raises(ValueError, match="fewer than the Laplacian size"):
        knn_laplacian(emb[:, :8], 16)


def test_load_laplacian_checks_the_matrix_and_rotation_keeps_the_spectrum(tmp_path):
    lap = chain_laplacian(8)
    good, bad = tmp_path / "good.npy", tmp_path / "bad.npy"
    np.save(good, lap.numpy())
    np.save(bad, (lap + torch.eye(8)).numpy())
    assert torch.equal(load_laplacian(str(good), 8), lap)
    with pytest.raises(ValueError, match="do not sum to 0"):
        load_laplacian(str(bad), 8)
    with pytest.raises(ValueError, match=r"head_dim=16 needs \(16, 16\)"):
        load_laplacian(str(good), 16)
    turned = rotated(lap, seed=1)
    assert not torch.allclose(turned, lap, atol=1e-3)
    assert torch.allclose(torch.linalg.eigvalsh(turned.double()), torch.linalg.eigvalsh(lap.double()), atol=1e-5)
    model = tiny(laplacian="file", laplacian_path=str(good), laplacian_rotate=True, laplacian_seed=1)
    assert torch.allclose(model.laplacian, turned)


def test_calibration_sets_the_median_lambda_of_block0_keys_to_one_half():
    model = tiny()
    ids = torch.randint(3, V, (4, 33))
    tau = model.calibrate(ids, step=0)
    energy = model.block0_key_energies(ids)
    assert tau == pytest.approx(float(energy.median()))
    lam = energy / (energy + model.tau)
    assert float(lam.median()) == pytest.approx(0.5, abs=1e-6)
    assert model.calibrate(ids, step=1) is None  # not due: calibrate once by default
    fixed = tiny(tau_mode="fixed", tau=0.7)
    assert fixed.calibrate(ids, step=0) is None and float(fixed.tau) == pytest.approx(0.7)


def test_recalibration_moves_tau_by_the_ema():
    model = tiny(recalibrate_every=5, recalibrate_ema=0.75)
    a, b = torch.randint(3, V, (4, 20)), torch.randint(3, V, (4, 20))
    first = model.calibrate(a, 0)
    assert model.calibrate(b, 3) is None
    median_b = float(model.block0_key_energies(b).median())
    assert model.calibrate(b, 5) == pytest.approx(0.75 * first + 0.25 * median_b, rel=1e-5)
    assert int(model.calibrations) == 2


@pytest.mark.parametrize("attention", ["tau", "dot", "uniform"])
def test_attention_is_causal(attention):
    model = tiny(attention=attention)
    ids = torch.randint(3, V, (2, 16))
    changed = ids.clone()
    changed[:, 10:] = torch.randint(3, V, (2, 6))
    a, b = model(ids), model(changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:], atol=1e-4)


def test_uniform_attention_is_the_causal_mean_and_tau_attention_is_sharper():
    ids = torch.randint(3, V, (2, 24))
    entropy = {a: tiny(attention=a).monitor(ids)["tau.entropy.layer0"] for a in ("uniform", "tau")}
    assert entropy["uniform"] == pytest.approx(1.0, abs=1e-5)
    assert entropy["tau"] < 0.99  # T = 0.03 at init: the λ spread gives O(1) logit differences


@pytest.mark.parametrize("attention", ["tau", "dot"])
@pytest.mark.parametrize("kv_group", [1, 2])
def test_cached_generation_equals_the_full_forward(attention, kv_group):
    model = tiny(attention=attention, kv_group=kv_group)
    model.calibrate(torch.randint(3, V, (3, 20)), 0)
    prompt = torch.randint(3, V, (3, 7))
    cached_tokens, cached = model.generate(prompt, 12, use_cache=True)
    full_tokens, full = model.generate(prompt, 12, use_cache=False)
    assert torch.equal(cached_tokens, full_tokens)
    assert float((cached - full).abs().max()) <= 1e-4
    # prefill in two chunks, then compare every position with one full forward
    cache = model.new_cache(3, 19)
    with torch.no_grad():
        chunks = torch.cat([model(cached_tokens[:, :11], cache=cache), model(cached_tokens[:, 11:19], cache=cache)], 1)
        full_forward = model(cached_tokens[:, :19])
    assert cache.pos == 19
    assert float((chunks - full_forward).abs().max()) <= 1e-4


@pytest.mark.parametrize("head_dim", [32, 64])
def test_lambda_cache_saves_the_spec_fraction_of_a_kv_cache(head_dim):
    hp = {"width": 2 * head_dim, "head_dim": head_dim, "n_layers": 3, "max_len": 64}
    tau, dot = tiny(**hp), tiny(attention="dot", **hp)
    ids = torch.randint(3, V, (2, 50))
    sizes = {}
    for name, model, dtype in (("tau", tau, torch.float32), ("dot", dot, torch.float32),
                               ("tau_bf16", tau, torch.bfloat16), ("dot_bf16", dot, torch.bfloat16)):
        cache = model.new_cache(2, 64, dtype)
        model(ids, cache=cache)
        sizes[name] = cache.nbytes()
    D = head_dim
    kv_values = 2 * 3 * 2 * 2 * 50 * D  # K and V: 2 · layers · B · H_kv · T · D
    assert sizes["dot"] == 4 * kv_values and sizes["dot_bf16"] == 2 * kv_values
    saving = 1 - sizes["tau"] / sizes["dot"]  # fp32 V and λk: (D − 1) / 2D, 48.4% at 32, 49.2% at 64
    assert abs(saving - (D - 1) / (2 * D)) < 0.01
    assert saving == pytest.approx((D - 1) / (2 * D), abs=1e-9)
    # bf16 V with fp32 λk (spec §6's recommended layout): 2D + 4 bytes per token and head against 4D
    assert 1 - sizes["tau_bf16"] / sizes["dot_bf16"] == pytest.approx((D - 2) / (2 * D), abs=1e-9)


def test_cache_rejects_a_length_past_max_len():
    model = tiny()
    with pytest.raises(ValueError, match="raise max_len"):
        KVCache(model.cfg, 1, 41)
    with pytest.raises(ValueError, match="raise max_len"):
        model(torch.randint(3, V, (1, 41)))


def test_rope_is_half_split_and_relative_for_dot_products():
    D = 8
    cos, sin = rope_tables(20, D, 10000.0)
    q, k = torch.randn(D), torch.randn(D)

    def at(x, pos):
        return apply_rope(x.view(1, 1, 1, D), cos[pos:pos + 1], sin[pos:pos + 1]).view(D)

    assert torch.allclose(at(q, 5).norm(), q.norm(), atol=1e-5)
    assert float(at(q, 7) @ at(k, 3)) == pytest.approx(float(at(q, 14) @ at(k, 10)), abs=1e-4)
    # pair 0 (channels 0 and D/2) turns by 1 radian per position
    turned = at(torch.eye(D)[0], 1)
    assert float(turned[0]) == pytest.approx(math.cos(1.0), abs=1e-6)
    assert float(turned[D // 2]) == pytest.approx(math.sin(1.0), abs=1e-6)


def test_lambda_is_differentiable_and_the_temperature_learns():
    model = tiny()
    ids = torch.randint(3, V, (2, 16))
    torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten()).backward()
    attn = model.blocks[0].attn
    assert float(attn.c_q.weight.grad.abs().sum()) > 0 and float(attn.c_k.weight.grad.abs().sum()) > 0
    assert float(model.log_temp.grad.abs().sum()) > 0
    assert model.laplacian.grad is None and not model.laplacian.requires_grad
    # the spec's gradient: dλ/dx = τ / (E + τ)² · 2(Lx − E x) / (xᵀx + ε)
    lap, tau = chain_laplacian(8), torch.tensor(0.8)
    x = torch.randn(8, requires_grad=True)
    energy, lam = taumode(x, lap, tau)
    lam.backward()
    expected = tau / (energy + tau) ** 2 * 2 * (lap @ x - energy * x) / (x @ x + 1e-6)
    assert torch.allclose(x.grad, expected.detach(), atol=1e-5)


def test_mup_groups_learning_rates_and_readout():
    model = tiny(width=64, base_width=32, parametrization="mup")
    groups = model.groups
    n_params = sum(p.numel() for ps in groups.values() for p in ps)
    assert n_params == sum(p.numel() for p in model.parameters())  # every parameter in exactly one group
    assert groups["input"] == [model.wte.weight] and groups["output"] == [model.lm_head.weight]
    assert groups["bias"] == [model.log_temp] and all(p.dim() == 2 for p in groups["hidden"])
    assert model.lr_multipliers() == {"input": 1.0, "hidden": 0.5, "output": 1.0, "bias": 1.0}
    assert model.readout_mult() == 0.5
    standard = tiny(width=64, base_width=32)
    assert set(standard.lr_multipliers().values()) == {1.0} and standard.readout_mult() == 1.0
    # width grows by heads at a fixed head_dim: the attention kernel is width-invariant
    assert (model.cfg.n_heads, model.cfg.head_dim) == (8, 8) and model.log_temp.shape == (8,)


@pytest.mark.parametrize(("hp", "message"), [
    ({"width": 36}, "width=36 is not a multiple of model.arch.head_dim · kv_group = 8"),
    ({"head_dim": 7, "width": 28, "base_width": 28}, "must be even"),
    ({"laplacian": "file"}, "laplacian_path must be set for laplacian 'file'"),
    ({"attention": "flash"}, r"attention\n  Input should be 'tau', 'dot' or 'uniform'.*input_value='flash'"),
    ({"temperature": 0.0}, r"temperature\n  Input should be greater than 0"),
])
def test_config_errors_name_the_field_and_the_fix(hp, message):
    with pytest.raises(ValueError, match=message):
        tiny(**{"base_width": 32, **hp})


def test_monitor_reports_per_layer_quantiles_entropy_temperature_and_tau():
    model = tiny(n_layers=3)
    ids = torch.randint(3, V, (2, 20))
    model.calibrate(ids, 0)
    stats = model.monitor(ids)
    for layer in ("layer0", "layer1", "layer2"):
        for tag in ("E_q", "E_k", "lambda_q", "lambda_k"):
            p05, p50, p95 = (stats[f"tau.{tag}.{q}.{layer}"] for q in ("p05", "p50", "p95"))
            assert p05 <= p50 <= p95
        assert 0.0 < stats[f"tau.entropy.{layer}"] <= 1.0
    assert stats["tau.lambda_k.p50.layer0"] == pytest.approx(0.5, abs=0.02)  # calibrated on this batch
    assert stats["tau.temperature.mean"] == pytest.approx(0.03) and stats["tau.tau"] == float(model.tau)


@pytest.mark.slow  # the coordinate check at widths 32–256, 2 seeds, batch 16 (≈ 2 s each)
@pytest.mark.parametrize("parametrization", ["mup", "standard"])
def test_coordinate_check_passes_under_mup_and_fails_under_standard(parametrization):
    """Widths 32–256 = 2–16 heads of 16 dims (spec §7.2), the same lr; steps 1–3 judged."""
    df = coord_data("tauformer", parametrization, widths=(32, 64, 128, 256), steps=4, seeds=2)
    slopes = coord_slopes(df)
    verdict = coord_verdict(slopes, parametrization=parametrization, output_name="lm_logits")
    judged = slopes[slopes.step.isin([1, 2, 3])]
    taumode_stats = judged[judged.name.str.match(r"lambda_|attn_logits")]
    assert (taumode_stats.slope.abs() <= 0.2).all()  # the attention kernel is width-invariant in both
    if parametrization == "mup":
        assert verdict.passed, verdict.verdict
    else:  # one lr for every width: hidden updates grow with width
        assert not verdict.passed
        assert judged[judged.name.str.startswith("mlp_out")].slope.max() >= 0.8


def test_every_built_in_family_has_a_model_class_and_only_taugpt_and_hf_are_causal():
    built_in = [name for name in FAMILIES if name not in PLUGINS]  # installed plugins (the example) bring their own
    assert {name: objective_of(name) for name in built_in} == {"pt": "mlm", "bert": "mlm", "ut": "mlm",
                                                               "tauformer": "clm", "hf": "clm"}
    assert all(isinstance(model_class(name), type) for name in built_in)
    with pytest.raises(ValueError, match="choose one of"):
        objective_of("gpt5")


def test_describe_counts_edges_degrees_and_connected_components():
    chain = describe(chain_laplacian(12))
    assert (chain["edges"], chain["neighbours_min"], chain["neighbours_max"], chain["components"]) == (11, 1, 2, 1)
    assert chain["trace_over_dim"] == pytest.approx(2 * 11 / 12)
    two_pieces = torch.zeros(6, 6, dtype=torch.float64)
    two_pieces[0, 1] = two_pieces[1, 0] = two_pieces[3, 4] = two_pieces[4, 3] = two_pieces[4, 5] = two_pieces[5, 4] = 1
    split = describe(from_weights(two_pieces))
    assert split["edges"] == 3 and split["components"] == 3  # {0, 1}, {2} alone, {3, 4, 5}
