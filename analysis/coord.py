"""The coordinate check as numbers: per-activation log-log slopes of rms against width (or depth), a verdict, a plot.

Under μP every hidden activation's rms stays Θ(1) as width grows (slope ≈ 0 in log2-log2), and the
output logits do not grow (slope ≤ 0 up to noise; they may shrink early with a zero-init readout).
The same slopes and verdict judge a depth parametrization (CompleteP) with `axis="depth"`: the table's
`depth` column is the x axis, and each slope is the change of log2(rms) per doubling of depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from pydantic import BaseModel
from scipy import stats

from analysis._figures import figure
from analysis.constants import ATTENTION
from analysis.table import require_columns


def _keys(df: pd.DataFrame) -> list[str]:
    return (["parametrization"] if "parametrization" in df.columns else []) + ["name", "step"]


AXES = ("width", "depth")  # what a coordinate check varies: the x column of its table


def _fit(group: pd.DataFrame, axis: str = "width") -> float:
    """log2-log2 slope of one curve; NaN unless ≥ 2 sizes on `axis` and every rms is finite and positive."""
    rms = group["rms"].to_numpy(dtype=float)
    if group[axis].nunique() < 2 or not bool(np.all(np.isfinite(rms) & (rms > 0))):
        return float("nan")
    return float(np.polyfit(np.log2(group[axis]), np.log2(rms), 1)[0])


def coord_slopes(df: pd.DataFrame, confidence: float = 0.95, axis: str = "width") -> pd.DataFrame:
    """Slope of log2(rms) against log2(`axis`: width, or depth) per (parametrization if present, name, step), with
    a seed interval.

    With a `seed` column each seed is one replicate (its own model at every width): a slope is fitted per seed,
    `slope` is their mean (= the slope of the seeds' mean log2 rms) and `ci_low`/`ci_high` the two-sided Student-t
    interval at `confidence` (NaN with one seed). Without one, rows repeated at a width are averaged and the slope
    has no interval. A non-positive or non-finite rms in any seed (a blow-up, a zero readout) gives a NaN slope,
    which the verdict fails. Returns columns `[parametrization,] name, step, slope, ci_low, ci_high, n_seeds,
    n_widths` (`n_widths`: the sizes on `axis` behind the slope); `attrs["axis"]` is `axis`.
    """
    if axis not in AXES:
        raise ValueError(f"axis={axis!r}: choose one of {list(AXES)}")
    require_columns(df, [axis, "step", "name", "rms"], "coord_slopes")
    if df[axis].nunique() < 2:
        raise ValueError(f"coord_slopes needs at least two {axis}s; run the coordinate check at several {axis}s")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence}: must be in (0, 1), e.g. 0.95")
    keys = _keys(df)
    if "seed" in df.columns:
        curves = df.groupby([*keys, "seed"], as_index=False)[[axis, "rms"]]
        per_seed = curves.apply(lambda g: pd.Series({"slope": _fit(g, axis), "n_widths": g[axis].nunique()}))
    else:
        # numpy's mean keeps a NaN from any repeat, so a repeat that blew up is not averaged away
        means = df.groupby([*keys, axis], as_index=False)["rms"].agg(lambda s: s.to_numpy(dtype=float).mean())
        per_seed = means.groupby(keys, as_index=False)[[axis, "rms"]].apply(
            lambda g: pd.Series({"slope": _fit(g, axis), "n_widths": g[axis].nunique()})
        )
    rows = []
    for key, group in per_seed.groupby(keys):
        s = group["slope"].to_numpy(dtype=float)
        n = len(s)
        mean = float(s.mean())  # NaN if any seed is unfitted
        half = float("nan")
        if n >= 2 and np.isfinite(mean):
            half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * s.std(ddof=1) / np.sqrt(n))
        rows.append((*key, mean, mean - half, mean + half, n, int(group["n_widths"].max())))
    out = pd.DataFrame(rows, columns=[*keys, "slope", "ci_low", "ci_high", "n_seeds", "n_widths"])
    out.attrs["confidence"] = confidence
    out.attrs["axis"] = axis
    return out


class CoordOffence(BaseModel):
    """One (activation, step) whose slope breaks its rule."""

    name: str
    step: int
    slope: float | None  # None where the slope could not be fitted
    ci: tuple[float, float] | None = None  # the seed interval, None without one
    rule: str  # e.g. "|slope| <= 0.2" (hidden) or "slope <= 0.2" (output)


class CoordVerdict(BaseModel):
    """Does every activation keep its scale as width (or depth: `axis`) grows?

    `status` is "pass", "fail" or "inconclusive" (no slope significantly outside its band, but some
    interval too wide to have caught a rule error: run more seeds); `passed` is status == "pass".
    """

    parametrization: str | None  # the parametrization judged; None when the table has no such column
    steps: list[int]
    hidden_tol: float
    output_name: str
    output_max: float
    rule_error: float
    n_judged: int  # (name, step) slopes judged
    n_seeds: int  # fewest seeds behind a judged slope (1: point slopes, no interval)
    max_half_width: float | None  # widest judged interval's half-width; None without intervals
    offending: list[CoordOffence]
    underpowered: list[str]  # "name@step" whose interval is wider than rule_error - band
    status: str
    passed: bool
    verdict: str
    axis: str = "width"  # what the slopes are against: width, or depth (per doubling of either)


def coord_verdict(
    slopes: pd.DataFrame,
    *,
    steps: Sequence[int] = (1, 2, 3),
    hidden_tol: float = 0.2,
    output_name: str = "mlm_logits",
    output_max: float = 0.2,
    parametrization: str = "mup",
    may_vanish: Sequence[str] = (),
    rule_error: float = 0.5,
) -> CoordVerdict:
    """Judge `coord_slopes`' output: hidden |slope| ≤ hidden_tol and output slope ≤ output_max at `steps`.

    With seed intervals a slope fails only when its whole interval lies outside its band, and the verdict is
    conclusive only when every half-width is ≤ rule_error − band, narrow enough to have failed a slope of
    ±rule_error (μP's rules are powers of √d, so a wrong rule leaves at least 1/2). Without intervals the point
    slopes are judged. `output_name` is judged one-sidedly (it may shrink, not grow), and so are names starting with
    a `may_vanish` prefix (slope ≤ hidden_tol: activations μP lets shrink, e.g. logits scaled 1/r whose random
    initial part vanishes as r^-1/2). The early `steps` catch update-size mistakes that init checks miss;
    `parametrization` is the one judged when `slopes` has that column.
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
    if rule_error <= max(hidden_tol, output_max):
        raise ValueError(f"rule_error={rule_error} must exceed the bands ({hidden_tol}, {output_max})")
    slope = judged["slope"]
    has_ci = "ci_low" in judged.columns and bool(judged["ci_low"].notna().any())
    low = judged["ci_low"].where(judged["ci_low"].notna(), slope) if has_ci else slope
    high = judged["ci_high"].where(judged["ci_high"].notna(), slope) if has_ci else slope
    is_out = judged["name"] == output_name
    one_sided = judged["name"].str.startswith(tuple(may_vanish)) if may_vanish else is_out & False
    band = np.where(is_out, output_max, hidden_tol)
    # NaN compares False: an unfitted slope is never "within", so it fails
    grows = ~(low <= band)  # the whole interval above the band (or unfitted)
    shrinks = (high < -band) & ~is_out & ~one_sided
    bad = judged[grows | shrinks]
    half = (high - low) / 2
    weak = judged[(half > rule_error - band) & ~(grows | shrinks)] if has_ci else judged.iloc[:0]
    offending = [
        CoordOffence(
            name=row.name,
            step=int(row.step),
            slope=None if np.isnan(row.slope) else float(row.slope),
            ci=(float(lo), float(hi)) if has_ci and np.isfinite(lo) and np.isfinite(hi) else None,
            rule=_rule(row.name, output_name, output_max, hidden_tol, may_vanish),
        )
        for row, lo, hi in zip(bad.itertuples(index=False), low[bad.index], high[bad.index], strict=True)
    ]
    step_list = ", ".join(str(s) for s in sorted(steps))
    n_seeds = int(judged["n_seeds"].min()) if "n_seeds" in judged.columns else 1
    conf = slopes.attrs.get("confidence")
    how = f"{n_seeds}-seed {conf:.0%} t-intervals" if has_ci and conf else "t-intervals" if has_ci else "point slopes"
    axis = slopes.attrs.get("axis", "width")
    over = "" if axis == "width" else f" over {axis}"  # the width check's sentences stay as they were
    if offending:
        status = "fail"
        worst = max(offending, key=lambda o: np.inf if o.slope is None else abs(o.slope))
        shown = "unfitted" if worst.slope is None else f"{worst.slope:+.3f}"
        if worst.ci is not None:
            shown += f" [{worst.ci[0]:+.3f}, {worst.ci[1]:+.3f}]"
        verdict = (
            f"coordinate check{over} fails: {len(offending)} of {len(judged)} slopes out of bounds "
            f"at steps {step_list} ({how}); "
            f"worst {worst.name} at step {worst.step}: slope {shown} (rule {worst.rule})"
        )
        grown = [o for o in offending if o.name.startswith(ATTENTION) and (o.slope or 0) > 0]
        if grown:
            top = max(grown, key=lambda o: o.slope or 0)
            verdict += (f"; the attention logits grow with width at {top.name.removeprefix(ATTENTION)} (step "
                        f"{top.step}: slope {top.slope:+.3f}): under μP scale them attn_mult · q·k / head_dim, "
                        "not q·k / √head_dim")
    elif len(weak):
        status = "inconclusive"
        w = weak.loc[half[weak.index].idxmax()]
        verdict = (
            f"coordinate check{over} inconclusive: no slope out of bounds at steps {step_list}, but {len(weak)} "
            f"of {len(judged)} intervals ({how}) are wider than ±{rule_error - hidden_tol:g}, too wide to catch "
            f"a rule error (|slope| {rule_error:g}); widest {w['name']} at step {int(w['step'])}: "
            f"slope {w['slope']:+.3f} ± {half[w.name]:.3f}; run more seeds"
        )
    else:
        status = "pass"
        verdict = (
            f"coordinate check{over} passes: every hidden activation has |slope| <= {hidden_tol:g} and "
            f"{output_name} slope <= {output_max:g} at steps {step_list} ({how})"
        )
        if may_vanish:
            verdict += f" ({', '.join(may_vanish)} judged one-sidedly: slope <= {hidden_tol:g})"
    return CoordVerdict(
        parametrization=parametrization if has_param else None,
        steps=sorted(steps),
        hidden_tol=hidden_tol,
        output_name=output_name,
        output_max=output_max,
        rule_error=rule_error,
        n_judged=len(judged),
        n_seeds=n_seeds,
        max_half_width=float(half.max()) if has_ci else None,
        offending=offending,
        underpowered=[f"{row.name}@{int(row.step)}" for row in weak.itertuples(index=False)],
        status=status,
        passed=status == "pass",
        verdict=verdict,
        axis=axis,
    )


def _rule(name: str, output_name: str, output_max: float, hidden_tol: float, may_vanish: Sequence[str]) -> str:
    if name == output_name:
        return f"slope <= {output_max:g}"
    if may_vanish and name.startswith(tuple(may_vanish)):
        return f"slope <= {hidden_tol:g}"
    return f"|slope| <= {hidden_tol:g}"


def plot_coord(df: pd.DataFrame, path: str | Path, axis: str = "width") -> None:
    """Coordinate-check plot in the style of `mup.plot_coord_data`, written as a PNG at `path`.

    One panel per step (one row of panels per parametrization when the column is present);
    x = `axis` (width, or depth) on a log2 axis, y = rms on a log axis, one line per activation name, one legend.
    """
    require_columns(df, [axis, "step", "name", "rms"], "plot_coord")
    params = sorted(df["parametrization"].unique()) if "parametrization" in df.columns else [None]
    steps, names = sorted(df["step"].unique()), sorted(df["name"].unique())
    with figure(path, nrows=len(params), ncols=len(steps), panel=(3.6, 3.2)) as axes:
        for i, param in enumerate(params):
            rows = df if param is None else df[df["parametrization"] == param]
            for j, step in enumerate(steps):
                _coord_panel(axes[i, j], rows[rows["step"] == step], names, axis)
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


def _coord_panel(ax: Axes, rows: pd.DataFrame, names: list[str], axis: str = "width") -> None:
    """One step's panel: mean rms against `axis` per activation, colours fixed by the name's position."""
    colours = matplotlib.colormaps["tab10"]
    means = rows[rows["rms"] > 0].groupby(["name", axis])["rms"].mean()
    for k, name in enumerate(names):
        if name in means.index.get_level_values("name"):
            curve = means.loc[name]
            style = ["-", "--", ":", "-."][(k // 10) % 4]  # tab10 repeats after 10 names: vary the dash
            ax.plot(curve.index, curve.to_numpy(), style, marker="o", ms=3, color=colours(k % 10), label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(axis)
    ax.set_ylabel("rms")
