"""K trials of one shape as one batched model: `Stacked`, the engine `workers.train.train` uses for K > 1.

Members share everything but their family's batchable hparams (`Family.batchable`, `studies.members.member_key`).
Each is built exactly as a solo trial builds it; the K models are stacked (`torch.func.stack_module_state`) and
one `vmap(functional_call)` runs the K forward and backward passes, so a step's Python and dispatch cost is paid
once. Every value that differs between members (parameters, buffers, numeric module attributes, a config's
fields) is stacked and reaches that member's own forward; a difference that cannot be is a `BatchingError`,
never a member trained with another's value. `_AdamW` steps the stacked tensors with a (K,) lr per group and a
per-member gradient clip (under `train.optimizer: muon`, Muon on the family's matrices: each member's orthogonalised
on its own, `workers.muon`). At dropout 0 a member equals its solo trial (`tests/workers/test_batched.py`). The K
models stay: their parameters are views into the stacked tensors, so the family's hooks run on each member's own
module. The contract: docs/studies.md ("Batched trials"), docs/plugins.md §4.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from studies.family import get_family
from studies.members import member_key
from studies.spec import TrialConfig
from workers.batches import Batch
from workers.models import build_model
from workers.models.contract import LanguageModel, adam_eps, adam_settings
from workers.muon import matrix_rules, muon_update, split_groups

MODULE_FIELDS = frozenset(vars(nn.Module()))  # nn.Module's own bookkeeping, not the model's state
Swap = tuple[str, str, str | None]  # (module path, attribute, a config's field or None): one stacked value


class BatchingError(ValueError):
    """These trials cannot train as one batched model (the message names why and the fix)."""


class _Loss(nn.Module):
    """`model.loss(batch)`'s first term (or the eval loss) as a forward, for `functional_call`."""

    def __init__(self, model: LanguageModel, eval_only: bool = False) -> None:
        super().__init__()
        self.model, self.eval_only = model, eval_only

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.model.token_loss(batch) if self.eval_only else self.model.loss(batch)[0]


