"""One trial: build a model, train it with μP-aware AdamW, evaluate on a fixed held-out set.

`train_trial(config) -> TrialResult` is pure torch (no Ray, no MLflow): the config is a `studies.spec.TrialConfig`
(or its dict); the Ray layer passes a `progress` callback that receives a metrics dict at every logged step.
A diverging run (NaN/inf loss) ends with status "diverged"; it never raises.

The family's objective ("mlm" or "clm") must match the data's. The model owns its loss (`model.loss(batch)`,
aux terms included) and is driven through the hooks of `workers.models.contract.LanguageModel`: `before_trial`
once, `before_step` before every step (TauGPT: τ calibration) and `eval_metrics` at every evaluation, on a
fixed held-out batch, whose metrics join the row (TauGPT: `tau.*` with collapse flags). Batches the data
stream diverts (`data.stream_val_every`) give `stream_val_loss`.

At every evaluation an optional `checkpoint(row, state)` hook receives the trial's whole resumable state
(model, optimiser, step, RNG, plateau and history; the data position is the step: the seeded stream is
replayed); `train_trial(..., resume=state)` continues from it and ends where an undisturbed run ends.
"""

from __future__ import annotations

import functools
import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from analysis.constants import TrialStatus
from studies.spec import DataSpec, TrialConfig
from workers.data import Batch, MemoryData, PackedData, StreamData, prepare
from workers.models import build_model, objective_of
from workers.models.contract import ADAM_EPS, UNDECAYED, LanguageModel

Progress = Callable[[dict[str, Any]], None]
TrainState = dict[str, Any]  # what `checkpoint` receives and `resume` takes; torch.save-able with weights_only
Checkpoint = Callable[[dict[str, Any], TrainState], None]


@dataclass
class TrialResult:
    status: TrialStatus  # completed | diverged
    eval_loss: float  # last evaluation (NaN when diverged)
    best_eval_loss: float
    train_loss: float
    steps: int
    tokens: int
    wall_time_s: float
    tokens_per_s: float
    params: int
    history: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    lr_multipliers: dict[str, float] = field(default_factory=dict)  # per parameter group: its lr / the base lr
    run_params: dict[str, str] = field(default_factory=dict)  # the model's `run_params()` (a mup family's infshapes)


