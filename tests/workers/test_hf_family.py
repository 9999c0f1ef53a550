"""The `hf` family (`studies/families/hf.py`, `workers/models/hf.py`): transformers' own models built from a config
in code, their width keys set by ptctl, μP by ptctl's rules, and counts that match the built model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from pydantic import ValidationError
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from studies import load_catalog
from studies.families.hf import RULES, HFArch, HFConfig, hf_flops, hf_params
from studies.spec import StudySpec
from workers.attention import traced_attention
from workers.model_check import check_model
from workers.models import build_model

VOCAB = 61
ARCHES = [
    {"model_type": "gpt2"},
    {"model_type": "gpt2", "config": {"tie_word_embeddings": False}, "head_dim": None, "n_heads": 2},
    {"model_type": "llama", "kv_group": 2, "ffn_ratio": 2.6875},
    {"model_type": "llama", "config": {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}},
    {"model_type": "qwen2", "kv_group": 2},
    {"model_type": "gpt_neox", "head_dim": None, "n_heads": 4},
    {"model_type": "gpt_neox", "config": {"attention_bias": False}},
]


def _build(arch: dict, width: int = 64, parametrization: str = "mup", **hp):
    torch.manual_seed(0)
    return build_model("hf", vocab_size=VOCAB, width=width, base_width=32, parametrization=parametrization,
                       **arch, **hp)


@pytest.mark.parametrize("arch", ARCHES, ids=lambda a: json.dumps(a, sort_keys=True))
def test_parameter_and_flop_counts_match_the_built_model(arch):
    model = _build(arch)
    assert hf_params(HFArch(**arch), 64, VOCAB) == sum(p.numel() for p in model.parameters())
    ids = torch.randint(VOCAB, (1, 16))
    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):  # counted
        model(ids, torch.ones_like(ids, dtype=torch.bool))
    assert sum(hf_flops(HFArch(**arch), 64, VOCAB, 16, 16).values()) == pytest.approx(counter.get_total_flops(),
                                                                                       rel=1e-9)


def test_the_rules_defaults_are_transformers_own():
    from transformers import AutoConfig

    for model_type, rules in RULES.items():
        hf = AutoConfig.for_model(model_type)
        assert getattr(hf, rules.context) == rules.context_default, model_type
        assert bool(getattr(hf, "tie_word_embeddings", False)) == rules.tie_default, model_type
        for flag in (rules.qkv_bias, rules.out_bias, rules.ffn_bias):
            if not isinstance(flag, bool):
                assert getattr(hf, flag[0]) == flag[1], (model_type, flag)


@pytest.mark.parametrize("model_type", sorted(RULES))
@pytest.mark.parametrize("parametrization", ["mup", "standard"])
def test_every_architecture_keeps_the_model_contract(model_type, parametrization):
    check_model("hf", {"model_type": model_type, "width": 32, "base_width": 32, "parametrization": parametrization},
                16)


def test_the_config_passes_through_and_the_width_keys_are_ptctls():
    model = _build({"model_type": "llama", "kv_group": 2, "config": {"rope_theta": 5000.0, "hidden_size": 999,
                                                                       "rms_norm_eps": 1e-5}}, width=128)
    hf = model.lm.config
    assert (hf.hidden_size, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim) == (128, 8, 4, 16)
    assert (hf.intermediate_size, hf.num_hidden_layers, hf.vocab_size) == (512, 2, VOCAB)
    assert hf.rms_norm_eps == 1e-5 and hf.bos_token_id is None
    assert hf.rope_parameters["rope_theta"] == 5000.0


def test_nothing_is_downloaded_a_model_builds_with_the_hub_offline():
    code = ("from workers.models import build_model; "
            "m = build_model('hf', vocab_size=61, width=32, model_type='qwen2'); print(type(m.lm).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": "/nonexistent"})
    assert out.returncode == 0 and out.stdout.split()[-1] == "Qwen2ForCausalLM", out.stderr[-2000:]


def test_mup_rules_as_built():
    narrow, wide = _build({"model_type": "gpt2"}, 32), _build({"model_type": "gpt2"}, 128)
    assert narrow.lr_multipliers()["hidden"] == 1.0 and wide.lr_multipliers()["hidden"] == 0.25
    assert (narrow.readout_scale, wide.readout_scale) == (1.0, 0.25)
    scales = {m.ptctl_scale for m in wide.modules() if "ptctl_scale" in vars(m)}
    assert scales == {1.0 / 16}  # attn_mult / head_dim
    std = {w: float(torch.cat([p.flatten() for p in m.groups["hidden"]]).std()) for w, m in ((32, narrow),
                                                                                              (128, wide))}
    assert std[128] / std[32] == pytest.approx(0.5, rel=0.1)  # ∝ 1/√width
    emb = {w: float(m.groups["input"][0].std()) for w, m in ((32, narrow), (128, wide))}
    assert emb[128] == pytest.approx(emb[32], rel=0.1) == pytest.approx(0.02, rel=0.1)
    standard = _build({"model_type": "gpt2"}, 128, "standard", attn_mult=2.0)
    assert {m.ptctl_scale for m in standard.modules() if "ptctl_scale" in vars(m)} == {2.0 / math.sqrt(16)}
    assert standard.lr_multipliers() == dict.fromkeys(["input", "hidden", "output", "bias"], 1.0)


def test_the_attention_scale_takes_effect_in_every_layer():
    model = _build({"model_type": "qwen2", "config": {"num_hidden_layers": 1}}, 64, attn_mult=3.0, n_layers=1)
    ids = torch.randint(VOCAB, (2, 8))
    traces = []
    for factor in (1.0, 2.0):
        for m in model.modules():
            if "ptctl_scale" in vars(m):
                m.ptctl_scale *= factor
        trace: dict[str, torch.Tensor] = {}
        with traced_attention(model, trace), torch.no_grad():
            model(ids, torch.ones_like(ids, dtype=torch.bool), trace=trace)
        traces.append(trace)
    name = "attn_logits.lm.model.layers.0.self_attn"
    assert [n for n in traces[0] if n.startswith("attn_logits.")] == [name]
    assert torch.allclose(traces[1][name], 2 * traces[0][name], rtol=1e-5)
    assert 3.0 / 16 in {m.ptctl_scale / 2 for m in model.modules() if "ptctl_scale" in vars(m)}


def test_a_config_file_is_read_and_the_api_takes_mappings_only(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "rope_theta": 1000.0}))
    assert HFArch(model_type="llama", config=str(path)).config == {"model_type": "llama", "rope_theta": 1000.0}
    with pytest.raises(ValidationError, match="model_type 'llama' but model.arch.model_type is 'gpt2'"):
        HFArch(model_type="gpt2", config=str(path))
    with pytest.raises(ValidationError, match="cannot read"):
        HFArch(config=str(tmp_path / "missing.json"))
    with pytest.raises(ValidationError, match="does not read on its host"):
        HFArch.model_validate({"config": str(path)}, context={"strict": True})
    with pytest.raises(ValidationError, match="give exactly one"):
        HFArch(head_dim=None)


def test_the_context_is_checked_against_the_configs_own_key():
    data = load_catalog("tiny").as_dict()
    data["model"] = {"family": "hf", "parametrization": "mup",
                     "arch": {"model_type": "gpt2", "config": {"n_positions": 8}}}
    data["space"], data["data"] = {}, {**data["data"], "objective": "clm"}
    with pytest.raises(ValidationError, match=r"exceeds model.arch.config.n_positions 8"):
        StudySpec.model_validate(data)


def test_width_keys_follow_the_declared_rules():
    fixed_heads = HFConfig(model_type="gpt_neox", head_dim=None, n_heads=4, width=256, vocab_size=VOCAB,
                           base_width=64)
    assert fixed_heads.hf_kwargs()["num_attention_heads"] == 4
    assert fixed_heads.heads_at(256) == (4, 4, 64)
    with pytest.raises(ValidationError, match="not a multiple of 32"):
        HFConfig(model_type="llama", kv_group=2, width=48, vocab_size=VOCAB)
    with pytest.raises(ValidationError, match="no grouped-query attention"):
        HFArch(model_type="gpt2", kv_group=2)


def test_a_config_transformers_refuses_is_an_error_naming_the_config():
    from workers.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.arch.config: transformers cannot build a llama model from it \("):
        _build({"model_type": "llama", "config": {"hidden_act": "no_such_activation"}})
    with pytest.raises(ValidationError, match=r"model.arch.config.attn_implementation is ptctl's to set"):
        HFArch(config={"attn_implementation": "eager"})
