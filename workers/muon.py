"""Muon on the hidden matrices, AdamW on the rest (`train.optimizer: muon`), and μP for Muon (docs/mup.md).

Muon's step is torch.optim.Muon's (momentum B ← μB + (1−μ)g, Nesterov's update g + μ(B − g), the quintic
Newton–Schulz iteration O in bfloat16 with torch's coefficients, decoupled decay p ← p·(1 − η·λ), then
p ← p − η·s·O), extended to stacks of matrices (a PT factor's buckets and channels; a batched trial's members), each
orthogonalised on its own. On one 2-D matrix it equals torch.optim.Muon (tests/workers/test_muon.py).

`matrix_rules` gives each Muon matrix its factor s on the group's lr and its factor on the decay. s is
torch's `adjust_lr_fn` (`train.muon_adjust_lr`) of the matrix's base-width shape, scaled under mup by the
spectral condition (Yang, Simon & Bernstein 2023): an orthogonalised update has spectral norm ≈ 1 whatever the
shape, and ‖ΔW‖ must scale as √(fan_out/fan_in), so s = adjust(m0, n0) · √((m/n) / (m0/n0)) for a matrix of
fan-out m and fan-in n (m0, n0 at base_width). At the base width mup and standard agree; a matrix whose fans
both grow with width keeps s (square and FFN weights: the width-invariant rule), one with a fixed fan-out
(PT's rank-r factors under the channels paradigm) gets s ∝ 1/√width_mult. Under standard s is torch's own factor
at every width (match_rms_adamw: 0.2·√max(m, n), growing as √width).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from workers.models.contract import LanguageModel

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's quintic (Keller Jordan's)
NS_EPS = 1e-7  # torch.optim.Muon's eps on the norm the iteration starts from


@dataclass(frozen=True)
class MatrixRule:
    """One Muon matrix: its fan-in dimension, the factor on its group's lr (`scale`) and on its decay (`decay`)."""

    fan_in_dim: int
    scale: float
    decay: float


def adjust(rule: str, fan_out: int, fan_in: int) -> float:
    """torch.optim.Muon's `adjust_lr_fn` factor for a (fan_out, fan_in) matrix."""
    if rule == "match_rms_adamw":
        return 0.2 * math.sqrt(max(fan_out, fan_in))
    return math.sqrt(max(1.0, fan_out / fan_in))


def fans(shape: torch.Size | tuple[int, ...], fan_in_dim: int) -> tuple[int, int]:
    """(fan_out, fan_in) of a matrix stored with its fan-in at `fan_in_dim` (-1 or -2) of its last two dims."""
    fan_in = shape[fan_in_dim]
    return shape[-2 if fan_in_dim == -1 else -1], fan_in


def matrix_rules(model: LanguageModel, cfg: Any) -> dict[str, MatrixRule]:
    """Each Muon matrix of `model` by parameter name (module docstring); `cfg` a `TrialConfig`. The decay factor:
    under `train.weight_decay_form: coupled` the μP correction s/adjust(m, n) (decay per step follows the corrected
    lr, as AdamW's hidden decay follows lr/width_mult), under `independent` 1 (η·λ per step at every width)."""
    layout = model.matrices()
    params = dict(model.named_parameters())
    mup = getattr(getattr(model, "cfg", None), "parametrization", "standard") == "mup"
    base = model.base_shapes() if mup else {}
    rules = {}
    for name, dim in layout.items():
        m, n = fans(params[name].shape, dim)
        here = adjust(cfg.muon_adjust_lr, m, n)
        scale = here
        if mup:
            m0, n0 = fans(base[name], dim)
            scale = adjust(cfg.muon_adjust_lr, m0, n0) * math.sqrt((m / n) / (m0 / n0))
        rules[name] = MatrixRule(dim, scale, scale / here if cfg.weight_decay_form == "coupled" else 1.0)
    return rules


