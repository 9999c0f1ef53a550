"""The batch sweep (`validate.batch_sizes`): its rows, the lr optimum's drift per doubling of the batch size against
the textbook rules, and the regret of carrying the base batch's optimal lr unchanged to each other batch size.

Two rules say how the optimal lr grows with the batch size B. The square-root rule (lr ∝ √B: +0.5 log2(lr) per
doubling of B) keeps the update's noise scale for Adam-type optimizers (Malladi et al., 2022, "On the SDEs and
scaling rules for adaptive gradient algorithms"); the linear rule (lr ∝ B: +1.0) is SGD's (Goyal et al., 2017).
A drift of 0 means the lr carries unchanged. The measured drift is `analysis.lr_drift(..., axis="batch")`: the slope
of the interpolated optimal log2(lr) on log2(B) at one width, its 95 % interval over every seed's own optima.

The regret: at each other batch size B, the loss at the base batch's optimal lr (its seed-mean curve's interpolated
optimum, `analysis.regret.curve_minimum`) minus that curve's own minimum, in nats and in % of it, with its 95 %
interval over seeds (`analysis.regret.carried_regret`). The base batch is the tune batch when it was swept, else the
swept batch size nearest it in log2 (the smaller on a tie).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.regret import Regret, _curve, carried_regret, curve_minimum, said
from analysis.table import phase_rows
from analysis.transfer import JUDGED, LRDrift, lr_curves

__all__ = ["RULES", "base_of", "batch_regret", "batch_regret_line", "batch_sweep", "rules_text",
           "without_batch_sweep"]

RULES = {"unchanged": 0.0, "√B": 0.5, "linear": 1.0}
"""Each rule's drift of the optimal lr in log2(lr) per doubling of the batch size."""


def batch_sweep(table: pd.DataFrame, phase: str = "validate") -> pd.DataFrame:
    """A batch sweep's rows (`batch_size` set), `batch_size` as int, as `lr_drift(..., axis="batch")` and
    `analysis.plot_batch` take them; empty without a batch sweep."""
    rows = phase_rows(table, phase)
    if "batch_size" not in rows.columns:
        return rows.iloc[0:0]
    rows = rows[rows["batch_size"].notna()]
    return rows.assign(batch_size=rows["batch_size"].astype(int))


def without_batch_sweep(table: pd.DataFrame) -> pd.DataFrame:
    """The rows that are not a batch sweep's (the width, horizon and depth sweeps')."""
    return table[table["batch_size"].isna()] if "batch_size" in table.columns else table


def nearest_rule(drift: float) -> str:
    """The rule of `RULES` whose drift lies nearest `drift` (the smaller drift on a tie)."""
    return min(RULES, key=lambda name: (abs(drift - RULES[name]), RULES[name]))


def rules_text(drift: LRDrift, parametrization: str | None = None) -> str:
    """The measured drift beside the rules, e.g. "mup's optimal lr at width 64 moves +0.42 [95 % CI +0.21, +0.63]
    log2(lr) per doubling of the batch size: nearest the √B rule (+0.5; linear +1.0, unchanged 0); the interval
    holds √B only". `parametrization`: default the judged one (mup)."""
    param = parametrization or JUDGED[drift.axis][0]
    value, ci = drift.drift[param], drift.drift_ci.get(param)
    width = f" at width {drift.optima[0].width}" if drift.optima else ""
    interval = f" [95 % CI {ci[0] + 0.0:+.2f}, {ci[1] + 0.0:+.2f}]" if ci else " (too few optima for an interval)"
    near = nearest_rule(value)
    others = ", ".join(_value(name, True) for name in RULES if name != near)
    rule = "carrying it unchanged" if near == "unchanged" else f"the {near} rule"
    said = (f"{param}'s optimal {drift.hparam}{width} moves {value + 0.0:+.2f}{interval} log2({drift.hparam}) per "
            f"doubling of the batch size: nearest {rule} ({_value(near)}; {others})")
    if ci is None:
        return said
    held = [name for name, rule in RULES.items() if ci[0] <= rule <= ci[1]]
    return said + (f"; the interval holds {' and '.join(held)}" if held else "; the interval holds none of them")


def _value(name: str, named: bool = False) -> str:
    """A rule's drift as "+0.5" (0 unsigned), after its name when `named`."""
    value = f"{RULES[name]:+.1f}" if RULES[name] else "0"
    return f"{name} {value}" if named else value


def base_of(swept: Sequence[int], base_batch: int) -> int:
    """The swept batch size whose optimum is carried: `base_batch` when swept, else the one nearest it in log2 (the
    smaller on a tie)."""
    if base_batch in swept:
        return base_batch
    return min(swept, key=lambda b: (abs(np.log2(b / base_batch)), b))


def batch_regret(table: pd.DataFrame, base_batch: int, *, phase: str = "validate", hparam: str = "lr"
                 ) -> list[Regret]:
    """The regret of carrying each parametrization's optimal `hparam` at the base batch (`base_of`) unchanged to
    each other swept batch size, per width (module docstring): one `Regret` per (width, parametrization, batch
    size), widths and batch sizes increasing, the judged parametrization (mup) first. A parametrization whose every
    value diverged at the base batch has no optimum to carry and is left out."""
    rows = batch_sweep(table, phase)
    out: list[Regret] = []
    for width in sorted(rows["width"].unique()):
        at_width = rows[rows["width"] == width]
        curves = lr_curves(at_width, phase, hparam, axis="batch")
        seeds = lr_curves(at_width, phase, hparam, by_seed=True, axis="batch")
        for param in sorted(curves["parametrization"].unique(), key=lambda p: (p != "mup", p)):
            own = curves[curves["parametrization"] == param]
            swept = sorted(int(b) for b in own["batch_size"].unique())
            base = base_of(swept, base_batch)
            source_curve = own[own["batch_size"] == base]
            if not np.isfinite(source_curve["eval_loss"]).any():
                continue
            carried = float(2.0 ** curve_minimum(*_curve(source_curve, hparam))[0])
            source = f"{param}'s own optimum at batch size {base}"
            out += [carried_regret(own[own["batch_size"] == b],
                                   seeds[(seeds["parametrization"] == param) & (seeds["batch_size"] == b)], hparam,
                                   carried, parametrization=str(param), width=int(width), source=source,
                                   batch_size=b) for b in swept if b != base]
    return out


def _said(r: Regret) -> str:
    return f"batch {r.batch_size}: {said(r)}"


def batch_regret_line(regrets: Sequence[Regret], width: int | None = None) -> str | None:
    """What carrying the base batch's lr unchanged costs, in one line per width, e.g. "Batch regret in lr at width
    64 (the optimum at batch size 16 carried unchanged): batch 8: mup +0.004 nats (+0.1 %) [...]; batch 32: ...".
    `width`: that width's line (default the first); None without a regret there."""
    chosen = [r for r in regrets if r.batch_size is not None]
    widths = sorted({r.width for r in chosen})
    if not widths:
        return None
    w = width if width is not None else widths[0]
    chosen = [r for r in chosen if r.width == w]
    if not chosen:
        return None
    sources = "; ".join(dict.fromkeys(f"{r.parametrization} carries {r.source}" for r in chosen))
    return (f"Batch regret in {chosen[0].hparam} at width {w}: {'; '.join(_said(r) for r in chosen)} (vs each batch "
            f"size's interpolated optimum; {sources}).")
