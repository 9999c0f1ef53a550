"""`PTConfig.recompute`: the memory-lean backward is the same arithmetic as the stored one.

With `recompute=True` the per-bucket contexts and near-diagonal gathers are rebuilt in backward
instead of being kept (workers/models/pt.py). These tests pin (a) exactness: logits and every
parameter gradient agree with `recompute=False` to ≤ 1e-10 relative in float64, across the model's
options, and (b) the saving itself: the bytes autograd keeps for backward.
"""

from __future__ import annotations

import pytest
import torch

from workers.models import build_model
from workers.models.common import token_loss

TOL = 1e-10
BASE = {"vocab_size": 23, "width": 12, "base_width": 12, "n_channels": 2, "rank": 3, "n_iter": 3, "gamma": 2}
CASES = {
    "default": {},
    "gamma0": {"gamma": 0},
    "sync": {"async_update": False},
    "block_msg": {"block_msg": True},
    "uvw": {"decomposition": "uvw"},
    "full_T": {"decomposition": "none"},
    "topic": {"topic": "single_split", "n_topics": 4},
    "stepsize_damping": {"stepsize_Z": 0.7, "stepsize_H": 0.5, "damping_Z": 0.2, "damping_H": 0.6},
    "dropout": {"dropout": 0.2},
    "mup_rank": {"parametrization": "mup", "paradigm": "rank", "width": 24, "topic": "single_split", "n_topics": 4},
}


def run(hp: dict, recompute: bool, pad: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = build_model("pt", **{**BASE, **hp, "recompute": recompute}).double().train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 23, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.bool)
    if pad:
        mask[1, 7:] = False
    labels = torch.where(torch.rand(3, 11, generator=g) < 0.4, ids, torch.full_like(ids, -100)).masked_fill(~mask, -100)
    torch.manual_seed(2)  # the same dropout masks in both runs
    logits = model(ids, mask)
    (token_loss(logits, labels) + 0.1 * logits.square().mean()).backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


@pytest.mark.parametrize("hp", list(CASES.values()), ids=list(CASES))
def test_recompute_matches_stored_forward_and_gradients(hp):
    logits, grads = run(hp, recompute=True)
    ref_logits, ref_grads = run(hp, recompute=False)
    assert rel(logits, ref_logits) <= TOL
    assert grads.keys() == ref_grads.keys() and {"unary.weight", "decoder.weight"} <= grads.keys()
    for name, g in grads.items():
        assert rel(g, ref_grads[name]) <= TOL, name


def test_comparison_has_teeth():
    """A one-iteration change moves the gradients far beyond TOL, so the bound above can fail."""
    _, grads = run({}, recompute=True)
    _, other = run({"n_iter": 2}, recompute=False)
    assert rel(grads["U"], other["U"]) > 1e-3


def saved_bytes(recompute: bool) -> int:
    """Bytes of the distinct storages autograd keeps for backward in one training step."""
    torch.manual_seed(0)
    model = build_model("pt", **{**BASE, "recompute": recompute}).train()
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, 23, (2, 16))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = token_loss(model(ids), ids)
    loss.backward()
    return sum(seen.values())


def test_recompute_saves_under_half_the_bytes():
    """Stored: both (B, n, K·h·r) contexts and the (B, P, h, r) near gathers per iteration; lean: q and k.

    At the PTB config (B = 2) the saved bytes fall from 187 MB to 69 MB (24 MB of it the weights).
    """
    assert saved_bytes(recompute=True) <= 0.4 * saved_bytes(recompute=False)