def _mm(beta: float, x: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """beta·x + alpha·m1 @ m2, as torch.addmm for matrices and torch.baddbmm for stacks."""
    if x.dim() == 2:
        return torch.addmm(x, m1, m2, beta=beta, alpha=alpha)
    return torch.baddbmm(x, m1, m2, beta=beta, alpha=alpha)


def orthogonalize(g: torch.Tensor, steps: int, fan_in_dim: int = -1) -> torch.Tensor:
    """torch.optim.Muon's Newton–Schulz orthogonalisation (bfloat16) of each matrix in `g`'s last two dimensions
    (leading ones: a stack, each matrix on its own). `fan_in_dim` -2 reads (in, out) matrices as (out, in)."""
    a, b, c = NS_COEFFICIENTS
    x = g.bfloat16()
    if fan_in_dim == -2:
        x = x.mT
    lead = x.shape[:-2]
    x = x.reshape(-1, *x.shape[-2:]) if lead else x
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    norm = x.norm() if x.dim() == 2 else torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    x = x / norm.clamp(min=NS_EPS)
    for _ in range(steps):
        gram = x @ x.mT
        x = _mm(a, x, _mm(b, gram, gram, gram, alpha=c), x)
    if tall:
        x = x.mT
    x = x.reshape(*lead, *x.shape[-2:]) if lead else x
    return x.mT if fan_in_dim == -2 else x


def muon_update(p: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor, lr: torch.Tensor | float, decay: float,
                scale: float, cfg: Any, fan_in_dim: int) -> None:
    """One Muon step of matrix (or stack) `p` in place: torch.optim.Muon's arithmetic with the group's lr `lr`
    (a float, or a (K, 1, …) tensor: one per batched member), decay `decay` and lr factor `scale`."""
    buf.lerp_(grad, 1 - cfg.muon_momentum)
    update = grad.lerp(buf, cfg.muon_momentum) if cfg.muon_nesterov else buf
    ortho = orthogonalize(update, cfg.muon_ns_steps, fan_in_dim)
    if decay:
        p.mul_(1 - lr * decay)
    if isinstance(lr, torch.Tensor):
        p.sub_((lr * scale) * ortho)
    else:
        p.add_(ortho, alpha=-lr * scale)


def split_groups(model: LanguageModel, rules: Mapping[str, MatrixRule]) -> dict[str, list[tuple[str, bool]]]:
    """Each of `model.groups` as (parameter name, trained by Muon) pairs; the groups that hold Muon matrices."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {g: [(names[id(p)], names[id(p)] in rules) for p in ps] for g, ps in model.groups.items() if ps}


class MuonAdamW(torch.optim.AdamW):
    """Muon in the param groups marked "muon" (each with its parameters' "scales", "decays" and "fan_in_dims"),
    torch's AdamW in the others: one optimiser, one state dict. The step, zero_grad and state-dict methods lack
    the wrappers that import torch._dynamo, as `workers.train.EagerAdamW`'s."""

    add_param_group = torch.optim.Optimizer.add_param_group.__wrapped__  # type: ignore[attr-defined]
    zero_grad = torch.optim.Optimizer.zero_grad.__wrapped__  # type: ignore[attr-defined]
    state_dict = torch.optim.Optimizer.state_dict.__wrapped__  # type: ignore[attr-defined]
    load_state_dict = torch.optim.Optimizer.load_state_dict.__wrapped__  # type: ignore[attr-defined]

    def __init__(self, groups: list[dict[str, Any]], cfg: Any, eps: float) -> None:
        super().__init__(groups, lr=cfg.lr, betas=cfg.betas, eps=eps)
        self.cfg = cfg

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Adam's own (its per-parameter "step"), for the AdamW groups only; Muon's keep their momentum."""
        groups = state.get("param_groups", [])
        super().__setstate__({**state, "param_groups": [g for g in groups if not g.get("muon")]})  # type: ignore[no-untyped-call]
        self.param_groups = groups

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        everything = self.param_groups
        for group in everything:
            if not group.get("muon"):
                continue
            for p, scale, decay, dim in zip(group["params"], group["scales"], group["decays"], group["fan_in_dims"],
                                            strict=True):
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                muon_update(p, p.grad, state["momentum_buffer"], group["lr"], group["weight_decay"] * decay,
                            scale, self.cfg, dim)
        self.param_groups = [g for g in everything if not g.get("muon")]
        try:
            return torch.optim.AdamW.step.__wrapped__(self, closure)  # type: ignore[attr-defined,no-any-return]
        finally:
            self.param_groups = everything
