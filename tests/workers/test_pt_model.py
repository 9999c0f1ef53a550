"""Fast unit tests of the PT model: config validation, width paradigms, μP init and learning-rate
rules, the ternary-norm penalty, the trace, padding invariance, and the memory shape of the
vectorised forward (no (B, K, h, n, n) tensor). The forward's numbers are checked against the
literal MFVI equations in test_pt_reference.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from studies.families.pt import PTConfig
from workers.models import build_model
from workers.models.common import token_loss

SMALL = {"vocab_size": 50, "width": 16, "base_width": 16, "n_channels": 2, "rank": 4, "n_iter": 2}


# --------------------------------------------------------------------------------------------
# config validation
# --------------------------------------------------------------------------------------------
def test_unknown_key_lists_valid_keys():
    """The arch's fields and the hparams, which `--set` sets; not the sizes a trial adds (width, vocab_size, ...)."""
    with pytest.raises(ValueError, match="bogus") as err:
        build_model("pt", bogus=1)
    valid = str(err.value).split("valid ones are ", 1)[1]
    for name in ("n_iter", "decomposition", "w_H"):
        assert f"'{name}'" in valid
    for name in ("width", "base_width", "parametrization", "vocab_size"):
        assert f"'{name}'" not in valid


def test_unknown_model_name():
    with pytest.raises(ValueError, match="'pt'"):
        build_model("gpt-9", vocab_size=10)


@pytest.mark.parametrize(
    "field",
    ["decomposition", "topic", "parametrization", "paradigm", "tau_form", "output_init", "topic_coef"],
)
def test_bad_enum_names_field(field):
    with pytest.raises(ValueError, match=rf"{field}\n.*input_value='nope'") as err:
        build_model("pt", vocab_size=10, **{field: "nope"})
    default = getattr(PTConfig(vocab_size=10), field)
    assert repr(default) in str(err.value)  # the valid choices are listed


@pytest.mark.parametrize(
    ("hp", "field"),
    [
        ({"width": 0}, "width"),
        ({"n_iter": 0}, "n_iter"),
        ({"gamma": -1}, "gamma"),
        ({"dropout": 1.0}, "dropout"),
        ({"stepsize_Z": 0.0}, "stepsize_Z"),
        ({"stepsize_H": 1.5}, "stepsize_H"),
        ({"damping_Z": 1.0}, "damping_Z"),
        ({"damping_H": -0.1}, "damping_H"),
    ],
)
def test_bad_numbers_name_field(hp, field):
    with pytest.raises(ValueError, match=rf"PTConfig\n{field}\n"):
        build_model("pt", vocab_size=10, **hp)


def test_root_is_rejected_clearly():
    with pytest.raises(ValueError, match=r"root-node variant .* is not implemented: set root: false"):
        build_model("pt", vocab_size=10, root=True)


@pytest.mark.parametrize("decomposition", ["uvw", "none"])
def test_mup_requires_uv(decomposition):
    with pytest.raises(ValueError, match=rf"decomposition='{decomposition}'.*uv"):
        build_model("pt", vocab_size=10, parametrization="mup", decomposition=decomposition)
    build_model("pt", vocab_size=10, decomposition=decomposition)  # fine under standard


@pytest.mark.parametrize(
    ("hp", "culprit"),
    [
        # channels: h = 4·72/64 = 4.5
        ({"paradigm": "channels", "width": 72, "n_channels": 4, "rank": 8, "n_topics": 64}, "n_channels"),
        # rank: r = 12·40/64 = 7.5
        ({"paradigm": "rank", "width": 40, "n_channels": 8, "rank": 12, "n_topics": 64}, "rank"),
    ],
)
def test_width_incompatible_with_paradigm(hp, culprit):
    with pytest.raises(ValueError, match=rf"width={hp['width']} is incompatible with .*base_width=64") as err:
        build_model("pt", vocab_size=10, base_width=64, **hp)
    assert f"{culprit}=" in str(err.value)


def test_width_check_only_scaled_sizes():
    model = build_model("pt", vocab_size=10, base_width=64, width=72, n_channels=8, rank=3)
    assert (model.cfg.h, model.cfg.r) == (9, 3)


# --------------------------------------------------------------------------------------------
# paradigms and parameter shapes
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [64, 128, 256])
def test_paradigm_channels_scales_h(width):
    model = build_model("pt", vocab_size=10, width=width, base_width=64, n_channels=4, rank=16, gamma=3)
    mult = width // 64
    assert (model.cfg.h, model.cfg.r, model.cfg.n_buckets) == (4 * mult, 16, 8)
    assert model.U.shape == model.V.shape == (8, 4 * mult, width, 16)


