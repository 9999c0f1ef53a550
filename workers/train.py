"""The trial loop: `train(configs) -> [TrialReport]` trains K ≥ 1 trials of one shape, `train_trial(config)` one.

A config is a `studies.spec.TrialConfig` (or its dict). One trial trains alone (`Solo`); K > 1 trials that differ
only in their family's batchable hparams train as one batched model (`workers.batched.Stacked`). Both run this
loop: each trial is a `Member` (its schedule, divergence, plateau, rows and report), and the engine only computes
the K losses and updates the K models. A diverging trial ends "diverged" while the others go on; the loop never
raises for it. The model owns its loss and is driven through `LanguageModel`'s hooks.

`progress(i, row)` gets member i's row at every logged step; `checkpoint(rows, state)` the resumable state at
every evaluation but the last (the data position is the step: the seeded stream is replayed), which
`train(..., resume=state)` continues to where an undisturbed run ends. `log=path` sends the model's own output
to the trial's log file (`workers.quiet`).
"""

from __future__ import annotations

import functools
import math
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from analysis.constants import TrialStatus
from studies.spec import DataSpec, TrialConfig
from workers.batches import Batch, MemoryData, StreamData
from workers.data import prepare
from workers.errors import ConfigError
from workers.model_check import plugin_errors
from workers.models import build_model, objective_of
from workers.models.contract import LanguageModel, adam_eps, adam_settings
from workers.quiet import quiet
from workers.report import Row, TrialReport