class Stacked:
    """The stacked models of one batch: parameters (K, ...) as leaves, the members' own modules as views."""

    def __init__(self, configs: Sequence[TrialConfig], vocab_size: int, device: torch.device) -> None:
        check_members(configs)
        self.cfgs, self.device, self.models = list(configs), device, []
        for cfg in configs:  # each built exactly as a solo trial builds it (same seed → same init)
            torch.manual_seed(cfg.seed)
            self.models.append(build_model(cfg.model, vocab_size=vocab_size, **cfg.model_hp).to(device))
        first = configs[0]
        if self.models[0].make_optimizer(first.lr, first.weight_decay, first.betas) is not None:
            raise BatchingError(f"family {first.model!r}'s model brings its own optimiser, which a batch cannot "
                                "stack: declare no batchable hparams (Family.batchable=None) to train it alone")
        self.swaps, self.hp = differing_state(self.models, device)
        params, buffers = stack_module_state(self.models)
        self.params: dict[str, torch.Tensor] = params
        self.buffers: dict[str, torch.Tensor] = buffers
        if not self.swaps and any(c.model_hp != first.model_hp for c in configs) and not any(
                not torch.equal(t[0], t[i]) for t in (*params.values(), *buffers.values()) for i in range(len(t))):
            raise BatchingError(f"the members of a batch of family {first.model!r} differ in their hparams but their "
                                "built models hold the same values: the hparams reach the model some way a batch "
                                "cannot stack. Store them on the model (an attribute, buffer or `cfg` field) or "
                                "declare no batchable hparams (Family.batchable=None)")
        base = self.models[0]
        group_of = {id(p): g for g, ps in base.groups.items() for p in ps}
        self.group = self.family_group = {name: group_of[id(p)] for name, p in base.named_parameters()}
        self.mults = self.mults_adam = base.lr_multipliers()
        self.rules = matrix_rules(base, first) if first.optimizer == "muon" else {}
        if self.rules:  # Muon's matrices in a group of their own at the base lr, as `workers.train._muon` groups them
            split = split_groups(base, self.rules)
            muon = {g for g, members in split.items() if any(on for _, on in members)}
            self.mults = {**{f"{g}_adamw": self.mults[g] for g in muon}, **self.mults, **dict.fromkeys(muon, 1.0)}
            self.group = {n: g if on or g not in muon else f"{g}_adamw" for g, members in split.items()
                          for n, on in members}
        self.groups = list(dict.fromkeys(self.group.values()))  # the groups that hold parameters, in order
        self._point_models_at_stack()
        self.train_loss = self._member(_Loss(base))
        self.eval_loss = self._member(_Loss(base, eval_only=True))
        dtype = next(iter(params.values())).dtype
        self.opt = _AdamW(self, first)
        self.lrs: dict[str, torch.Tensor] = {}
        self.dtype, self.loss = dtype, torch.zeros(0)
        self.n_params = sum(p.numel() for p in base.parameters())

    def _member(self, module: nn.Module) -> Callable[..., torch.Tensor]:
        """`module`'s loss for one member: its parameters, buffers and differing values (vmapped over all three)."""
        owners = {swap: module.get_submodule(f"model.{swap[0]}".rstrip(".")) for swap in self.swaps}

        def loss(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], hp: dict[Swap, torch.Tensor],
                 batch: Batch) -> torch.Tensor:
            saved = {(path, attr): getattr(owners[(path, attr, f)], attr) for path, attr, f in self.swaps}
            copies: dict[int, Any] = {}
            for (path, attr, name), value in hp.items():
                owner = owners[(path, attr, name)]
                if name is None:
                    setattr(owner, attr, value)
                    continue
                cfg = saved[(path, attr)]  # a config: one copy per config object, with every differing field
                if id(cfg) not in copies:
                    copies[id(cfg)] = cfg.model_copy()
                object.__setattr__(copies[id(cfg)], name, value)
                setattr(owner, attr, copies[id(cfg)])
            try:
                prefixed = {f"model.{k}": v for k, v in {**params, **buffers}.items()}
                out: torch.Tensor = functional_call(module, prefixed, (batch,))
                return out
            finally:
                for swap in self.swaps:
                    setattr(owners[swap], swap[1], saved[(swap[0], swap[1])])

        return vmap(loss, in_dims=(0, 0, 0, None), randomness="different")

    def _point_models_at_stack(self) -> None:
        """Each member's module reads (and its hooks write) its slice of the stacked tensors."""
        for i, model in enumerate(self.models):
            for name, p in model.named_parameters():
                p.data = self.params[name].detach()[i]
            for name, _ in list(model.named_buffers()):
                owner, _, attr = name.rpartition(".")
                module = model.get_submodule(owner) if owner else model
                module._buffers[attr] = self.buffers[name][i]

    def info(self, i: int) -> tuple[int, dict[str, float], dict[str, str]]:
        return self.n_params, {g: self.mults[g] for g in self.groups}, self.models[i].run_params()

    def set_lrs(self, factors: list[float]) -> list[dict[str, float]]:
        rows = [{g: c.lr * self.mults[g] * f for g in self.groups} for c, f in zip(self.cfgs, factors, strict=True)]
        self.lrs = {g: torch.tensor([r[g] for r in rows], device=self.device, dtype=self.dtype) for g in self.groups}
        return rows

    def losses(self, batch: Batch, train: bool = True) -> list[float]:
        """Every member's loss on `batch` (train mode: the training loss with aux terms, its graph kept)."""
        for model in self.models:
            model.train(train)
        self.loss = (self.train_loss if train else self.eval_loss)(self.params, self.buffers, self.hp,
                                                                  batch.to(self.device))
        values: list[float] = self.loss.detach().tolist()
        return values

    def update(self, live: list[bool]) -> None:
        keep = torch.tensor(live, device=self.device)
        torch.autograd.backward(torch.where(keep, self.loss, 0.0).sum())
        if self.cfgs[0].grad_clip > 0:
            self.opt.clip(self.cfgs[0].grad_clip, keep)
        self.opt.step(self.lrs, keep)

    @torch.no_grad()
    def eval_losses(self, batches: list[Batch]) -> list[float]:
        totals, count = [0.0] * len(self.models), 0
        for each in batches:
            values = self.losses(each, train=False)
            totals = [t + v * each.n_masked for t, v in zip(totals, values, strict=True)]
            count += each.n_masked
        return [t / max(count, 1) for t in totals]

    @torch.no_grad()
    def retire(self, i: int) -> None:
        """Member i diverged: its slice is zeroed (it trains no further; finite zeros keep the batched arithmetic
        of the others as fast as before, where inf and NaN operands would slow every kernel)."""
        for t in self.params.values():
            t[i] = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"params": self.params, "buffers": self.buffers, "optimizer": self.opt.state_dict()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("params", "buffers"):
            for name, t in state[key].items():
                getattr(self, key)[name].copy_(t)
        self.opt.load_state_dict(state["optimizer"])