@pytest.mark.parametrize("width", [64, 128, 256])
def test_paradigm_rank_scales_r(width):
    model = build_model("pt", vocab_size=10, width=width, base_width=64, n_channels=4, rank=16, paradigm="rank")
    mult = width // 64
    assert (model.cfg.h, model.cfg.r) == (4, 16 * mult)
    assert model.U.shape == model.V.shape == (8, 4, width, 16 * mult)


def test_shapes_other_decompositions_and_topics():
    uvw = build_model("pt", vocab_size=10, width=32, base_width=16, n_channels=2, rank=4, gamma=1, decomposition="uvw")
    assert uvw.U.shape == uvw.V.shape == (4, 32, 4) and uvw.W.shape == (4, 4, 4)
    full = build_model("pt", vocab_size=10, width=32, base_width=16, n_channels=2, gamma=0, decomposition="none")
    assert full.T.shape == (2, 4, 32, 32)  # γ = 0: one bucket per direction (the authors' dists = "")
    topic = build_model("pt", vocab_size=10, width=32, base_width=16, n_topics=8, topic="single_split")
    assert topic.B.shape == (16, 32)  # m ∝ d
    assert {id(p) for p in topic.groups["hidden"]} == {id(topic.U), id(topic.V), id(topic.B)}


# --------------------------------------------------------------------------------------------
# μP init and learning rates
# --------------------------------------------------------------------------------------------
def test_lr_multipliers():
    std = build_model("pt", vocab_size=10, width=256, base_width=64)
    assert std.lr_multipliers() == {"input": 1.0, "hidden": 1.0, "output": 1.0, "bias": 1.0}
    mup = build_model("pt", vocab_size=10, width=256, base_width=64, parametrization="mup")
    assert mup.lr_multipliers() == {"input": 1.0, "hidden": 0.25, "output": 0.25, "bias": 1.0}
    base = build_model("pt", vocab_size=10, width=64, base_width=64, parametrization="mup")
    assert set(base.lr_multipliers().values()) == {1.0}
    # every parameter is in exactly one group
    grouped = [id(p) for ps in mup.groups.values() for p in ps]
    assert sorted(grouped) == sorted(id(p) for p in mup.parameters())


@pytest.mark.parametrize("paradigm", ["channels", "rank"])
def test_mup_hidden_init_std(paradigm):
    for width in (64, 256):
        torch.manual_seed(0)
        model = build_model(
            "pt",
            vocab_size=10,
            width=width,
            base_width=64,
            parametrization="mup",
            paradigm=paradigm,
            topic="single_split",
            init_std_hidden=0.5,
        )
        want = 0.5 / math.sqrt(width)
        for p in (model.U, model.V, model.B):
            assert p.std().item() == pytest.approx(want, rel=0.03)
            assert abs(p.mean().item()) < 0.05 * want
        assert model.unary.weight.std().item() == pytest.approx(1.0, rel=0.03)  # width-independent


@pytest.mark.parametrize(("output_init", "power"), [("inv_d", 1.0), ("inv_sqrt_d", 0.5)])
def test_mup_decoder_init_std(output_init, power):
    stds = {}
    for width in (64, 256):
        torch.manual_seed(0)
        model = build_model(
            "pt", vocab_size=2000, width=width, base_width=64, parametrization="mup", output_init=output_init
        )
        stds[width] = model.decoder.weight.std().item()
        want = 1.0 / math.sqrt(64) * (64 / width) ** power
        assert stds[width] == pytest.approx(want, rel=0.03)
        assert torch.count_nonzero(model.decoder.bias) == 0
    assert stds[64] / stds[256] == pytest.approx(4.0**power, rel=0.04)


def test_standard_init_follows_authors():
    torch.manual_seed(0)
    model = build_model("pt", vocab_size=10, width=128, base_width=64, rank=16)
    assert model.U.std().item() == pytest.approx(1 / math.sqrt(16), rel=0.03)
    bound = math.sqrt(6 / (10 + 128))  # Xavier-uniform S
    assert model.unary.weight.abs().max().item() <= bound
    assert model.unary.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)


