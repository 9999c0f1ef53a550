"""AdamW's weight decay as a timescale: τ = 1/(η·λ) iterations, and what it is as a fraction of a run.

Decoupled weight decay (torch's AdamW) shrinks a weight by η·λ per step, so with no gradient it forgets its value
over τ = 1/(ηλ) iterations: the exponential moving average the weights are (Wang & Aitchison, "How to set AdamW's
weight decay as you scale model and dataset size"). Their rule: keep τ/T, the timescale as a fraction of the T
iterations a run trains, constant when T changes, which at a fixed η means λ ∝ 1/T (`timescale_weight_decay`).
Under the coupled form μP's hidden groups train at η/width_mult, so their τ is width_mult times longer.

`optimum_timescales` reads the validate phase's λ sweep (an `LRDrift` of hparam `weight_decay`) as timescales: at
each width the optimum λ*, the η its sweep trained at, τ* = 1/(ηλ*) and τ*/T, and, with the lr sweep, the same at
that width's optimal η*, so a reader sees whether the optimum keeps τ/T constant. Pure functions, no torch.
"""

from __future__ import annotations

import math

import pandas as pd
from pydantic import BaseModel

from analysis.table import require_columns
from analysis.transfer import LRDrift, sweep_rows

__all__ = ["Timescale", "decay_timescale", "optimum_timescales", "swept_lrs", "timescale_line",
           "timescale_weight_decay"]


class Timescale(BaseModel):
    """AdamW's decay timescale of one run: τ = 1/(lr · weight_decay) iterations, and τ / steps."""

    lr: float
    weight_decay: float
    steps: int
    tau: float  # iterations
    fraction: float  # tau / steps


def decay_timescale(lr: float, weight_decay: float, steps: int) -> Timescale | None:
    """τ = 1/(ηλ) of a run of `steps` iterations at base lr η = `lr` and decay λ = `weight_decay`; None when λ or η
    is not positive (no decay: no timescale)."""
    if not (lr > 0 and weight_decay > 0 and steps > 0):
        return None
    tau = 1.0 / (lr * weight_decay)
    return Timescale(lr=lr, weight_decay=weight_decay, steps=steps, tau=tau, fraction=tau / steps)


def timescale_weight_decay(weight_decay: float, proxy_steps: int, target_steps: int) -> float:
    """Wang & Aitchison's rule at a fixed η: the λ that keeps τ/T of the proxy's run, λ · T_proxy / T_target."""
    if proxy_steps < 1 or target_steps < 1:
        raise ValueError(f"steps must be >= 1 (proxy {proxy_steps}, target {target_steps})")
    return weight_decay * proxy_steps / target_steps


def timescale_line(what: str, timescale: Timescale | None, note: str = "") -> str | None:
    """One sentence: `what`'s τ in iterations and as a fraction of its run (None without decay)."""
    if timescale is None:
        return None
    t = timescale
    return (f"AdamW timescale of {what}: τ = 1/(η·λ) = 1/({t.lr:.3g} × {t.weight_decay:.3g}) ≈ {t.tau:,.0f} "
            f"iterations, τ/T = {t.fraction:.3g} of its T = {t.steps} steps{note}")


def swept_lrs(table: pd.DataFrame, phase: str = "validate") -> dict[tuple[str, int], float]:
    """The base lr the λ sweep trained at, per (parametrization, width) (the centre's: one value each)."""
    rows = sweep_rows(table, phase, "weight_decay")
    require_columns(rows, ["parametrization", "width", "lr"], "the weight_decay sweep")
    return {(str(p), int(w)): float(lr) for (p, w), lr in rows.groupby(["parametrization", "width"])["lr"].first()
            .items()}


def optimum_timescales(table: pd.DataFrame, decay: LRDrift, steps: int, lr_drift: LRDrift | None = None,
                       phase: str = "validate") -> pd.DataFrame:
    """The λ sweep's optimum as a timescale at each (parametrization, width): λ* (interpolated in log λ), the lr η
    the sweep trained at (`table`'s `phase` rows sweeping weight_decay), τ* = 1/(ηλ*) and τ*/T for T = `steps`;
    with the lr sweep (`lr_drift`), also that width's optimal η* and τ*/T at η* (η*·λ*·T is its inverse).

    Returns columns `parametrization, width, λ*, η (swept at), τ* (iterations), τ*/T[, η*, τ*/T at η*]`.
    """
    if decay.hparam != "weight_decay":
        raise ValueError(f"optimum_timescales reads a weight_decay sweep, not {decay.hparam!r}'s")
    lrs = swept_lrs(table, phase)
    best_lr = {(o.parametrization, o.width): o.lr_interp or o.lr for o in (lr_drift.optima if lr_drift else [])}
    rows = []
    for o in sorted(decay.optima, key=lambda o: (o.parametrization != "mup", o.parametrization, o.width)):
        lam, lr = o.lr_interp or o.lr, lrs.get((o.parametrization, o.width), math.nan)
        tau = 1.0 / (lr * lam) if lr > 0 else math.nan
        row = {"parametrization": o.parametrization, "width": o.width, "λ*": lam, "η (swept at)": lr,
               "τ* (iterations)": tau, "τ*/T": tau / steps}
        if lr_drift is not None:
            star = best_lr.get((o.parametrization, o.width), math.nan)
            row |= {"η*": star, "τ*/T at η*": 1.0 / (star * lam * steps)}
        rows.append(row)
    return pd.DataFrame(rows)
