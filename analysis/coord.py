"""The μP coordinate check as numbers: per-activation log-log slopes of rms against width, a verdict, a plot.

Under μP every hidden activation's rms stays Θ(1) as width grows (slope ≈ 0 in log2-log2), and the
output logits do not grow (slope ≤ 0 up to noise; they may shrink early with a zero-init readout).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from pydantic import BaseModel

from analysis._figures import figure
from analysis.table import require_columns


def _keys(df: pd.DataFrame) -> list[str]:
    return (["parametrization"] if "parametrization" in df.columns else []) + ["name", "step"]


def coord_slopes(df: pd.DataFrame) -> pd.DataFrame:
    """Least-squares slope of log2(rms) against log2(width) per (parametrization if present, name, step).

    Rows repeated at one width (several seeds) are averaged first. A group with a non-positive or
    non-finite (inf or NaN) rms, i.e. a blow-up or an exactly zero readout, gets a NaN slope,
    which the verdict fails.

    Returns:
        Columns `[parametrization,] name, step, slope, n_widths`.
    """
    require_columns(df, ["width", "step", "name", "rms"], "coord_slopes")
    if df["width"].nunique() < 2:
        raise ValueError("coord_slopes needs at least two widths; run the coordinate check at several widths")
    keys = _keys(df)
    # numpy's mean keeps a NaN from any seed, so a seed that blew up is not averaged away
    means = df.groupby([*keys, "width"], as_index=False)["rms"].agg(lambda s: s.to_numpy(dtype=float).mean())
    rows = []
    for key, group in means.groupby(keys):
        rms = group["rms"].to_numpy(dtype=float)
        fit = group["width"].nunique() >= 2 and bool(np.all(np.isfinite(rms) & (rms > 0)))
        slope = float(np.polyfit(np.log2(group["width"]), np.log2(rms), 1)[0]) if fit else float("nan")
        rows.append((*key, slope, group["width"].nunique()))
    return pd.DataFrame(rows, columns=[*keys, "slope", "n_widths"])


class CoordOffence(BaseModel):
    """One (activation, step) whose slope breaks its rule."""

    name: str
    step: int
    slope: float | None  # None where the slope could not be fitted
    rule: str  # e.g. "|slope| <= 0.2" (hidden) or "slope <= 0.2" (output)


class CoordVerdict(BaseModel):
    """Does every activation keep its scale as width grows?"""

    parametrization: str | None  # the parametrization judged; None when the table has no such column
    steps: list[int]
    hidden_tol: float
    output_name: str
    output_max: float
    n_judged: int  # (name, step) slopes judged
    offending: list[CoordOffence]
    passed: bool
    verdict: str


def coord_verdict(
    slopes: pd.DataFrame,
    *,
    steps: Sequence[int] = (1, 2, 3),
    hidden_tol: float = 0.2,
    output_name: str = "mlm_logits",
    output_max: float = 0.2,
    parametrization: str = "mup",
    may_vanish: Sequence[str] = (),
) -> CoordVerdict:
    """Judge `coord_slopes`' output: hidden |slope| ≤ hidden_tol and output slope ≤ output_max at `steps`.

    Args:
        slopes: the output of `coord_slopes`.
        steps: the steps judged (early steps catch update-size mistakes that init checks miss).
        hidden_tol: the largest |slope| allowed for every activation except the output.
        output_name: the output activation's name, judged one-sidedly.
        output_max: the largest slope allowed for the output (it may shrink, not grow).
        parametrization: the parametrization judged when `slopes` has that column.
        may_vanish: name prefixes judged one-sidedly like the output (slope <= hidden_tol): activations
            that μP lets shrink with width, e.g. attention-like logits scaled 1/r whose random
            initial part vanishes as r^-1/2 when r grows with width.
    """
    judged = slopes[slopes["step"].isin(steps)]
    has_param = "parametrization" in slopes.columns
    if has_param:
        judged = judged[judged["parametrization"] == parametrization]
        if judged.empty:
            present = sorted(slopes["parametrization"].unique().tolist())
            raise ValueError(
                f"no {parametrization!r} rows at steps {list(steps)} (parametrizations: {present})"
            )
    missing = sorted(set(steps) - set(judged["step"]))
    if missing:
        raise ValueError(
            f"steps {missing} are not in the coordinate table "
            f"(steps: {sorted(slopes['step'].unique().tolist())}); "
            "pass steps= or run the check for more steps"
        )
    if output_name not in set(judged["name"]):
        raise ValueError(
            f"output {output_name!r} is not among the activations "
            f"{sorted(judged['name'].unique().tolist())}; "
            "pass output_name="
        )
    is_out = judged["name"] == output_name
    one_sided = judged["name"].str.startswith(tuple(may_vanish)) if may_vanish else is_out & False
    hidden_ok = judged["slope"].abs() <= hidden_tol  # NaN compares False: an unfitted slope fails
    hidden_ok = hidden_ok | (one_sided & (judged["slope"] <= hidden_tol))
    bad = judged[(~is_out & ~hidden_ok) | (is_out & ~(judged["slope"] <= output_max))]
    offending = [
        CoordOffence(
            name=row.name,
            step=int(row.step),
            slope=None if np.isnan(row.slope) else float(row.slope),
            rule=f"slope <= {output_max:g}" if row.name == output_name else f"|slope| <= {hidden_tol:g}",
        )
        for row in bad.itertuples(index=False)
    ]
    step_list = ", ".join(str(s) for s in sorted(steps))
    if offending:
        worst = max(offending, key=lambda o: np.inf if o.slope is None else abs(o.slope))
        shown = "unfitted" if worst.slope is None else f"{worst.slope:+.3f}"
        verdict = (
            f"coordinate check fails: {len(offending)} of {len(judged)} slopes out of bounds "
            f"at steps {step_list}; "
            f"worst {worst.name} at step {worst.step}: slope {shown} (rule {worst.rule})"
        )
    else:
        verdict = (
            f"coordinate check passes: every hidden activation has |slope| <= {hidden_tol:g} and "
            f"{output_name} slope <= {output_max:g} at steps {step_list}"
        )
        if may_vanish:
            verdict += f" ({', '.join(may_vanish)} judged one-sidedly: slope <= {hidden_tol:g})"
    return CoordVerdict(
        parametrization=parametrization if has_param else None,
        steps=sorted(steps),
        hidden_tol=hidden_tol,
        output_name=output_name,
        output_max=output_max,
        n_judged=len(judged),
        offending=offending,
        passed=not offending,
        verdict=verdict,
    )


def plot_coord(df: pd.DataFrame, path: str | Path) -> None:
    """Coordinate-check plot in the style of `mup.plot_coord_data`, written as a PNG at `path`.

    One panel per step (one row of panels per parametrization when the column is present);
    x = width on a log2 axis, y = rms on a log axis, one line per activation name, one legend.
    """
    require_columns(df, ["width", "step", "name", "rms"], "plot_coord")
    params = sorted(df["parametrization"].unique()) if "parametrization" in df.columns else [None]
    steps, names = sorted(df["step"].unique()), sorted(df["name"].unique())
    with figure(path, nrows=len(params), ncols=len(steps), panel=(3.6, 3.2)) as axes:
        for i, param in enumerate(params):
            rows = df if param is None else df[df["parametrization"] == param]
            for j, step in enumerate(steps):
                _coord_panel(axes[i, j], rows[rows["step"] == step], names)
                axes[i, j].set_title(f"{param} · step {step}" if param else f"step {step}")
        legend: dict[str, object] = {}
        for ax in axes.flat:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                legend.setdefault(label, handle)
        axes[0, 0].figure.legend(
            list(legend.values()),
            list(legend),
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            fontsize="small",
        )


def _coord_panel(ax: Axes, rows: pd.DataFrame, names: list[str]) -> None:
    """One step's panel: mean rms against width per activation, colours fixed by the name's position."""
    colours = matplotlib.colormaps["tab10"]
    means = rows[rows["rms"] > 0].groupby(["name", "width"])["rms"].mean()
    for k, name in enumerate(names):
        if name in means.index.get_level_values("name"):
            curve = means.loc[name]
            style = ["-", "--", ":", "-."][(k // 10) % 4]  # tab10 repeats after 10 names: vary the dash
            ax.plot(curve.index, curve.to_numpy(), style, marker="o", ms=3, color=colours(k % 10), label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("width")
    ax.set_ylabel("rms")