# --------------------------------------------------------------------------------------------
# ternary norm
# --------------------------------------------------------------------------------------------
def explicit_t(model) -> torch.Tensor:
    """The full (K, h, d, d) ternary tensor, entry by entry."""
    cfg = model.cfg
    if cfg.decomposition == "none":
        return model.T.detach()
    K, h, d = cfg.n_buckets, cfg.h, cfg.width
    T = torch.zeros(K, h, d, d, dtype=torch.float64)
    for k in range(K):
        for c in range(h):
            if cfg.decomposition == "uv":
                T[k, c] = model.U[k, c].double() @ model.V[k, c].double().T
            else:
                for l in range(cfg.r):
                    T[k, c] += model.W[k, c, l].double() * torch.outer(model.U[k, :, l], model.V[k, :, l]).double()
    return T


@pytest.mark.parametrize("decomposition", ["uv", "uvw", "none"])
def test_t_norm_is_frobenius_of_full_tensor(decomposition):
    torch.manual_seed(0)
    model = build_model("pt", **{**SMALL, "gamma": 2}, decomposition=decomposition)
    want = explicit_t(model).norm().item()
    got = model.t_norm()
    assert got.item() == pytest.approx(want, rel=1e-5)
    got.backward()  # a differentiable penalty
    assert all(p.grad is not None for p in model.groups["hidden"])


# --------------------------------------------------------------------------------------------
# trace
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("topic", ["none", "single_split"])
def test_trace_keys(topic):
    model = build_model("pt", **{**SMALL, "n_iter": 3}, topic=topic).eval()
    ids = torch.randint(0, 50, (2, 9))
    trace: dict[str, torch.Tensor] = {}
    logits = model(ids, trace=trace)
    want = {"mlm_logits"}
    for t in range(3):
        want |= {f"z_logits.iter{t}", f"head_logits.iter{t}", f"msg_dep.iter{t}", f"msg_head.iter{t}"}
        if topic == "single_split":
            want |= {f"topic_logits.iter{t}", f"msg_topic.iter{t}"}
    assert set(trace) == want
    assert torch.equal(trace["mlm_logits"], logits)
    assert torch.equal(model.decoder(trace["z_logits.iter2"]), logits)
    assert trace["head_logits.iter0"].numel() == 2 * model.cfg.h * 9 * 8  # valid (i ≠ j) entries only
    assert (trace["head_logits.iter0"] > -1e8).all()


def test_trace_block_msg_has_no_head_message():
    model = build_model("pt", **SMALL, block_msg=True)
    trace: dict[str, torch.Tensor] = {}
    model(torch.randint(0, 50, (1, 5)), trace=trace)
    assert not any(k.startswith("msg_head") for k in trace)


# --------------------------------------------------------------------------------------------
# padding invariance
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "hp",
    [
        {"gamma": 3},
        {"gamma": 3, "async_update": False},
        {"gamma": 0, "decomposition": "none"},
        {"gamma": 2, "decomposition": "uvw", "topic": "single_split"},
        {"gamma": 3, "parametrization": "mup", "topic": "single_split"},
    ],
    ids=["async", "sync", "gamma0-none", "uvw-topic", "mup-topic"],
)
def test_padding_does_not_change_real_logits(hp):
    torch.manual_seed(0)
    model = build_model("pt", **{**SMALL, **hp, "n_iter": 3}).eval()
    ids = torch.randint(0, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False  # second sequence has 6 real words
    with torch.no_grad():
        short = model(ids, mask)
        long_ids = torch.cat([ids, torch.randint(0, 50, (2, 7))], 1)  # junk ids under the padding
        long_mask = torch.cat([mask, torch.zeros(2, 7, dtype=torch.bool)], 1)
        long = model(long_ids, long_mask)
        alone = model(ids[1:, :6])  # the short sequence alone, unpadded
    assert torch.allclose(long[:, :9][mask], short[mask], atol=1e-5)
    assert torch.allclose(alone[0], short[1, :6], atol=1e-5)
    assert torch.isfinite(long).all()


def test_no_mask_equals_all_true_mask():
    model = build_model("pt", **SMALL).eval()
    ids = torch.randint(0, 50, (2, 7))
    assert torch.equal(model(ids), model(ids, torch.ones(2, 7, dtype=torch.bool)))


# --------------------------------------------------------------------------------------------
# memory: the forward never builds a (B, K, h, n, n) tensor
# --------------------------------------------------------------------------------------------
class StorageSizes(TorchDispatchMode):
    """Records the byte size of the storage behind every tensor an op returns (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = (0, "", ())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                size = t.untyped_storage().nbytes()
                if size > self.largest[0]:
                    self.largest = (size, str(func), tuple(t.shape))
        return out


def dense_reference_scores(model, ids):
    """A deliberately naive step that materialises (and saves for backward) every bucket's q_k k_kᵀ."""
    P = torch.softmax(model.unary(ids), -1)
    q = torch.einsum("bnd,khdr->bkhnr", P, model.U)
    k = torch.einsum("bnd,khdr->bkhnr", P, model.V)
    return torch.softmax(q @ k.transpose(-1, -2), -1).sum(1)  # (B, K, h, n, n) before the sum


def run_and_measure(fn) -> tuple[tuple, list[int]]:
    saved: list[int] = []

    def pack(t):
        saved.append(t.untyped_storage().nbytes())
        return t

    mode = StorageSizes()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), mode:
        fn().float().pow(2).mean().backward()
    return mode.largest, saved


