"""K trials of one shape trained as one batched model in one process: `train_batch(configs) -> [TrialResult]`.

Members share everything but their base `lr` and their family's hparams (`studies.members.member_key`): the
width, the steps, the seed (so the init draw and the data order) and the schedule. Each member is built alone,
exactly as `workers.train.train_trial` builds it, and the K models are stacked (`torch.func.stack_module_state`):
every parameter gets a leading member dimension, and one `vmap(functional_call)` runs the K forward and backward
passes as batched kernels (K small GEMMs become one batched GEMM; the Python and dispatch cost of a step is paid
once, not K times). A member's hparams that differ from the others' enter its model as per-member values: its
config is swapped, inside the vmapped call, for one whose differing fields are that member's slice of a (K,) tensor
(the models read every hparam from `cfg` at forward time). Its lr enters the optimiser: AdamW written over the
stacked tensors (`_adamw`, torch's single-tensor arithmetic), with a (K,) learning rate per parameter group and a
per-member gradient-norm clip.

Each member is still a trial: its own eval curve, divergence (a member whose loss goes non-finite or blows up is
recorded `diverged` with the reason and its slice stops updating; the others go on), plateau scale and result (its
wall time and tokens/s are its share of the batch's: the batch's time / K, so a phase's trial times add up to its
compute time as solo trials' do). At
dropout 0 a member's losses equal the same trial trained alone (tests/workers/test_batched.py: float64 ≤ 1e-8
after 20 steps). With dropout the members draw independent masks (vmap's randomness="different").

The K models stay: their parameters and buffers are views into the stacked tensors, so the family's hooks
(`before_step`: TauGPT's τ calibration; `eval_metrics`) run on each member's own module as in a solo trial.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.func import functional_call, stack_module_state, vmap

from analysis.constants import TrialStatus
from studies.spec import TrialConfig
from workers.models import build_model
from workers.models.contract import ADAM_EPS, UNDECAYED, LanguageModel
from workers.train import (
    TrainState,
    TrialResult,
    blown_up,
    check_objective,
    load_data,
    lr_factor,
    resolve_device,
    system_usage,
    trial_result,
)

MemberProgress = Callable[[int, dict[str, Any]], None]  # (member index, row) at every logged step
BatchCheckpoint = Callable[[dict[int, dict[str, Any]], TrainState], None]  # (rows of the live members, state)


class _Loss(torch.nn.Module):
    """`model.loss(batch)`'s first term as a forward, for `functional_call`."""

    def __init__(self, model: LanguageModel, eval_only: bool = False) -> None:
        super().__init__()
        self.model, self.eval_only = model, eval_only

    def forward(self, batch):
        return self.model.token_loss(batch) if self.eval_only else self.model.loss(batch)[0]