TrainState = dict[str, Any]  # what `checkpoint` receives and `resume` takes; torch.save-able with weights_only
Progress = Callable[[int, Row], None]  # (member index, row)
Checkpoint = Callable[[dict[int, Row], TrainState], None]  # (rows of the members still training, state)


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
    group; μP enters through `model.lr_multipliers()`, a depth parametrization's ε through `model.eps_multipliers()`,
    the train spec's ε and per-group decay (`train.weight_decay_form` included) through `adam_eps` and
    `contract.adam_settings`."""
    eps, width_eps = adam_eps(model, cfg)
    own = model.make_optimizer(cfg.lr, cfg.weight_decay, cfg.betas, eps=eps, width_eps=width_eps,
                               weight_decay_groups=cfg.weight_decay_groups)
    if own is not None:
        if cfg.optimizer != "adamw":
            raise ConfigError(f"model family {cfg.model!r} brings its own optimiser ({type(own).__name__}), which "
                              f"train.optimizer: {cfg.optimizer} cannot replace: leave train.optimizer at adamw")
        if cfg.weight_decay_form != "coupled":
            raise ConfigError(f"model family {cfg.model!r} brings its own optimiser ({type(own).__name__}), which "
                              "sets each group's decay itself (mup's MuAdamW multiplies a matrix group's decay by "
                              "the width_mult it divides its lr by: lr × λ per step in every group, the independent "
                              "form already): leave train.weight_decay_form at coupled for it")
        return own
    mult = model.lr_multipliers()
    settings = adam_settings(model, cfg.model, eps, width_eps, cfg.weight_decay, cfg.weight_decay_groups,
                             cfg.weight_decay_form)
    if cfg.optimizer == "muon":
        return _muon(model, cfg, eps, mult, settings)
    groups = [
        {
            "params": params,
            "lr": cfg.lr * mult[name],
            "weight_decay": settings[name][1],
            "eps": settings[name][0],
            "name": name,
        }
        for name, params in model.groups.items()
        if params
    ]
    return EagerAdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=eps)


def _muon(model: LanguageModel, cfg: TrialConfig, eps: float, mult: dict[str, float],
          settings: dict[str, tuple[float, float]]) -> torch.optim.Optimizer:
    """`train.optimizer: muon` (`workers.muon`): each group's Muon matrices in a Muon group of its name at the base
    lr (μP lives in each matrix's scale), its other parameters in an AdamW group as `make_optimizer` builds it,
    named `<group>_adamw` beside a Muon group."""
    from workers.muon import MuonAdamW, matrix_rules, split_groups

    rules = matrix_rules(model, cfg)
    params = dict(model.named_parameters())
    groups: list[dict[str, Any]] = []
    for name, members in split_groups(model, rules).items():
        muon = [n for n, on in members if on]
        rest = [params[n] for n, on in members if not on]
        _, decay = settings[name]
        if muon:
            groups.append({"params": [params[n] for n in muon], "lr": cfg.lr, "name": name, "muon": True,
                           "weight_decay": decay * mult[name] if cfg.weight_decay_form == "independent" else decay,
                           "scales": [rules[n].scale for n in muon], "decays": [rules[n].decay for n in muon],
                           "fan_in_dims": [rules[n].fan_in_dim for n in muon]})
        if rest:
            groups.append({"params": rest, "lr": cfg.lr * mult[name], "weight_decay": decay,
                           "eps": settings[name][0], "name": f"{name}_adamw" if muon else name})
    return MuonAdamW(groups, cfg, eps)


def lr_factor(step: int, cfg: TrialConfig) -> float:
    """Warmup, then the schedule, as a factor on each group's base learning rate."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape


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


class Engine(Protocol):
    """What the loop needs of the K models it trains: `Solo` (K = 1) or `workers.batched.Stacked`."""

    models: list[LanguageModel]  # each member's own module (the family's hooks run on it)

    def info(self, i: int) -> tuple[int, dict[str, float], dict[str, str]]: ...  # params, lr mults, run params
    def set_lrs(self, factors: list[float]) -> list[dict[str, float]]: ...  # each member's lr row
    def losses(self, batch: Batch) -> list[float]: ...  # the training losses (the graph kept for `update`)
    def update(self, live: list[bool]) -> None: ...  # backward, clip and step the live members
    def eval_losses(self, batches: list[Batch]) -> list[float]: ...  # mean loss per scored token, in eval mode
    def retire(self, i: int) -> None: ...  # member i diverged: it trains no further
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Solo:
    """One trial's model and optimiser (the model's own, else AdamW over its groups)."""

    def __init__(self, cfg: TrialConfig, vocab_size: int, device: torch.device) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg, self.device = cfg, device
        self.model = build_model(cfg.model, vocab_size=vocab_size, **cfg.model_hp).to(device)
        self.models = [self.model]
        self.opt = make_optimizer(self.model, cfg)
        self.base_lrs = [g["lr"] for g in self.opt.param_groups]
        self._info = (sum(p.numel() for p in self.model.parameters()),
                      {g["name"]: g["lr"] / cfg.lr for g in self.opt.param_groups}, self.model.run_params())
        self.loss: torch.Tensor | None = None

    def info(self, i: int) -> tuple[int, dict[str, float], dict[str, str]]:
        return self._info

    def set_lrs(self, factors: list[float]) -> list[dict[str, float]]:
        for group, base in zip(self.opt.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * factors[0]
        return [{g["name"]: g["lr"] for g in self.opt.param_groups}]

    def losses(self, batch: Batch) -> list[float]:
        self.loss = self.model.loss(batch)[0]
        return [float(self.loss.detach())]

    def update(self, live: list[bool]) -> None:
        assert self.loss is not None
        self.opt.zero_grad(set_to_none=True)
        torch.autograd.backward(self.loss)
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.opt.step()

    def eval_losses(self, batches: list[Batch]) -> list[float]:
        return [mean_loss(self.model, batches, self.device)]

    def retire(self, i: int) -> None:
        """Nothing to do: the loop ends with its one member."""

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])


