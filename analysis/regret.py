"""Transfer regret: what carrying the tuned hparams to a wider width cost, measured on the validate sweep.

At a swept width, the regret of a transferred value x_t is L(x_t) − L*, in nats and in % of L*. L* is the
minimum of the parabola (in log2 of the hparam) through the best grid value and its two neighbours, as in
`analysis.transfer.interpolate_optimum`; L(x_t) is the grid loss at a grid value, else that parabola between
the best value's neighbours, else the straight line between the grid values around x_t. So the regret is 0 at
the interpolated optimum and never negative. Under the study's parametrization x_t is the tuned centre's value;
under the other it is that parametrization's own optimum at the proxy width, so its regret is what μP saved.
The regret is taken on the seed-mean curve, its 95 % interval over every seed's own regret (none with one seed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, model_validator

from analysis.constants import Axis
from analysis.transfer import lr_curves, parabola

__all__ = ["Regret", "base_of", "carried_line", "carried_regret", "carried_regrets", "curve_loss_at", "curve_minimum",
           "regret_line", "t_interval", "transfer_regret"]


class Regret(BaseModel):
    """The regret of one transferred hparam value at one (parametrization, width) of the validate sweep."""

    hparam: str
    parametrization: str
    width: int
    transferred: float  # the value carried to this width
    source: str  # where it came from: "the tuned centre", or "standard's own optimum at width 32"
    optimum: float  # the sweep's interpolated optimum (a value of `hparam`)
    optimum_loss: float  # L*: the seed-mean curve's minimum (the parabola's, else the best grid loss)
    loss: float | None  # L(x_t) on the seed-mean curve; None: diverged there, or x_t outside the swept grid
    regret: float | None  # L(x_t) − L* in nats
    regret_pct: float | None  # 100 · regret / L*
    ci: tuple[float, float] | None  # 95 % t-interval of the per-seed regrets in nats (None: fewer than 2 seeds)
    n_seeds: int  # seeds whose own regret entered the interval
    note: str = ""  # why a value is missing: "diverged at the transferred value", "outside the swept grid", ...
    axis: str | None = None  # a sweep along another axis than width (`carried_regrets`): its name
    at: int | None = None  # there: the value the optimum was carried to

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """A record from before `axis`: a batch sweep's `batch_size`."""
        if isinstance(data, dict) and "batch_size" in data:
            data = dict(data)
            batch = data.pop("batch_size")
            if batch is not None:
                data.update(axis="batch", at=batch)
        return data