class Members:
    """The stacked models of one batch: parameters (K, ...) as leaves, the members' own modules as views."""

    def __init__(self, configs: Sequence[TrialConfig], vocab_size: int, device: torch.device) -> None:
        self.models: list[LanguageModel] = []
        for cfg in configs:  # each built exactly as a solo trial builds it (same seed → same init)
            torch.manual_seed(cfg.seed)
            self.models.append(build_model(cfg.model, vocab_size=vocab_size, **cfg.model_hp).to(device))
        params, buffers = stack_module_state(self.models)
        self.params: dict[str, torch.Tensor] = params
        self.buffers: dict[str, torch.Tensor] = buffers
        base = self.models[0]
        group_of = {id(p): g for g, ps in base.groups.items() for p in ps}
        self.group = {name: group_of[id(p)] for name, p in base.named_parameters()}
        # float64, as the Python floats of a solo trial's config: a product of hparams rounds once, to the model's dtype
        self.hp = {k: torch.tensor([float(getattr(m.cfg, k)) for m in self.models], device=device,
                                   dtype=torch.float64) for k in _varying(self.models)}
        self.base_cfg = base.cfg
        self._point_models_at_stack()
        for model in self.models:
            model.before_trial(configs[0])
        self.train_loss = self._member(_Loss(base))
        self.eval_loss = self._member(_Loss(base, eval_only=True))

    def _member(self, module: torch.nn.Module) -> Callable[..., torch.Tensor]:
        """module's loss for one member: its parameters, buffers and hparam values (vmapped over all three)."""
        models = [m for m in module.modules() if getattr(m, "cfg", None) is self.base_cfg]

        def loss(params, buffers, hp, batch):
            cfg = self.base_cfg.model_copy(update=hp)
            for m in models:
                m.cfg = cfg
            try:
                prefixed = {f"model.{k}": v for k, v in {**params, **buffers}.items()}
                return functional_call(module, prefixed, (batch,))
            finally:
                for m in models:
                    m.cfg = self.base_cfg

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

    def losses(self, batch, train: bool = True) -> torch.Tensor:
        """(K,) losses of every member on `batch` (train mode: the training loss, with aux terms)."""
        for model in self.models:
            model.train(train)
        fn = self.train_loss if train else self.eval_loss
        return fn(self.params, self.buffers, self.hp, batch)

    @torch.no_grad()
    def retire(self, i: int) -> None:
        """Member i diverged: its slice is zeroed (it trains no further; finite zeros keep the batched arithmetic
        of the others as fast as before, where inf and NaN operands would slow every kernel)."""
        for t in self.params.values():
            t[i] = 0.0

    def load(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for name, t in state["params"].items():
                self.params[name].copy_(t)
            for name, t in state["buffers"].items():
                self.buffers[name].copy_(t)


def _varying(models: Sequence[LanguageModel]) -> list[str]:
    """The model config's fields whose values differ between members (each must be a number: a per-member tensor)."""
    dumps: list[dict[str, Any]] = [m.cfg.model_dump() for m in models]  # type: ignore[union-attr,operator]
    first, others = dumps[0], dumps[1:]
    keys = sorted(k for k in first if any(o[k] != first[k] for o in others))
    for k in keys:
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in (first[k], *(o[k] for o in others))):
            raise ValueError(f"batched members differ in model hparam {k!r}, which is not a number: only numeric "
                             "hparams may vary within a batch (studies.members.member_key groups the others apart)")
    return keys


class _AdamW:
    """torch.optim.AdamW's single-tensor arithmetic over stacked (K, ...) parameters, with a (K,) lr per group and
    a per-member gradient-norm clip; members not `live` keep their parameters and moments."""

    def __init__(self, members: Members, betas: tuple[float, float], weight_decay: float) -> None:
        self.m, self.betas = members, betas
        self.decay = {name: 0.0 if g in UNDECAYED else weight_decay for name, g in members.group.items()}
        eps = members.models[0].eps_multipliers()  # a depth parametrization's blocks (group left out: 1)
        self.eps = {name: ADAM_EPS * eps.get(g, 1.0) for name, g in members.group.items()}
        self.exp_avg = {n: torch.zeros_like(p) for n, p in members.params.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in members.params.items()}
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("exp_avg", "exp_avg_sq"):
            for name, t in state[key].items():
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