@dataclass
class Member:
    """One trial's bookkeeping in the loop: its schedule, divergence, plateau, rows and end (checkpointed whole)."""

    cfg: TrialConfig
    rows: list[Row] = field(default_factory=list)
    monitored: list[dict[str, float]] = field(default_factory=list)  # what `eval_metrics` returned, with the step
    best: float = math.inf
    eval_loss: float = math.nan
    train_loss: float = math.nan
    start_loss: float = math.nan  # the untrained model's loss (the first batch's, before any update)
    plateau_scale: float = 1.0
    stale: int = 0
    ended: dict[str, Any] | None = None  # its report's fields once it ended

    def lr_factor(self, step: int) -> float:
        """Warmup and schedule, times the plateau's scale, on this step's base learning rates."""
        return lr_factor(step - 1, self.cfg) * self.plateau_scale

    def trained(self, step: int, loss: float) -> str:
        """The training loss at `step`; why the trial diverged ('' if it did not)."""
        self.train_loss = loss
        if step == 1:
            self.start_loss = loss
        return "" if math.isfinite(loss) and loss <= self.cfg.max_loss else f"loss became {loss} at step {step}"

    def evaluated(self, step: int, loss: float, vocab_size: int) -> str:
        """The eval loss at `step` (plateau and best updated); why the trial diverged ('' if it did not)."""
        self.eval_loss = loss
        if not math.isfinite(loss) or loss > self.cfg.max_loss:
            return f"eval loss became {loss} at step {step}"
        blown = blown_up(loss, vocab_size, self.start_loss, self.cfg.uniform_margin)
        if blown:
            return f"eval loss {loss:.4g} at step {step} is {blown}"
        self.stale = 0 if loss < self.best else self.stale + 1
        self.best = min(self.best, loss)
        if self.cfg.plateau_patience and self.stale >= self.cfg.plateau_patience:
            self.plateau_scale, self.stale = self.plateau_scale * self.cfg.plateau_factor, 0
        return ""

    def curve(self) -> list[tuple[int, float]]:
        """(tokens, eval loss) at each evaluation so far."""
        return [(int(r["tokens"]), float(r["eval_loss"])) for r in self.rows if "eval_loss" in r]

    def report(self, status: TrialStatus, steps: int, tokens: int, wall: float,
               info: tuple[int, dict[str, float], dict[str, str]], message: str = "") -> TrialReport:
        params, multipliers, run_params = info
        return TrialReport(status=status, eval_loss=self.eval_loss if status == TrialStatus.COMPLETED else math.nan,
                           best_eval_loss=self.best, train_loss=self.train_loss, steps=steps, tokens=tokens,
                           wall_time_s=wall, tokens_per_s=tokens / max(wall, 1e-9), params=params, rows=self.rows,
                           eval_curve=self.curve(),
                           message=message, lr_multipliers=multipliers, run_params=run_params)


def train(configs: Sequence[TrialConfig | dict[str, Any]], progress: Progress | None = None,
          checkpoint: Checkpoint | None = None, resume: TrainState | None = None,
          log: Path | None = None) -> list[TrialReport]:
    """Train the trials (one, or a batch's members); one `TrialReport` each, in order (module docstring). An
    error in a plugin's own code is one line naming its family (`workers.model_check.plugin_errors`). `log`: the
    trial's log file, where what its model prints and warns goes instead of the terminal (`workers.quiet`);
    `progress` and `checkpoint` still write where the caller's streams do."""
    cfgs = [c if isinstance(c, TrialConfig) else TrialConfig.model_validate(c) for c in configs]
    with quiet(log) as found, plugin_errors(cfgs[0].model, "training"):
        return _train(cfgs, progress and found.aloud(progress), checkpoint and found.aloud(checkpoint), resume)


