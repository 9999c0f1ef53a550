"""One optimizer against another after both were transferred: what the study's optimizer buys at the target width.

The rows are lr sweeps under one parametrization at two or more widths, column `optimizer` naming each row's. Each
optimizer's lr is its own proxy optimum (the narrowest width's seed-mean curve, interpolated in log2 lr as
`analysis.transfer.lr_optima` does) carried to the target (the widest width) as the swept lr nearest it in log2.
There, seed by seed (the same seed: the same init and batches), the two runs at their carried lrs are compared:

- the final eval loss of each (the same steps and tokens), mean and 95 % t-interval over seeds, and the paired
  difference `optimizer − against`;
- the tokens `optimizer` needs to reach `against`'s mean final loss (`tokens_to`, linear between the evaluations
  of its eval curve: the trial table's `eval_curve`), and the speed-up, `against`'s tokens over those, with its
  interval over the seeds that reach it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel

from analysis.constants import TrialStatus
from analysis.regret import t_interval
from analysis.table import judged_loss
from analysis.transfer import lr_curves, lr_optima

__all__ = ["OptimizerGain", "Spread", "gain_line", "optimizer_gain", "tokens_to"]


class Spread(BaseModel):
    """A mean over seeds and its 95 % t-interval (None: fewer than 2 values)."""

    mean: float | None
    ci: tuple[float, float] | None
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        kept = [float(v) for v in values if math.isfinite(v)]
        return cls(mean=float(np.mean(kept)) if kept else None, ci=t_interval(kept), n=len(kept))

    def said(self, fmt: str = "{:.4f}") -> str:
        if self.mean is None:
            return "—"
        ci = f" [{fmt.format(self.ci[0])}, {fmt.format(self.ci[1])}]" if self.ci else ""
        return fmt.format(self.mean) + ci


class OptimizerGain(BaseModel):
    """`optimizer` against `against` at the target width, each at its own lr carried from the proxy width."""

    optimizer: str
    against: str
    parametrization: str
    proxy: int  # the width each optimizer's lr optimum was read at
    target: int  # the width they are compared at
    proxy_lr: dict[str, float]  # each optimizer's interpolated optimum at the proxy
    lr: dict[str, float]  # each optimizer's carried lr at the target (the swept lr nearest its proxy optimum)
    loss: dict[str, Spread]  # each optimizer's final eval loss at the target
    difference: Spread  # optimizer − against, paired by seed
    tokens: int | None  # the tokens `against`'s runs trained on
    reached: list[float | None]  # per seed: the tokens `optimizer` took to reach `against`'s mean final loss
    speedup: Spread  # against's tokens / those, over the seeds that reached it
    n_diverged: dict[str, int]  # runs at the carried lr that diverged, per optimizer


def tokens_to(curve: Sequence[Sequence[float]], loss: float) -> float | None:
    """The tokens at which an eval curve ((tokens, eval loss) per evaluation, in order) first reaches `loss`, linear
    between evaluations (at the first evaluation when it is already there); None: never."""
    previous: tuple[float, float] | None = None
    for tokens, value in curve:
        if value <= loss:
            if previous is None:
                return float(tokens)
            t0, v0 = previous
            return t0 + (tokens - t0) * (v0 - loss) / (v0 - value)
        previous = (float(tokens), float(value))
    return None


def _curve(value: Any) -> list[list[float]]:
    """A row's `eval_curve` (a JSON list of [tokens, eval loss]; [] where the table has none)."""
    return json.loads(value) if isinstance(value, str) and value else []


def _carried(rows: pd.DataFrame, proxy: int) -> tuple[float, float]:
    """(interpolated optimum at the proxy, the swept lr nearest it in log2) of one optimizer's sweep."""
    optimum = lr_optima(lr_curves(rows[rows["width"] == proxy]))[0]
    assert optimum.lr_interp is not None
    grid = np.array(sorted(rows["lr"].unique()), dtype=float)
    return optimum.lr_interp, float(grid[np.argmin(np.abs(np.log2(grid) - np.log2(optimum.lr_interp)))])