def train_batch(configs: Sequence[TrialConfig | dict[str, Any]], progress: MemberProgress | None = None,
                checkpoint: BatchCheckpoint | None = None, resume: TrainState | None = None) -> list[TrialResult]:
    """Train the members together; one `TrialResult` per member, in order (module docstring).

    `progress(i, row)` gets member i's row at every logged step; `checkpoint(rows, state)` the rows of the members
    still training and the whole batch's resumable state at every evaluation; `resume` continues from one."""
    cfgs = [c if isinstance(c, TrialConfig) else TrialConfig.model_validate(c) for c in configs]
    first = cfgs[0]
    check_objective(first)
    device = resolve_device(first.device)
    data = load_data(first.data)
    members = Members(cfgs, data.vocab_size, device)
    k = len(cfgs)
    mults = members.models[0].lr_multipliers()
    opt = _AdamW(members, first.betas, first.weight_decay)
    params = sum(p.numel() for p in members.models[0].parameters())
    groups = list(dict.fromkeys(members.group.values()))  # the groups that hold parameters, in the model's order
    infos = [(params, {g: c.lr * mults[g] / c.lr for g in groups}, members.models[i].run_params())
             for i, c in enumerate(cfgs)]
    batches = data.train_batches(first.batch_size, seed=first.seed)
    eval_batches = data.eval_batches(first.batch_size)[: first.eval_batches]
    probe = data.eval_batches(first.batch_size)[0]
    dtype = next(iter(members.params.values())).dtype

    loop: dict[str, Any] = {
        "history": [[] for _ in cfgs], "monitored": [[] for _ in cfgs], "best": [math.inf] * k,
        "eval_loss": [math.nan] * k, "train_loss": [math.nan] * k, "plateau_scale": [1.0] * k, "stale": [0] * k,
        "start_loss": [math.nan] * k, "ended": [None] * k, "tokens": 0, "wall_time_s": 0.0}
    first_step = 1
    if resume is not None:
        members.load(resume["members"])
        opt.load_state_dict(resume["optimizer"])
        first_step = resume["step"] + 1
        for _ in range(resume["step"]):  # the data position: the seeded stream replayed
            next(batches)
        batches.take_diverted()
        loop = {key: resume["loop"][key] for key in loop}
        torch.set_rng_state(resume["rng"])
    start = time.perf_counter() - loop["wall_time_s"]
    usage_start = (time.perf_counter(), time.process_time())
    results: list[TrialResult | None] = [_ended(e) for e in loop["ended"]]
    retiring: list[int] = []  # members that diverged this step: zeroed once its backward and update are done

    def end(i: int, status: str, step: int, message: str = "") -> None:
        share_start = time.perf_counter() - (time.perf_counter() - start) / k  # its share of the batch's time
        result = trial_result(status, loop["eval_loss"][i] if status == TrialStatus.COMPLETED else math.nan,
                         loop["best"][i], loop["train_loss"][i], step, loop["tokens"], share_start, infos[i],
                         loop["history"][i], message)
        results[i], loop["ended"][i] = result, dict(vars(result), status=str(result.status))  # checkpointable
        if status == TrialStatus.DIVERGED:
            retiring.append(i)

    for step in range(first_step, first.steps + 1):
        live = [r is None for r in results]
        if not any(live):
            break
        scale = list(loop["plateau_scale"])
        diverted: list = []
        lr_rows = [{g: c.lr * mults[g] * (lr_factor(step - 1, c) * s) for g in groups}  # as a solo trial's groups
                   for c, s in zip(cfgs, scale, strict=True)]
        lrs = {g: torch.tensor([r[g] for r in lr_rows], device=device, dtype=dtype) for g in groups}
        batch = next(batches)
        for i, model in enumerate(members.models):
            if live[i]:
                model.before_step(batch, step - 1)
        losses = members.losses(batch.to(device))
        values = losses.detach().tolist()
        loop["tokens"] += int(batch.attention_mask.sum())
        for i, value in enumerate(values):
            if not live[i]:
                continue
            loop["train_loss"][i] = value
            if step == 1:
                loop["start_loss"][i] = value
            if not math.isfinite(value) or value > cfgs[i].max_loss:
                end(i, TrialStatus.DIVERGED, step, f"loss became {value} at step {step}")
                live[i] = False
        keep = torch.tensor(live, device=device)
        torch.where(keep, losses, 0.0).sum().backward()
        if first.grad_clip > 0:
            opt.clip(first.grad_clip, keep)
        opt.step(lrs, keep)
        while retiring:
            members.retire(retiring.pop())

        evaluated = step % first.eval_every == 0 or step == first.steps
        if evaluated:
            totals, count = [0.0] * k, 0
            with torch.no_grad():
                for each in eval_batches:
                    member_losses = members.losses(each.to(device), train=False).tolist()
                    totals = [t + v * each.n_masked for t, v in zip(totals, member_losses, strict=True)]
                    count += each.n_masked
            for i in range(k):
                if not live[i]:
                    continue
                eval_loss = totals[i] / max(count, 1)
                loop["eval_loss"][i] = eval_loss
                if not math.isfinite(eval_loss) or eval_loss > cfgs[i].max_loss:
                    end(i, TrialStatus.DIVERGED, step, f"eval loss became {eval_loss} at step {step}")
                    live[i] = False
                    continue
                blown = blown_up(eval_loss, data.vocab_size, loop["start_loss"][i], cfgs[i].uniform_margin)
                if blown:
                    end(i, TrialStatus.DIVERGED, step, f"eval loss {eval_loss:.4g} at step {step} is {blown}")
                    live[i] = False
                    continue
                loop["stale"][i] = 0 if eval_loss < loop["best"][i] else loop["stale"][i] + 1
                loop["best"][i] = min(loop["best"][i], eval_loss)
                if cfgs[i].plateau_patience and loop["stale"][i] >= cfgs[i].plateau_patience:
                    loop["plateau_scale"][i] *= cfgs[i].plateau_factor
                    loop["stale"][i] = 0
            diverted = batches.take_diverted()
            while retiring:
                members.retire(retiring.pop())
        if evaluated or step % first.log_every == 0:
            elapsed = time.perf_counter() - start
            system = system_usage(*usage_start)
            rows: dict[int, dict[str, Any]] = {}
            stream = _stream_losses(members, diverted, device) if evaluated and diverted else None
            for i in range(k):
                if not live[i]:
                    continue
                row: dict[str, Any] = {"step": step, "train_loss": loop["train_loss"][i], "tokens": loop["tokens"],
                                       "tokens_per_s": k * loop["tokens"] / elapsed}
                row.update({f"lr_{g}": lr for g, lr in lr_rows[i].items()})
                row.update(system)
                if cfgs[i].plateau_patience:
                    row["lr_scale"] = scale[i]
                if evaluated:
                    row["eval_loss"] = loop["eval_loss"][i]
                    if stream is not None:
                        row["stream_val_loss"] = stream[i]
                    extra = members.models[i].eval_metrics(probe, step, loop["monitored"][i])
                    if extra:
                        loop["monitored"][i].append({"step": step, **extra})
                        row.update(extra)
                loop["history"][i].append(row)
                rows[i] = row
                if progress is not None:
                    progress(i, row)
            if evaluated and checkpoint is not None and step < first.steps:
                loop["wall_time_s"] = time.perf_counter() - start
                checkpoint(rows, {"step": step, "members": {"params": members.params, "buffers": members.buffers},
                                  "optimizer": opt.state_dict(), "loop": loop, "rng": torch.get_rng_state()})
    for i, r in enumerate(results):
        if r is None:
            end(i, TrialStatus.COMPLETED, first.steps)
    return [r for r in results if r is not None]


def _stream_losses(members: Members, diverted, device: torch.device) -> list[float]:
    """Each member's mean loss on the train batches the stream diverted since the last eval (`stream_val_loss`)."""
    totals, count = [0.0] * len(members.models), 0
    with torch.no_grad():
        for each in diverted:
            values = members.losses(each.to(device), train=False).tolist()
            totals = [t + v * each.n_masked for t, v in zip(totals, values, strict=True)]
            count += each.n_masked
    return [t / max(count, 1) for t in totals]


def _ended(saved: dict[str, Any] | None) -> TrialResult | None:
    return None if saved is None else TrialResult(**{**saved, "status": TrialStatus(saved["status"])})
