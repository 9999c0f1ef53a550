"""Coordinate check: the RMS of every traced activation over the first optimiser steps, per width.

Under μP each activation's RMS stays flat as width grows; under the standard parametrization
some grow. Step t is measured after t optimiser updates (t = 0 is initialisation), with the
same data batches at every width for one seed. The slopes, their seed intervals and the
verdict are computed by `analysis.coord` from the returned table.

`coord_check` adds seeds until the verdict is conclusive (docs/LOG.md, issue 11): a slope fails
only when its whole seed interval leaves the band, and a pass needs every interval narrow
enough to have caught a rule error. Its default learning rate is fixed in units of the base
width, lr·d0 = `CHECK_LR_TIMES_BASE`: under μP with Adam a hidden layer's update moves its
output by ≈ fan_in · lr·d0/d = lr·d0 per step, so lr·d0, not lr, sets how hard the check drives
the dynamics, and a check at widths 128–1024 (d0 = 128) at lr 1e-2 runs 4× hotter than one at
32–256, at the edge of stability.
"""

from __future__ import annotations

import pandas as pd
import torch

from analysis.coord import CoordVerdict, coord_slopes, coord_verdict
from studies.spec import DataSpec, TrialConfig
from workers.errors import ConfigError
from workers.models import build_model, family
from workers.models.common import token_loss
from workers.models.contract import LanguageModel
from workers.models.mup_model import mup_problems
from workers.train import load_data, make_optimizer

# The small model per family is registered with it (`studies.family.Family.coord_hp`, with the reasons).
CHECK_LR_TIMES_BASE = 0.32  # the check's lr·d0: 1e-2 at base width 32, 2.5e-3 at 128
DEFAULT_DATA = DataSpec(max_tokens=200_000, seq_len=32)


def coord_data(
    model: str = "pt",
    parametrization: str = "mup",
    widths: tuple[int, ...] = (32, 64, 128, 256),
    steps: int = 4,
    lr: float = 1e-2,
    batch_size: int = 16,
    seeds: int = 3,
    model_hp: dict | None = None,
    data: DataSpec = DEFAULT_DATA,
    base_seed: int = 0,
    per_seed: bool = False,
) -> pd.DataFrame:
    """Rows (parametrization, width, step, name, rms) averaged over the seeds, or with `per_seed` one
    row per seed (a `seed` column: what the seed intervals of `coord_slopes` need).

    Seeds are `base_seed … base_seed + seeds − 1`; seed s draws the model and the batches, so
    every width sees the same data for one seed and the seeds are independent replicates.
    """
    hp, data = _setup(model, widths, model_hp, data)
    cfg = TrialConfig(model=model, data=data, lr=lr, batch_size=batch_size, weight_decay=0.0, grad_clip=0.0)
    mlm = load_data(data)
    rows = []
    for width in widths:
        for seed in range(base_seed, base_seed + seeds):
            torch.manual_seed(seed)
            net = build_model(model, vocab_size=mlm.vocab_size, width=width, parametrization=parametrization, **hp)
            opt = make_optimizer(net, cfg.model_copy(update={"seed": seed}))
            batches = mlm.train_batches(batch_size, seed=1000 + seed)  # same batches at every width
            for step in range(steps):
                batch = next(batches)
                net.before_step(batch, step)  # TauGPT: τ from the first batch, as in training
                trace: dict[str, torch.Tensor] = {}
                logits = net(batch.input_ids, batch.attention_mask, trace=trace)
                for name, act in trace.items():
                    rms = float(act.detach().float().pow(2).mean().sqrt())
                    rows.append((parametrization, width, seed, step, name, rms))
                opt.zero_grad(set_to_none=True)
                loss = token_loss(logits, batch.labels)
                aux = net.aux_loss()  # the traced forward's aux terms, as `net.loss` adds them
                if aux is not None:
                    loss = loss + aux
                loss.backward()
                opt.step()
    df = pd.DataFrame(rows, columns=["parametrization", "width", "seed", "step", "name", "rms"])
    return df if per_seed else df.groupby(["parametrization", "width", "step", "name"], as_index=False)["rms"].mean()


def _setup(model: str, widths: tuple[int, ...], model_hp: dict | None, data: DataSpec) -> tuple[dict, DataSpec]:
    """The check's model hparams (the family's small model, `model_hp` over it, the base the smallest width) and
    its data (the family's objective)."""
    entry = family(model)
    hp = {**entry.coord_hp, **(model_hp or {})}
    hp.setdefault("base_width", min(widths))
    return hp, data.model_copy(update={"objective": entry.objective})  # TauGPT: causal LM batches


def built(model: str, parametrization: str, widths: tuple[int, ...],
          model_hp: dict | None = None) -> dict[int, LanguageModel]:
    """The check's model at each width, as `coord_data` builds it for its first seed (0)."""
    hp, data = _setup(model, widths, model_hp, DEFAULT_DATA)
    vocab = load_data(data).vocab_size
    out = {}
    for width in widths:
        torch.manual_seed(0)
        out[width] = build_model(model, vocab_size=vocab, width=width, parametrization=parametrization, **hp)
    return out


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
    model_hp: dict | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, CoordVerdict, float]:
    """Run the check in batches of `seeds` seeds until the verdict is conclusive or `max_seeds` ran.

    Returns the per-seed rms table, the slopes with their seed intervals, the verdict on steps
    1 … steps−1, and the learning rate used (`check_lr` of the base width unless `lr` is given).
    Under μP a model that uses mup is first checked as built (`workers.models.mup_model.mup_problems`): a
    parameter without an infshape or a hidden weight whose init does not scale with width is a `ConfigError`
    naming it and the fix, before any step.
    """
    if not 2 <= seeds <= max_seeds:
        raise ConfigError(f"seeds={seeds}, max_seeds={max_seeds}: need 2 <= seeds <= max_seeds (an interval needs 2)")
    if steps < 2:
        raise ConfigError(f"steps={steps}: need at least 2 (step 0 is init, steps 1… are judged)")
    hp, entry = dict(model_hp or {}), family(model)
    if parametrization == "mup":  # a model built with mup: what mup's shapes and the init show before training
        problems = mup_problems(built(model, parametrization, widths, hp))
        if problems:
            raise ConfigError(f"the coordinate check of {model!r} fails before training:\n  " + "\n  ".join(problems))
    lr = check_lr(hp.get("base_width", min(widths))) if lr is None else lr
    may_vanish = entry.coord_may_vanish({**entry.coord_hp, **hp})  # what μP lets shrink in the family's model
    frames: list[pd.DataFrame] = []
    ran = 0
    while True:
        batch = min(seeds, max_seeds - ran)
        frames.append(coord_data(model=model, parametrization=parametrization, widths=widths, steps=steps, lr=lr,
                                 seeds=batch, model_hp=hp, base_seed=base_seed + ran, per_seed=True))
        ran += batch
        df = pd.concat(frames, ignore_index=True)
        slopes = coord_slopes(df)
        verdict = coord_verdict(slopes, steps=tuple(range(1, steps)), parametrization=parametrization,
                                may_vanish=may_vanish, output_name=entry.readout)
        if verdict.status != "inconclusive" or ran >= max_seeds:
            return df, slopes, verdict, lr