def check_members(configs: Sequence[TrialConfig]) -> None:
    """The configs may share a batch: their family declares batchable hparams and they differ in no other field."""
    family = get_family(configs[0].model)
    if family.batchable is None:
        raise BatchingError(f"family {family.name!r} declares no batchable hparams (Family.batchable): its trials "
                            "train one at a time; set resources.batch_members: 1 or declare the hparams")
    keys = {member_key(c.model_dump()) for c in configs}
    if len(keys) > 1:
        raise BatchingError(f"the members of a batch of family {family.name!r} differ in more than its batchable "
                            f"hparams {list(family.batchable)}: batch only trials that differ in those")


def differing_state(models: Sequence[nn.Module], device: torch.device) -> tuple[list[Swap], dict[Swap, torch.Tensor]]:
    """The attributes of the members' modules whose values differ, each stacked as (K, ...) (module docstring);
    a `BatchingError` naming the first that cannot be."""
    swaps: list[Swap] = []
    stacks: dict[Swap, torch.Tensor] = {}
    refs = [{id(t) for t in (*m.parameters(), *m.buffers())} for m in models]
    for path, module in models[0].named_modules():
        others = [m.get_submodule(path) for m in models]
        for attr in sorted(set(vars(module)) - MODULE_FIELDS):
            values = [vars(o).get(attr) for o in others]
            if all(_same(values[0], v, refs[0], r) for v, r in zip(values, refs, strict=True)):
                continue
            where = f"{type(models[0]).__name__}.{path + '.' if path else ''}{attr}"
            if all(isinstance(v, BaseModel) for v in values):
                dumps = [v.model_dump() for v in values]  # type: ignore[union-attr]
                for name in sorted(dumps[0]):
                    column = [d[name] for d in dumps]
                    if all(c == column[0] for c in column):
                        continue
                    stacks[(path, attr, name)] = _stack(column, f"{where}.{name}", device)
                    swaps.append((path, attr, name))
                continue
            stacks[(path, attr, None)] = _stack(values, where, device)
            swaps.append((path, attr, None))
    return swaps, stacks


def _stack(values: list[Any], where: str, device: torch.device) -> torch.Tensor:
    """The members' values of one attribute as one (K, ...) tensor: floats as float64 (as a solo trial's Python
    floats: a product rounds once, to the model's dtype), tensors as they are."""
    if all(isinstance(v, float) for v in values):
        return torch.tensor(values, device=device, dtype=torch.float64)
    if all(isinstance(v, torch.Tensor) and v.shape == values[0].shape for v in values):
        return torch.stack([v.to(device) for v in values])
    kinds = sorted({type(v).__name__ for v in values})
    raise BatchingError(f"the batch's members differ in {where} ({', '.join(kinds)}), which cannot be stacked (only "
                        "floats and tensors of one shape can): read it from a float, or declare the hparam behind it "
                        "unbatchable (leave it out of Family.batchable)")