@functools.lru_cache(maxsize=4)
def load_data(cfg: DataSpec) -> MemoryData | StreamData:
    """`prepare` once per process per data config (trials of a study share it)."""
    return prepare(cfg)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class EagerAdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` less the wrappers that import `torch._dynamo` on their first call (0.9 s of a fresh trial
    process: each phase's trial actors, `ptctl train`) only to keep these methods out of a compiled graph; ptctl
    never compiles its optimiser. The same arithmetic, state and state dict as AdamW's (tests/workers/test_train.py)."""

    add_param_group = torch.optim.Optimizer.add_param_group.__wrapped__  # type: ignore[attr-defined]
    zero_grad = torch.optim.Optimizer.zero_grad.__wrapped__  # type: ignore[attr-defined]
    state_dict = torch.optim.Optimizer.state_dict.__wrapped__  # type: ignore[attr-defined]
    load_state_dict = torch.optim.Optimizer.load_state_dict.__wrapped__  # type: ignore[attr-defined]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        return torch.optim.AdamW.step.__wrapped__(self, closure)  # type: ignore[attr-defined,no-any-return]


def make_optimizer(model: LanguageModel, cfg: TrialConfig) -> torch.optim.Optimizer:
    """The model's own optimiser when it has one (a mup family's MuAdamW), else AdamW with one group per parameter
    group; μP enters through `model.lr_multipliers()`, a depth parametrization's ε through `model.eps_multipliers()`."""
    own = model.make_optimizer(cfg.lr, cfg.weight_decay, cfg.betas)
    if own is not None:
        return own
    mult, eps = model.lr_multipliers(), model.eps_multipliers()
    groups = [
        {
            "params": params,
            "lr": cfg.lr * mult[name],
            "weight_decay": 0.0 if name in UNDECAYED else cfg.weight_decay,
            "eps": ADAM_EPS * eps.get(name, 1.0),
            "name": name,
        }
        for name, params in model.groups.items()
        if params
    ]
    return EagerAdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=ADAM_EPS)


def lr_factor(step: int, cfg: TrialConfig) -> float:
    """Warmup, then the schedule, as a factor on each group's base learning rate."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape


def evaluate(model: LanguageModel, data: PackedData, cfg: TrialConfig, device: torch.device) -> float:
    """Mean loss per scored token over the fixed held-out batches."""
    return mean_loss(model, data.eval_batches(cfg.batch_size)[: cfg.eval_batches], device)


@torch.no_grad()
def mean_loss(model: LanguageModel, batches: list[Batch], device: torch.device) -> float:
    """Mean token loss per scored token over `batches`, in eval mode (on the model's device)."""
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        total += float(model.token_loss(batch)) * batch.n_masked
        count += batch.n_masked
    model.train()
    return total / max(count, 1)


def check_objective(cfg: TrialConfig) -> None:
    """The family's objective ("mlm" or "clm") must be the data's: a ValueError naming the fix otherwise."""
    objective = objective_of(cfg.model)
    if objective != cfg.data.objective:
        raise ValueError(f"model {cfg.model!r} trains with objective {objective!r} but data.objective is "
                         f"{cfg.data.objective!r}: set data.objective to {objective!r}")


def train_trial(config: TrialConfig | dict[str, Any], progress: Progress | None = None,
                checkpoint: Checkpoint | None = None, resume: TrainState | None = None) -> TrialResult:
    """Train one trial; `checkpoint` gets (row, state) at every evaluation, `resume` continues from a state."""
    cfg = config if isinstance(config, TrialConfig) else TrialConfig.model_validate(config)
    check_objective(cfg)
    device = resolve_device(cfg.device)
    data = load_data(cfg.data)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, vocab_size=data.vocab_size, **cfg.model_hp).to(device)
    params = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(model, cfg)
    base_lrs = [g["lr"] for g in opt.param_groups]
    info = (params, {g["name"]: g["lr"] / cfg.lr for g in opt.param_groups}, model.run_params())  # model facts
    batches = data.train_batches(cfg.batch_size, seed=cfg.seed)
    probe = data.eval_batches(cfg.batch_size)[0]  # `eval_metrics`' batch: fixed, so comparable over steps
    monitored: list[dict[str, float]] = []  # what `eval_metrics` returned so far, with the step
    model.before_trial(cfg)

    history: list[dict[str, Any]] = []
    best = math.inf
    eval_loss = math.nan
    loss_value = math.nan
    tokens = 0
    plateau_scale, stale = 1.0, 0
    start_loss = math.nan  # the untrained model's loss (the first batch's, before any update)
    start = time.perf_counter()
    usage_start = (time.perf_counter(), time.process_time())  # this run's own clock, unlike `start` on resume
    first = 1
    if resume is not None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        first = resume["step"] + 1
        for _ in range(resume["step"]):  # the data position: the seeded stream replayed, diverted batches dropped
            next(batches)
        batches.take_diverted()
        history, monitored = list(resume["history"]), list(resume["monitored"])
        best, eval_loss, loss_value = resume["best"], resume["eval_loss"], resume["train_loss"]
        tokens = resume["tokens"]
        plateau_scale, stale = resume["plateau_scale"], resume["stale"]
        start_loss = resume.get("start_loss", math.nan)
        start -= resume["wall_time_s"]
        torch.set_rng_state(resume["rng"])
        if resume.get("cuda_rng") is not None and device.type == "cuda":
            torch.cuda.set_rng_state(resume["cuda_rng"], device)
    for step in range(first, cfg.steps + 1):
        step_scale = plateau_scale  # the plateau's scale on this step's lr (an eval below may lower the next)
        factor = lr_factor(step - 1, cfg) * step_scale
        for group, base in zip(opt.param_groups, base_lrs, strict=True):
            group["lr"] = base * factor
        batch = next(batches)
        model.before_step(batch, step - 1)
        loss, _ = model.loss(batch)
        loss_value = float(loss.detach())
        if step == 1:
            start_loss = loss_value
        tokens += int(batch.attention_mask.sum())
        if not math.isfinite(loss_value) or loss_value > cfg.max_loss:
            return trial_result(TrialStatus.DIVERGED, math.nan, best, loss_value, step, tokens, start, info, history,
                                f"loss became {loss_value} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()

        evaluated = step % cfg.eval_every == 0 or step == cfg.steps
        if evaluated:
            eval_loss = evaluate(model, data, cfg, device)
            if not math.isfinite(eval_loss) or eval_loss > cfg.max_loss:
                return trial_result(TrialStatus.DIVERGED, math.nan, best, loss_value, step, tokens, start, info,
                                    history, f"eval loss became {eval_loss} at step {step}")
            blown = blown_up(eval_loss, data.vocab_size, start_loss, cfg.uniform_margin)
            if blown:
                return trial_result(TrialStatus.DIVERGED, math.nan, best, loss_value, step, tokens, start, info,
                                    history, f"eval loss {eval_loss:.4g} at step {step} is {blown}")
            stale = 0 if eval_loss < best else stale + 1
            best = min(best, eval_loss)
            if cfg.plateau_patience and stale >= cfg.plateau_patience:
                plateau_scale, stale = plateau_scale * cfg.plateau_factor, 0
        if evaluated or step % cfg.log_every == 0:
            elapsed = time.perf_counter() - start
            row: dict[str, Any] = {"step": step, "train_loss": loss_value, "tokens": tokens,
                                   "tokens_per_s": tokens / elapsed}
            row.update({f"lr_{g['name']}": g["lr"] for g in opt.param_groups})
            row.update(system_usage(*usage_start))
            if cfg.plateau_patience:
                row["lr_scale"] = step_scale
            if evaluated:
                row["eval_loss"] = eval_loss
                row.update(_stream_val(model, batches, device))
                extra = model.eval_metrics(probe, step, monitored)
                if extra:
                    monitored.append({"step": step, **extra})
                    row.update(extra)
            history.append(row)
            if progress is not None:
                progress(row)
            if evaluated and checkpoint is not None:
                checkpoint(row, _state(step, model, opt, device, history=list(history), monitored=list(monitored),
                                       best=best, eval_loss=eval_loss, train_loss=loss_value, tokens=tokens,
                                       stale=stale, plateau_scale=plateau_scale, start_loss=start_loss,
                                       wall_time_s=time.perf_counter() - start))
    return trial_result(TrialStatus.COMPLETED, eval_loss, best, loss_value, cfg.steps, tokens, start, info, history)


def blown_up(eval_loss: float, vocab_size: int, start_loss: float, margin: float | None) -> str:
    """Why `eval_loss` counts as diverged although finite ('' if it does not): worse than predicting every token
    uniformly (ln|V|), or than the untrained model when that started higher, by more than `margin` nats."""
    if margin is None:
        return ""
    uniform = math.log(vocab_size)
    reference = max(uniform, start_loss) if math.isfinite(start_loss) else uniform
    if eval_loss <= reference + margin:
        return ""
    return (f"worse than uniform prediction (ln|V| = {uniform:.4g}; untrained {start_loss:.4g}) by more than "
            f"train.uniform_margin = {margin:g}")


def _state(step: int, model: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device,
           **loop: Any) -> TrainState:
    """Everything `train_trial(resume=...)` needs to continue after `step` (tensors, numbers, lists, dicts).
    The tensors are the live ones: a `checkpoint` hook serialises the state before it returns."""
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "rng": torch.get_rng_state(), "cuda_rng": cuda_rng, **loop}


def _stream_val(model: LanguageModel, batches, device: torch.device) -> dict[str, float]:
    """`stream_val_loss`: the loss on the train batches the stream diverted since the last eval (data's
    `stream_val_every`, the TauGPT post's validation), beside the fixed held-out set's `eval_loss`."""
    diverted = batches.take_diverted()
    return {"stream_val_loss": mean_loss(model, diverted, device)} if diverted else {}


def system_usage(wall_start: float, cpu_start: float) -> dict[str, float]:
    """The trial process's own use since the run began, without psutil: CPU utilisation (100 = one core busy,
    every torch thread counted) and the process's peak resident memory (a reused Ray actor's peak so far)."""
    wall = max(time.perf_counter() - wall_start, 1e-9)
    return {"system/cpu_utilization_percentage": 100 * (time.process_time() - cpu_start) / wall,
            "system/peak_rss_megabytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def trial_result(status, eval_loss, best, train_loss, steps, tokens, start, model_info, history, message=""):
    wall = time.perf_counter() - start
    params, multipliers, run_params = model_info
    return TrialResult(status=status, eval_loss=eval_loss, best_eval_loss=best, train_loss=train_loss,
                       steps=steps, tokens=tokens, wall_time_s=wall, tokens_per_s=tokens / max(wall, 1e-9),
                       params=params, history=history, message=message, lr_multipliers=multipliers,
                       run_params=run_params)
