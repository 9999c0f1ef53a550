"""`studies.budget` against the real models: parameter counts equal `sum(p.numel())`, the solver meets each
budget within 2% on the built model, and the forward FLOP formula equals torch's own matmul count."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from studies import load_catalog
from studies.budget import forward_flops, param_count, width_for_budget
from studies.families.bert import BertArch
from studies.families.pt import PTArch
from studies.families.ut import UTArch
from workers.models import build_model

V, BASE = 300, 32
ARCHS = {
    "pt-rank": ("pt", PTArch(n_channels=2, rank=16, n_iter=2, gamma=2, paradigm="rank")),
    "pt-channels-topic": ("pt", PTArch(n_channels=2, rank=8, n_iter=2, gamma=1, topic="single_split", n_topics=32)),
    "pt-uvw": ("pt", PTArch(n_channels=2, rank=8, n_iter=2, gamma=0, decomposition="uvw")),
    "pt-none-blockmsg": ("pt", PTArch(n_channels=2, n_iter=1, gamma=2, decomposition="none", block_msg=True)),
    "bert": ("bert", BertArch(n_layers=2, head_dim=16, max_len=24)),
    "bert-post-untied-bare": ("bert", BertArch(n_layers=3, head_dim=8, max_len=24, norm="post", tie_decoder=False,
                                               mlm_transform=False)),
    "ut": ("ut", UTArch(n_steps=3, head_dim=16, max_len=24)),
    "ut-learned-act-untied": ("ut", UTArch(n_steps=2, head_dim=16, max_len=24, timing="learned", act=True,
                                           tie_decoder=False)),
}


def build(family, arch, width):
    parametrization = "standard" if family == "pt" and arch.decomposition != "uv" else "mup"
    return build_model(family, vocab_size=V, width=width, base_width=BASE, parametrization=parametrization,
                       **arch.model_dump())


@pytest.mark.parametrize("key", ARCHS)
def test_param_count_is_sum_of_numel(key):
    family, arch = ARCHS[key]
    for width in (32, 48, 64):
        model = build(family, arch, width)
        assert param_count(family, arch, width, V, BASE) == sum(p.numel() for p in model.parameters()), width


@pytest.mark.parametrize("family", ["pt", "bert", "ut"])
def test_solver_meets_budgets_on_the_built_model(family):
    """The compare_cpu study's three budgets with its archs (a 2000-word vocabulary), checked on the models."""
    spec = load_catalog("compare_cpu")
    arch = spec.model.arch if family == "pt" else next(
        b.model.arch for b in spec.compare.baselines if b.model.family == family)
    for budget in spec.compare.budgets:
        width = width_for_budget(family, arch, budget, 2000, spec.tune.base_width)
        model = build_model(family, vocab_size=2000, width=width, base_width=spec.tune.base_width,
                            **arch.model_dump())
        assert abs(sum(p.numel() for p in model.parameters()) / budget - 1) <= 0.02, (family, budget, width)


@pytest.mark.parametrize("key", ARCHS)
def test_forward_flops_match_torch_flop_counter(key):
    family, arch = ARCHS[key]
    model, n = build(family, arch, 48), 20
    ids = torch.randint(3, V, (1, n))
    select = torch.zeros(1, n, dtype=torch.bool)
    select[0, ::4] = True  # 5 decoded positions
    with FlopCounterMode(display=False) as counter:
        model(ids, select=select, trace={})  # trace: BERT/UT take the explicit attention path (matmuls)
    terms = forward_flops(family, arch, 48, V, n, int(select.sum()), BASE)
    near = terms.pop("near", 0)  # PT's near-diagonal products are elementwise in the code: torch does not count them
    assert counter.get_total_flops() == sum(terms.values()), terms
    assert (near > 0) == (family == "pt" and arch.gamma > 0)


def test_training_flops_are_three_forwards():
    family, arch = ARCHS["bert"]
    model, n = build(family, arch, 48), 20
    ids = torch.randint(3, V, (2, n))
    with FlopCounterMode(display=False) as counter:
        model(ids, trace={}).sum().backward()
    fwd = 2 * sum(forward_flops(family, arch, 48, V, n, n, BASE).values())
    assert counter.get_total_flops() == pytest.approx(3 * fwd)  # backward: the input and the weight gradients
