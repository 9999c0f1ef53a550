"""Coordinate check: the RMS of every traced activation over the first optimiser steps, per width.

Under μP each activation's RMS stays flat as width grows; under the standard parametrization some grow. Step t
is measured after t updates (t = 0: initialisation), on the same batches at every width for one seed;
`analysis.coord` turns the table into slopes and a verdict, and `coord_check` adds seeds until it is conclusive.
The default lr is fixed in units of the base width, lr·d0 = `CHECK_LR_TIMES_BASE`, because under μP with Adam a
hidden layer's per-step change is ≈ lr·d0: lr·d0, not lr, sets how hard the check drives the dynamics.

With `depths` the check varies depth at one width instead (base_depth the smallest unless given); per-layer
activations are compared by position, `<name>.first` and `<name>.last`, and the table's `depth` column is the
slopes' axis. The protocol and its thresholds: docs/mup.md.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd
import torch

from analysis.coord import CoordVerdict, coord_slopes, coord_verdict
from studies.family import family_names
from studies.spec import MUON_KNOBS, DataSpec, TrialConfig
from workers.attention import traced_attention
from workers.errors import ConfigError
from workers.model_check import check_model
from workers.models import build_model, family
from workers.models.common import token_loss
from workers.models.contract import LanguageModel
from workers.train import load_data, make_optimizer

# The small model per family is registered with it (`studies.family.Family.coord_hp`, with the reasons).
CHECK_LR_TIMES_BASE = 0.32  # the check's lr·d0: 1e-2 at base width 32, 2.5e-3 at 128
DEFAULT_DATA = DataSpec(max_tokens=200_000, seq_len=32)
TRAIN_KEYS = ("optimizer", *MUON_KNOBS)  # `--set` keys of the trial's optimiser (train.*), not of the model


# The residual stream over depth must not grow, but may shrink: under CompleteP the blocks' random initial
# contributions add up to O(L^-1/2) (L branches × 1/L) by design.
DEPTH_MAY_VANISH = ("hidden.",)
LAYER = re.compile(r"\.layer(\d+)$")  # a per-layer trace name's suffix


def depth_field(model: str) -> str:
    """The arch field a depth check varies (n_layers; UT: n_steps); a `ConfigError` for a family without a depth
    parametrization."""
    field = getattr(family(model).arch, "depth_field", None)
    if not isinstance(field, str):
        with_depth = [n for n in family_names() if isinstance(getattr(family(n).arch, "depth_field", None), str)]
        raise ConfigError(f"model {model!r} has no depth parametrization (model.arch.depth_parametrization), so "
                          f"--depths cannot judge it: choose one of {with_depth}")
    return field


def _by_position(name: str, depth: int) -> str | None:
    """A per-layer trace name as `<name>.first` / `<name>.last` (None: a middle layer); other names unchanged."""
    found = LAYER.search(name)
    if found is None:
        return name
    layer = int(found.group(1))
    stem = name[: found.start()]
    return f"{stem}.last" if layer == depth - 1 else f"{stem}.first" if layer == 0 else None


def _sizes(model: str, widths: tuple[int, ...], depths: tuple[int, ...] | None, hp: dict[str, Any]
           ) -> list[tuple[int, dict[str, Any]]]:
    """(width, model hparams) of each model the check builds: one per width, or with `depths` one per depth at
    the one width (the depth field set, base_depth the smallest depth unless given)."""
    if depths is None:
        return [(w, hp) for w in widths]
    if len(widths) != 1:
        raise ConfigError(f"widths={list(widths)}: a depth check varies depth at one width; give one width")
    field = depth_field(model)
    base = {} if hp.get("depth_parametrization", "none") == "none" else {"base_depth": min(depths)}
    return [(widths[0], {**base, **hp, field: depth}) for depth in depths]


def coord_data(
    model: str = "pt",
    parametrization: str = "mup",
    widths: tuple[int, ...] = (32, 64, 128, 256),
    steps: int = 4,
    lr: float = 1e-2,
    batch_size: int = 16,
    seeds: int = 3,
    model_hp: dict[str, Any] | None = None,
    data: DataSpec = DEFAULT_DATA,
    base_seed: int = 0,
    per_seed: bool = False,
    depths: tuple[int, ...] | None = None,
    train: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """Rows (parametrization, width, step, name, rms) averaged over the seeds, or with `per_seed` one
    row per seed (a `seed` column: what the seed intervals of `coord_slopes` need). With `depths` (one width)
    the rows have a `depth` column and the per-layer names by position (module docstring). `train`: the trial's
    optimiser fields (TRAIN_KEYS, e.g. {"optimizer": "muon"}).

    Seeds are `base_seed … base_seed + seeds − 1`; seed s draws the model and the batches, so
    every width sees the same data for one seed and the seeds are independent replicates.
    """
    hp, data = _setup(model, widths, model_hp, data)
    cfg = TrialConfig(model=model, data=data, lr=lr, batch_size=batch_size, weight_decay=0.0, grad_clip=0.0,
                      **(train or {}))
    mlm = load_data(data)
    rows = []
    field = depth_field(model) if depths is not None else None
    for width, size_hp in _sizes(model, widths, depths, hp):
        depth = size_hp[field] if field is not None else None
        for seed in range(base_seed, base_seed + seeds):
            torch.manual_seed(seed)
            net = build_model(model, vocab_size=mlm.vocab_size, width=width, parametrization=parametrization,
                              **size_hp)
            opt = make_optimizer(net, cfg.model_copy(update={"seed": seed}))
            batches = mlm.train_batches(batch_size, seed=1000 + seed)  # same batches at every width
            for step in range(steps):
                batch = next(batches)
                net.before_step(batch, step)  # TauGPT: τ from the first batch, as in training
                trace: dict[str, torch.Tensor] = {}
                with traced_attention(net, trace):  # SDPA's logits too (`workers.attention`)
                    logits = net(batch.input_ids, batch.attention_mask, trace=trace)
                for name, act in trace.items():
                    shown = name if depth is None else _by_position(name, depth)
                    if shown is not None:
                        rms = float(act.detach().float().pow(2).mean().sqrt())
                        rows.append((parametrization, width, depth, seed, step, shown, rms))
                opt.zero_grad(set_to_none=True)
                loss = token_loss(logits, batch.labels)
                aux = net.aux_loss()  # the traced forward's aux terms, as `net.loss` adds them
                if aux is not None:
                    loss = loss + aux
                torch.autograd.backward(loss)  # `loss.backward()`, typed
                opt.step()
    df = pd.DataFrame(rows, columns=["parametrization", "width", "depth", "seed", "step", "name", "rms"])
    if depths is None:
        df = df.drop(columns="depth")
    axis = ["width"] if depths is None else ["width", "depth"]
    return df if per_seed else df.groupby(["parametrization", *axis, "step", "name"], as_index=False)["rms"].mean()


def _setup(model: str, widths: tuple[int, ...], model_hp: dict[str, Any] | None, data: DataSpec
           ) -> tuple[dict[str, Any], DataSpec]:
    """The check's model hparams (the family's small model, `model_hp` over it, the base the smallest width) and
    its data (the family's objective)."""
    entry = family(model)
    hp = {**entry.coord_hp, **(model_hp or {})}
    hp.setdefault("base_width", min(widths))
    return hp, data.model_copy(update={"objective": entry.objective})  # TauGPT: causal LM batches


def built(model: str, parametrization: str, widths: tuple[int, ...],
          model_hp: dict[str, Any] | None = None) -> dict[int, LanguageModel]:
    """The check's model at each width, as `coord_data` builds it for its first seed (0)."""
    hp, data = _setup(model, widths, model_hp, DEFAULT_DATA)
    vocab = load_data(data).vocab_size
    out = {}
    for width in widths:
        torch.manual_seed(0)
        out[width] = build_model(model, vocab_size=vocab, width=width, parametrization=parametrization, **hp)
    return out


def growing_heads(model: str, parametrization: str, widths: tuple[int, ...],
                  model_hp: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The traced SDPA attention logits (`workers.attention`) whose head size grows from the narrowest width to the
    widest: μP's q·k/head_dim shrinks their random initial part as head_dim^-1/2, so they are judged one-sidedly."""
    dims: dict[int, dict[str, int]] = {}
    for width, net in built(model, parametrization, (min(widths), max(widths)), model_hp).items():
        dims[width] = {}
        ids = torch.zeros(1, 4, dtype=torch.long)
        with torch.no_grad(), traced_attention(net.eval(), {}, dims[width]):
            net(ids, torch.ones_like(ids, dtype=torch.bool), trace={})
    narrow, wide = dims[min(widths)], dims[max(widths)]
    return tuple(name for name, d in wide.items() if d > narrow.get(name, d))


def check_lr(base_width: int) -> float:
    """The check's default learning rate at base width d0: lr·d0 = CHECK_LR_TIMES_BASE."""
    return CHECK_LR_TIMES_BASE / base_width


def coord_check(
    model: str = "pt",
    parametrization: str = "mup",
    widths: tuple[int, ...] = (32, 64, 128, 256),
    steps: int = 4,
    lr: float | None = None,
    seeds: int = 4,
    max_seeds: int = 16,
    base_seed: int = 0,
    model_hp: dict[str, Any] | None = None,
    depths: tuple[int, ...] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, CoordVerdict, float]:
    """Run the check in batches of `seeds` seeds until the verdict is conclusive or `max_seeds` ran; with `depths`,
    over depth at the one width of `widths` (module docstring).

    Returns the per-seed rms table, the slopes with their seed intervals, the verdict on steps
    1 … steps−1, and the learning rate used (`check_lr` of the base width unless `lr` is given).
    `model_hp` may hold the optimiser's fields (TRAIN_KEYS: `--set optimizer=muon`), which go to the trial config.
    The model is first checked at the door (`workers.model_check.check_model`): a broken contract, and under μP
    a parameter without an infshape or a hidden weight whose init does not scale with width, is a
    `ContractError` naming it and the fix, before any step.
    """
    if not 2 <= seeds <= max_seeds:
        raise ConfigError(f"seeds={seeds}, max_seeds={max_seeds}: need 2 <= seeds <= max_seeds (an interval needs 2)")
    if steps < 2:
        raise ConfigError(f"steps={steps}: need at least 2 (step 0 is init, steps 1… are judged)")
    hp, entry = dict(model_hp or {}), family(model)
    train = {k: hp.pop(k) for k in TRAIN_KEYS if k in hp}  # `--set optimizer=muon`: the optimiser's, not the model's
    if depths is not None:
        _sizes(model, widths, depths, hp)  # one width, a family with a depth field: its errors before any step
        if len(set(depths)) < 2:
            raise ConfigError(f"depths={list(depths)}: need at least two depths")
    door, _ = _setup(model, widths, hp, DEFAULT_DATA)  # the contract (and under μP its rules) before any step
    check_model(model, {**door, "width": min(widths), "parametrization": parametrization}, DEFAULT_DATA.seq_len)
    lr = check_lr(hp.get("base_width", min(widths))) if lr is None else lr
    may_vanish = entry.coord_may_vanish({**entry.coord_hp, **hp})  # what μP lets shrink in the family's model
    if depths is None:
        may_vanish = (*may_vanish, *growing_heads(model, parametrization, widths, hp))
    else:
        may_vanish = (*may_vanish, *DEPTH_MAY_VANISH)
    frames: list[pd.DataFrame] = []
    ran = 0
    while True:
        batch = min(seeds, max_seeds - ran)
        frames.append(coord_data(model=model, parametrization=parametrization, widths=widths, steps=steps, lr=lr,
                                 seeds=batch, model_hp=hp, base_seed=base_seed + ran, per_seed=True, depths=depths,
                                 train=train))
        ran += batch
        df = pd.concat(frames, ignore_index=True)
        slopes = coord_slopes(df, axis="width" if depths is None else "depth")
        verdict = coord_verdict(slopes, steps=tuple(range(1, steps)), parametrization=parametrization,
                                may_vanish=may_vanish, output_name=entry.readout)
        if verdict.status != "inconclusive" or ran >= max_seeds:
            return df, slopes, verdict, lr