def _curve(curve: pd.DataFrame, hparam: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(log2 values, losses, position of the best) of one curve, sorted by value (ties: the smaller value)."""
    curve = curve.sort_values(hparam)
    x, y = np.log2(curve[hparam].to_numpy(dtype=float)), curve["eval_loss"].to_numpy(dtype=float)
    return x, y, int(np.argmin(y))


def curve_minimum(x: np.ndarray, y: np.ndarray, best: int) -> tuple[float, float]:
    """(x*, L*): the vertex of the parabola through point `best` and its neighbours and its value there, or the
    point itself where there is no such parabola (`analysis.transfer.parabola`)."""
    coeffs = parabola(x, y, best)
    if coeffs is None:
        return float(x[best]), float(y[best])
    a, b, _ = coeffs
    vertex = float(np.clip(-b / (2 * a), x[best - 1], x[best + 1]))
    return vertex, float(np.polyval(coeffs, vertex))


def curve_loss_at(x: np.ndarray, y: np.ndarray, best: int, at: float) -> float | None:
    """The curve's loss at log2 value `at` (module docstring): +inf where it diverged, None outside the grid."""
    on_grid = np.flatnonzero(np.isclose(x, at, rtol=0, atol=1e-9))
    if on_grid.size:
        return float(y[on_grid[0]])
    coeffs = parabola(x, y, best)
    if coeffs is not None and x[best - 1] <= at <= x[best + 1]:
        return float(np.polyval(coeffs, at))
    if not x[0] < at < x[-1]:
        return None
    right = int(np.searchsorted(x, at))
    pair = y[right - 1 : right + 1]
    if not np.isfinite(pair).all():
        return float("inf")
    return float(np.interp(at, x[right - 1 : right + 1], pair))


def _regret(curve: pd.DataFrame, hparam: str, at: float) -> tuple[float, float, float | None]:
    """(log2 optimum, L*, L(at)) of one curve."""
    x, y, best = _curve(curve, hparam)
    vertex, minimum = curve_minimum(x, y, best)
    return vertex, minimum, curve_loss_at(x, y, best, at)


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """The `level` t-interval of the mean of `values` (None: fewer than 2)."""
    if len(values) < 2:
        return None
    from scipy import stats  # here: SciPy's import is a second of every trial actor's start

    mean, sem = float(np.mean(values)), float(np.std(values, ddof=1) / np.sqrt(len(values)))
    half = float(stats.t.ppf(0.5 + level / 2, len(values) - 1)) * sem
    return (mean - half, mean + half)


def _one(table: pd.DataFrame, curves: pd.DataFrame, phase: str, hparam: str, param: str, width: int,
         transferred: float, source: str) -> Regret:
    curve = curves[(curves["parametrization"] == param) & (curves["width"] == width)]
    per_seed = lr_curves(table, phase, hparam, by_seed=True)
    per_seed = per_seed[(per_seed["parametrization"] == param) & (per_seed["width"] == width)]
    return carried_regret(curve, per_seed, hparam, transferred, parametrization=param, width=width, source=source)


def carried_regret(curve: pd.DataFrame, seed_curves: pd.DataFrame, hparam: str, transferred: float, *,
                   parametrization: str, width: int, source: str, axis: str | None = None, at: int | None = None
                   ) -> Regret:
    """The regret of carrying `transferred` to one seed-mean `curve` of `hparam` (`lr_curves`' rows of one
    curve), its interval over `seed_curves` (the same curve per seed, column `seed`); the rest names the curve."""
    x = float(np.log2(transferred))
    vertex, minimum, loss = _regret(curve, hparam, x)
    regrets = []
    for _, seed_curve in seed_curves.groupby("seed"):
        if np.isfinite(seed_curve["eval_loss"]).any():
            _, seed_min, seed_loss = _regret(seed_curve, hparam, x)
            if seed_loss is not None and np.isfinite(seed_loss):
                regrets.append(seed_loss - seed_min)
    note = ("outside the swept grid: widen the sweep" if loss is None
            else "diverged at the transferred value" if not np.isfinite(loss)
            else "one seed: no interval" if len(regrets) < 2 else "")
    regret = loss - minimum if loss is not None and np.isfinite(loss) else None
    return Regret(hparam=hparam, parametrization=parametrization, width=width, transferred=transferred,
                  source=source, optimum=float(2.0**vertex), optimum_loss=minimum,
                  loss=None if regret is None else loss, regret=regret,
                  regret_pct=None if regret is None else 100 * regret / minimum, ci=t_interval(regrets),
                  n_seeds=len(regrets), note=note, axis=axis, at=at)


def _swept(table: pd.DataFrame, phase: str) -> list[str]:
    rows = table[table["phase"] == phase]
    return sorted(rows["swept"].fillna("lr").unique(), key=lambda h: (h != "lr", h)) if "swept" in rows else ["lr"]


def transfer_regret(table: pd.DataFrame, centre: Mapping[str, float], widths: Iterable[int], *,
                    parametrization: str = "mup", proxy_width: int | None = None, phase: str = "validate",
                    hparams: Sequence[str] | None = None) -> list[Regret]:
    """The regret of the transferred hparams at each of `widths` the sweep covers (module docstring).

    `table`'s `phase` rows are the validate sweep; `centre` holds the tuned hparams, the transferred values under
    `parametrization` (the study's own); `widths` are the transferred widths and the base width (those the sweep
    lacks are skipped). The other parametrizations carry their own optimum from `proxy_width` (default: their
    smallest swept width) and are stated at the wider widths only. `hparams`: default every swept one, lr first.
    Returns one `Regret` per (hparam, parametrization, width), in that order, widths increasing.
    """
    out: list[Regret] = []
    wanted = sorted(set(widths))
    for hparam in hparams or _swept(table, phase):
        curves = lr_curves(table, phase, hparam)
        for param in sorted(curves["parametrization"].unique(), key=lambda p: (p != parametrization, p)):
            swept = sorted(curves.loc[curves["parametrization"] == param, "width"].unique())
            if param == parametrization:
                transferred, source, at = float(centre[hparam]), "the tuned centre", [w for w in wanted if w in swept]
            else:
                proxy = proxy_width if proxy_width is not None and proxy_width in swept else int(swept[0])
                own = curves[(curves["parametrization"] == param) & (curves["width"] == proxy)]
                transferred = float(2.0 ** curve_minimum(*_curve(own, hparam))[0])
                source = f"{param}'s own optimum at width {proxy}"
                at = [w for w in wanted if w in swept and w > proxy]
            out += [_one(table, curves, phase, hparam, str(param), int(w), transferred, source) for w in at]
    return out


def said(r: Regret) -> str:
    """One regret: its parametrization, nats, % and interval (or why it has none)."""
    if r.regret is None:
        return f"{r.parametrization} — ({r.note})"
    ci = f" [95 % CI {r.ci[0]:+.3g}, {r.ci[1]:+.3g}]" if r.ci else " (one seed: no interval)"
    return f"{r.parametrization} {r.regret:+.3g} nats ({r.regret_pct:+.2g} %){ci}"


def regret_line(regrets: Sequence[Regret], hparam: str = "lr") -> str | None:
    """What transfer cost, in one line: per width, each parametrization's regret in `hparam` with its interval,
    e.g. "Transfer regret in lr at width 128: mup +0.012 nats (+0.2 %) [95 % CI ...], standard +0.31 nats (+6 %)
    [...]". None when no swept width was transferred to."""
    chosen = [r for r in regrets if r.hparam == hparam and r.axis is None]
    if not chosen:
        return None
    widths = sorted({r.width for r in chosen})
    parts = [f"at width {w}: " + ", ".join(said(r) for r in chosen if r.width == w) for w in widths]
    sources = "; ".join(dict.fromkeys(f"{r.parametrization} carries {r.source}" for r in chosen))
    return f"Transfer regret in {hparam} {'; '.join(parts)} (vs the sweep's interpolated optimum; {sources})."


def base_of(swept: Sequence[int], base: int) -> int:
    """The swept value whose optimum is carried: `base` when swept, else the one nearest it in log2 (the smaller on
    a tie)."""
    if base in swept:
        return base
    return min(swept, key=lambda b: (abs(np.log2(b / base)), b))


def carried_regrets(rows: pd.DataFrame, base: int, axis: Axis, *, phase: str = "validate", hparam: str = "lr"
                    ) -> list[Regret]:
    """The regret of carrying each parametrization's optimal `hparam` at the axis's base value (`base_of` of
    `base`: the tune phase's) unchanged to each other swept value, per width: `rows` are one sweep's along `axis`;
    one `Regret` per (width, parametrization, value), widths and values increasing, the judged parametrization
    first. The carried optimum is the base curve's interpolated one (`curve_minimum`); a parametrization whose
    every value diverged at the base has no optimum to carry and is left out."""
    out: list[Regret] = []
    column, judged = axis.column, axis.judged[0]
    for width in sorted(rows["width"].unique()):
        at_width = rows[rows["width"] == width]
        curves = lr_curves(at_width, phase, hparam, column=column)
        seeds = lr_curves(at_width, phase, hparam, by_seed=True, column=column)
        for param in sorted(curves["parametrization"].unique(), key=lambda p: (p != judged, p)):
            own = curves[curves["parametrization"] == param]
            swept = sorted(int(b) for b in own[column].unique())
            source_value = base_of(swept, base)
            source_curve = own[own[column] == source_value]
            if not np.isfinite(source_curve["eval_loss"]).any():
                continue
            carried = float(2.0 ** curve_minimum(*_curve(source_curve, hparam))[0])
            source = f"{param}'s own optimum at {axis.words} {source_value}"
            out += [carried_regret(own[own[column] == b],
                                   seeds[(seeds["parametrization"] == param) & (seeds[column] == b)], hparam,
                                   carried, parametrization=str(param), width=int(width), source=source,
                                   axis=axis.name, at=b) for b in swept if b != source_value]
    return out


def carried_line(regrets: Sequence[Regret], width: int, *, title: str, label: str, words: str) -> str | None:
    """What carrying the base value's lr unchanged along one axis costs at `width`, in one line, e.g. "Batch regret
    in lr at width 64: batch 8: mup +0.004 nats (+0.1 %) [...]; batch 32: ... (vs each batch size's interpolated
    optimum; mup carries mup's own optimum at batch size 16)." (`title` Batch, `label` batch, `words` batch size);
    None without a regret there."""
    chosen = [r for r in regrets if r.width == width]
    if not chosen:
        return None
    sources = "; ".join(dict.fromkeys(f"{r.parametrization} carries {r.source}" for r in chosen))
    return (f"{title} regret in {chosen[0].hparam} at width {width}: "
            f"{'; '.join(f'{label} {r.at}: {said(r)}' for r in chosen)} (vs each {words}'s interpolated optimum; "
            f"{sources}).")
