"""Tauformer's collapse warning (Tauformer spec §3.1): key energies drifting low and losing their spread.

The monitoring table has one row per monitored step and, per layer, the p05, p50 and p95 of the block's
key energies E_k (columns `tau.E_k.p05.layer0`, … as `workers.models.tauformer.TauGPT.monitor` names them).
A layer is flagged at a step when, against the row `window` monitors earlier, its median E_k fell by more
than `tol` (relative) while its p05–p95 spread shrank by more than `tol`: K vectors turning low-variance and
non-discriminative.
"""

from __future__ import annotations

import re

import pandas as pd
from pydantic import BaseModel

_MEDIAN = re.compile(r"^tau\.E_k\.p50\.(layer\d+)$")


class CollapseFlag(BaseModel):
    step: int
    layer: str
    median_change: float  # relative change of the median E_k over the window
    spread_change: float  # relative change of the p05–p95 spread


class CollapseVerdict(BaseModel):
    window: int
    tol: float
    flags: list[CollapseFlag]
    warned: bool
    verdict: str


def collapse_warning(monitor: pd.DataFrame, window: int = 3, tol: float = 0.05) -> CollapseVerdict:
    """Flag (step, layer) pairs whose median E_k fell and whose p05–p95 spread shrank, both by more than `tol`."""
    if window < 1 or tol < 0:
        raise ValueError(f"window={window} must be >= 1 and tol={tol} >= 0")
    layers = sorted(m.group(1) for c in monitor.columns if (m := _MEDIAN.match(c)))
    rows = monitor.sort_values("step").reset_index(drop=True) if layers else monitor
    flags = []
    for layer in layers:
        median = rows[f"tau.E_k.p50.{layer}"]
        spread = rows[f"tau.E_k.p95.{layer}"] - rows[f"tau.E_k.p05.{layer}"]
        median_change = median / median.shift(window) - 1
        spread_change = spread / spread.shift(window) - 1
        hit = (median_change < -tol) & (spread_change < -tol)
        flags += [CollapseFlag(step=int(rows["step"][i]), layer=layer, median_change=float(median_change[i]),
                               spread_change=float(spread_change[i])) for i in hit[hit].index]
    flags.sort(key=lambda f: (f.step, f.layer))
    if flags:
        first = flags[0]
        verdict = (f"collapse warning: {len(flags)} (step, layer) pair(s); first {first.layer} at step {first.step}: "
                   f"median E_k {first.median_change:+.1%}, p05–p95 spread {first.spread_change:+.1%} over "
                   f"{window} monitors")
    else:
        verdict = f"no collapse sign in {len(layers)} layer(s) over {len(rows)} monitors"
    return CollapseVerdict(window=window, tol=tol, flags=flags, warned=bool(flags), verdict=verdict)