def _same(a: Any, b: Any, refs_a: set[int], refs_b: set[int]) -> bool:
    """Whether two members' values of an attribute are the same (a parameter or buffer is stacked anyway)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if id(a) in refs_a and id(b) in refs_b:
            return True
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))
    if type(a) is not type(b):
        return False
    if isinstance(a, BaseModel):
        return bool(a.model_dump() == b.model_dump())
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y, refs_a, refs_b) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], refs_a, refs_b) for k in a)
    if isinstance(a, nn.Module | int | float | str | bytes | bool | type(None)) or callable(a):
        return a is b or bool(a == b)
    if hasattr(a, "__dict__"):
        return _same(vars(a), vars(b), refs_a, refs_b)
    return bool(a == b)


class _AdamW:
    """torch.optim.AdamW's single-tensor arithmetic over stacked (K, ...) parameters, with a (K,) lr per group and
    a per-member gradient-norm clip; members not `live` keep their parameters and moments. Under
    `train.optimizer: muon` the Muon matrices (`Stacked.rules`) take `workers.muon.muon_update` instead, with their
    momentum."""

    def __init__(self, members: Stacked, cfg: TrialConfig) -> None:
        self.m, self.betas = members, cfg.betas
        base = members.models[0]  # every member shares the train spec: the same ε and decay per group as solo's
        settings = adam_settings(base, cfg.model, *adam_eps(base, cfg), cfg.weight_decay, cfg.weight_decay_groups,
                                 cfg.weight_decay_form)
        group = members.family_group
        self.decay = {name: settings[g][1] for name, g in group.items()}
        self.eps = {name: settings[g][0] for name, g in group.items()}
        self.cfg, self.rules = cfg, members.rules
        for name, rule in self.rules.items():  # Muon: the decay `workers.train._muon` gives the matrix
            g = group[name]
            independent = cfg.weight_decay_form == "independent"
            self.decay[name] = settings[g][1] * (members.mults_adam[g] if independent else 1.0) * rule.decay
        adam = [n for n in members.params if n not in self.rules]
        self.exp_avg = {n: torch.zeros_like(members.params[n]) for n in adam}
        self.exp_avg_sq = {n: torch.zeros_like(members.params[n]) for n in adam}
        self.momentum = {n: torch.zeros_like(members.params[n]) for n in self.rules}
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "momentum": self.momentum,
                "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("exp_avg", "exp_avg_sq", "momentum"):
            for name, t in state.get(key, {}).items():
                getattr(self, key)[name].copy_(t)
        self.steps = state["steps"]

    @torch.no_grad()
    def clip(self, max_norm: float, live: torch.Tensor) -> None:
        """torch.nn.utils.clip_grad_norm_ per member: each member's grads scaled by its own total norm."""
        grads = [p.grad for p in self.m.params.values() if p.grad is not None]
        k = live.numel()
        norms = torch.stack([torch.linalg.vector_norm(g.reshape(k, -1), 2.0, dim=1) for g in grads])  # (P, K)
        total = torch.linalg.vector_norm(norms, 2.0, dim=0)  # (K,)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))

    @torch.no_grad()
    def step(self, lrs: dict[str, torch.Tensor], live: torch.Tensor) -> None:
        """One AdamW step in place; `lrs[group]` is the (K,) learning rate of each member's group. The members not
        `live` get their parameters and moments back afterwards (few: only diverged ones)."""
        beta1, beta2 = self.betas
        self.steps += 1
        bias1, bias2_sqrt = 1 - beta1 ** self.steps, (1 - beta2 ** self.steps) ** 0.5
        dead = (~live).nonzero().flatten()
        for name, p in self.m.params.items():
            if p.grad is None:
                continue
            shape = (-1, *([1] * (p.dim() - 1)))
            lr, grad = lrs[self.m.group[name]].view(shape), p.grad
            if name in self.rules:
                rule, buf = self.rules[name], self.momentum[name]
                kept = [t[dead].clone() for t in (p, buf)] if len(dead) else []
                muon_update(p, grad, buf, lr, self.decay[name], rule.scale, self.cfg, rule.fan_in_dim)
                for t, old in zip((p, buf), kept, strict=False):
                    t[dead] = old
                p.grad = None
                continue
            exp_avg, exp_avg_sq = self.exp_avg[name], self.exp_avg_sq[name]
            kept = [t[dead].clone() for t in (p, exp_avg, exp_avg_sq)] if len(dead) else []
            if self.decay[name]:
                p.mul_(1 - lr * self.decay[name])
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / bias2_sqrt).add_(self.eps[name])
            p.sub_((lr / bias1) * (exp_avg / denom))
            for t, old in zip((p, exp_avg, exp_avg_sq), kept, strict=False):  # nothing kept: all live
                t[dead] = old
            p.grad = None