def _runs(part: pd.DataFrame, target: int, lr: float) -> pd.DataFrame:
    """One optimizer's runs at the target width and its carried lr, by seed (failed runs left out)."""
    run = part[(part["width"] == target) & np.isclose(part["lr"], lr) & (part["status"] != TrialStatus.FAILED)]
    return run.set_index("seed")


def optimizer_gain(rows: pd.DataFrame, optimizer: str, against: str) -> OptimizerGain:
    """`optimizer` against `against` (module docstring) over the lr-sweep rows of one parametrization (columns
    `optimizer, width, seed, lr, eval_loss, status`, and `eval_curve` for the speed-up)."""
    params = rows["parametrization"].unique()
    if len(params) != 1:
        raise ValueError(f"an optimizer comparison takes one parametrization's rows, not {sorted(params)}")
    widths = sorted(int(w) for w in rows["width"].unique())
    proxy, target = widths[0], widths[-1]
    of = {opt: rows[rows["optimizer"] == opt] for opt in (optimizer, against)}
    for opt, part in of.items():
        if not (part["width"] == proxy).any() or not (part["width"] == target).any():
            raise ValueError(f"optimizer {opt!r} has no lr sweep at widths {proxy} and {target}: sweep its lr at both")
    carried = {opt: _carried(part, proxy) for opt, part in of.items()}
    runs = {opt: _runs(part, target, carried[opt][1]) for opt, part in of.items()}
    losses = {opt: judged_loss(run) for opt, run in runs.items()}
    seeds = sorted(set(runs[optimizer].index) & set(runs[against].index))
    goal = Spread.of(losses[against].to_numpy()).mean
    reached = [tokens_to(_curve(runs[optimizer].loc[s].get("eval_curve")), goal)
               if goal is not None and math.isfinite(losses[optimizer].loc[s]) else None for s in seeds]
    most = runs[against]["tokens"].max() if "tokens" in runs[against] else math.nan
    tokens = int(most) if math.isfinite(most) else None
    return OptimizerGain(
        optimizer=optimizer, against=against, parametrization=str(params[0]), proxy=proxy, target=target,
        proxy_lr={opt: c[0] for opt, c in carried.items()}, lr={opt: c[1] for opt, c in carried.items()},
        loss={opt: Spread.of(loss.to_numpy()) for opt, loss in losses.items()},
        difference=Spread.of([losses[optimizer].loc[s] - losses[against].loc[s] for s in seeds]),
        tokens=tokens, reached=reached,
        speedup=Spread.of([tokens / t for t in reached if t and tokens]) if tokens else Spread.of([]),
        n_diverged={opt: int(np.isinf(loss.to_numpy()).sum()) for opt, loss in losses.items()})


def gain_line(g: OptimizerGain) -> str:
    """The comparison in one sentence."""
    o, a = g.optimizer, g.against
    lrs = f"{o} {g.lr[o]:.3g}, {a} {g.lr[a]:.3g}"
    head = (f"{o.capitalize()} against {a} at width {g.target} ({g.parametrization}), each at its own lr carried "
            f"from width {g.proxy} ({lrs}): eval loss {g.loss[o].said()} against {g.loss[a].said()}"
            + (f" after {g.tokens:,} tokens" if g.tokens else "")
            + f", {o} − {a} {g.difference.said('{:+.4f}')} nats paired by seed")
    hits = sum(t is not None for t in g.reached)
    if not g.reached or g.tokens is None:
        tail = ""
    elif hits == 0:
        tail = f"; {o} did not reach {a}'s final loss within its {g.tokens:,} tokens"
    else:
        tail = (f"; {o} reaches {a}'s final loss in {g.speedup.said('{:.2f}×')} fewer tokens "
                f"({hits} of {len(g.reached)} seeds reach it)")
    diverged = [f"{n} {opt} run(s) diverged at the carried lr" for opt, n in g.n_diverged.items() if n]
    return head + tail + (f" ({'; '.join(diverged)})" if diverged else "") + "."