def _train(cfgs: list[TrialConfig], progress: Progress | None, checkpoint: Checkpoint | None,
           resume: TrainState | None) -> list[TrialReport]:
    first, k = cfgs[0], len(cfgs)
    check_objective(first)
    device = resolve_device(first.device)
    data = load_data(first.data)
    if k == 1:
        engine: Engine = Solo(first, data.vocab_size, device)
    else:
        from workers.batched import Stacked

        engine = Stacked(cfgs, data.vocab_size, device)
    batches = data.train_batches(first.batch_size, seed=first.seed)
    held_out = data.eval_batches(first.batch_size)  # built once: every call masks the whole held-out set again
    eval_batches, probe = held_out[: first.eval_batches], held_out[0]  # probe: `eval_metrics`' fixed batch
    for model, cfg in zip(engine.models, cfgs, strict=True):
        model.before_trial(cfg)
    members = [Member(cfg) for cfg in cfgs]
    tokens, first_step, wall = 0, 1, 0.0
    if resume is not None:
        engine.load_state_dict(resume["engine"])
        first_step = resume["step"] + 1
        for _ in range(resume["step"]):  # the data position: the seeded stream replayed, diverted batches dropped
            next(batches)
        batches.take_diverted()
        members = [Member(cfg, **saved) for cfg, saved in zip(cfgs, resume["members"], strict=True)]
        tokens, wall = resume["tokens"], resume["wall_time_s"]
        torch.set_rng_state(resume["rng"])
        if resume.get("cuda_rng") is not None and device.type == "cuda":
            torch.cuda.set_rng_state(resume["cuda_rng"], device)
    start = time.perf_counter() - wall
    usage_start = (time.perf_counter(), time.process_time())  # this run's own clock, unlike `start` on resume
    reports = [None if m.ended is None else TrialReport(**m.ended, rows=m.rows) for m in members]
    retiring: list[int] = []  # members that diverged this step: retired once its update or eval is done

    def end(i: int, status: TrialStatus, step: int, message: str = "") -> None:
        wall = (time.perf_counter() - start) / k  # its share of the batch's time
        report = members[i].report(status, step, tokens, wall, engine.info(i), message)
        reports[i], members[i].ended = report, report.model_dump(mode="json", exclude={"rows"})
        if status == TrialStatus.DIVERGED:
            retiring.append(i)

    for step in range(first_step, first.steps + 1):
        live = [r is None for r in reports]
        if not any(live):
            break
        scales = [m.plateau_scale for m in members]  # this step's (an eval below may lower the next)
        lr_rows = engine.set_lrs([m.lr_factor(step) for m in members])
        batch = next(batches)
        for model, alive in zip(engine.models, live, strict=True):
            if alive:
                model.before_step(batch, step - 1)
        losses = engine.losses(batch)
        tokens += int(batch.attention_mask.sum())
        for i, member in enumerate(members):
            why = member.trained(step, losses[i]) if live[i] else ""
            if why:
                end(i, TrialStatus.DIVERGED, step, why)
                live[i] = False
        if not any(live):
            break
        engine.update(live)
        while retiring:
            engine.retire(retiring.pop())
        evaluated = step % first.eval_every == 0 or step == first.steps
        stream: list[float] = []
        if evaluated:
            for i, loss in enumerate(engine.eval_losses(eval_batches)):
                why = members[i].evaluated(step, loss, data.vocab_size) if live[i] else ""
                if why:
                    end(i, TrialStatus.DIVERGED, step, why)
                    live[i] = False
            diverted = batches.take_diverted()
            stream = engine.eval_losses(diverted) if diverted else []
            while retiring:
                engine.retire(retiring.pop())
        if evaluated or step % first.log_every == 0:
            elapsed = time.perf_counter() - start
            system = system_usage(*usage_start)
            rows: dict[int, Row] = {}
            for i, member in enumerate(members):
                if not live[i]:
                    continue
                row: Row = {"step": step, "train_loss": member.train_loss, "tokens": tokens,
                            "tokens_per_s": k * tokens / elapsed, **{f"lr_{g}": v for g, v in lr_rows[i].items()},
                            **system}
                if member.cfg.plateau_patience:
                    row["lr_scale"] = scales[i]
                if evaluated:
                    row["eval_loss"] = member.eval_loss
                    if stream:
                        row["stream_val_loss"] = stream[i]
                    extra = engine.models[i].eval_metrics(probe, step, member.monitored)
                    if extra:
                        member.monitored.append({"step": step, **extra})
                        row.update(extra)
                member.rows.append(row)
                rows[i] = row
                if progress is not None:
                    progress(i, row)
            if evaluated and checkpoint is not None and step < first.steps:
                cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
                checkpoint(rows, {"step": step, "engine": engine.state_dict(), "tokens": tokens,
                                  "members": [{k: v for k, v in vars(m).items() if k != "cfg"} for m in members],
                                  "wall_time_s": time.perf_counter() - start,
                                  "rng": torch.get_rng_state(), "cuda_rng": cuda_rng})
    for i, r in enumerate(reports):
        if r is None:
            end(i, TrialStatus.COMPLETED, first.steps)
    return [r for r in reports if r is not None]


def train_trial(config: TrialConfig | dict[str, Any], progress: Callable[[Row], None] | None = None,
                checkpoint: Callable[[Row, TrainState], None] | None = None,
                resume: TrainState | None = None, log: Path | None = None) -> TrialReport:
    """Train one trial (`train` with one member): `progress(row)`, `checkpoint(row, state)`."""
    return train([config], progress and (lambda i, row: progress(row)),
                 checkpoint and (lambda rows, state: checkpoint(rows[0], state)), resume, log)[0]


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


def system_usage(wall_start: float, cpu_start: float) -> dict[str, float]:
    """The trial process's own use since the run began, without psutil: CPU utilisation (100 = one core busy,
    every torch thread counted) and the process's peak resident memory (a reused Ray actor's peak so far)."""
    wall = max(time.perf_counter() - wall_start, 1e-9)
    return {"system/cpu_utilization_percentage": 100 * (time.process_time() - cpu_start) / wall,
            "system/peak_rss_megabytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