@pytest.mark.parametrize("topic", ["none", "single_split"])
def test_forward_never_allocates_bucketed_attention(topic):
    B, n, gamma = 2, 64, 3
    torch.manual_seed(0)
    model = build_model("pt", vocab_size=50, width=32, base_width=32, n_channels=4, rank=8, gamma=gamma, topic=topic)
    K, h = model.cfg.n_buckets, model.cfg.h
    assert K == 8
    limit = B * K * h * n * n * 4  # bytes of one float32 (B, K, h, n, n) tensor
    ids = torch.randint(0, 50, (B, n))
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[1, 50:] = False

    # positive control: the detector sees a dense bucketed tensor when one exists
    (naive_largest, _, naive_shape), naive_saved = run_and_measure(lambda: dense_reference_scores(model, ids))
    assert naive_largest >= limit, naive_shape
    assert max(naive_saved) >= limit
    model.zero_grad()

    (largest, op, shape), saved = run_and_measure(lambda: token_loss(model(ids, mask), ids))
    assert largest < limit, f"{op} returned a {shape} tensor ({largest} B ≥ {limit} B)"
    assert max(saved) < limit
    # the biggest n×n tensors are (B, h, n, n): at most 2/K of the dense bucketed size
    assert largest <= 2 * limit // K, (op, shape)
    assert all(p.grad is not None for p in model.parameters() if p is not model.unary.weight)


# --------------------------------------------------------------------------------------------
# dropout placement (the authors' code: async drops H probabilities, sync drops H logits)
# --------------------------------------------------------------------------------------------
class _Recorder(torch.nn.Module):
    """Stands in for a dropout module: records what it is given, drops nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        return x


@pytest.mark.parametrize("async_update", [True, False])
def test_h_dropout_sees_probabilities_async_and_logits_sync(async_update):
    model = build_model("pt", **SMALL, gamma=1, dropout=0.1, async_update=async_update).train()
    model.drop_h = _Recorder()
    trace: dict[str, torch.Tensor] = {}
    model(torch.randint(0, 50, (2, 7)), trace=trace)
    assert len(model.drop_h.seen) == SMALL["n_iter"]
    for t, x in enumerate(model.drop_h.seen):
        rows = x.sum(-1)
        if async_update:  # probabilities: each dependent's head distribution sums to 1
            assert torch.allclose(rows, torch.ones_like(rows)) and (x >= 0).all()
        else:  # the logits of this iteration's H message, exactly as traced
            assert (x < 0).any() and not torch.allclose(rows, torch.ones_like(rows))
            valid = x > -1e8
            assert torch.equal(x[valid], trace[f"head_logits.iter{t}"])


def test_sync_logit_dropout_never_opens_a_masked_head():
    """A dropped (zeroed) −1e9 logit is masked again before the softmax: no weight on self or padding."""
    torch.manual_seed(0)
    model = build_model("pt", **SMALL, gamma=1, dropout=0.9, async_update=False).train()
    seen: list[torch.Tensor] = []
    model._messages = lambda A, *rest, f=model._messages: seen.append(A.detach()) or f(A, *rest)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    model(torch.randint(0, 50, (2, 7)), mask)
    assert len(seen) == SMALL["n_iter"]  # every iteration's H marginals, whichever kernels compute the messages
    for A in seen:  # rows of real dependents (a padding row has no valid head and is never read)
        assert A[0].diagonal(dim1=-2, dim2=-1).abs().max() == 0
        assert A[1, :, :5].diagonal(dim1=-2, dim2=-1).abs().max() == 0
        assert A[1, :, :5, 5:].abs().max() == 0
        assert torch.allclose(A[0].sum(-1), torch.ones(A.shape[1], 7))
