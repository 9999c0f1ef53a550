"""The study's figures, each written as a PNG to a path the caller gives.

`plot_mutransfer` (the lr alignment: one panel per parametrization, one curve per width, shared axes) is the
report's headline figure, `plot_sweep` the same along another sweep's axis (training steps, depth, batch size,
context) at each width; `plot_verify` is the μP-PT paper's Figure 1. Every loss axis is clipped to its
informative range (`analysis._figures.loss_limits`): blown-up points are ^ markers with their value on the
top edge, diverged runs x markers. Each function returns its panels' y-limits.
The coordinate-check plot lives beside its numbers in `analysis.coord`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from analysis._figures import clip_loss_axis, figure, loss_limits, mark_diverged
from analysis.certificate import verify_losses
from analysis.constants import WIDTH, Axis
from analysis.distance import relative_distance
from analysis.table import TrialStatus, judged_loss, phase_rows
from analysis.transfer import LROptimum, lr_curves, lr_optima, transfer_table, tuned_base

Limits = list[tuple[float, float] | None]

_STAR = {"marker": "*", "s": 220, "color": "red", "zorder": 3, "label": "centre"}


def plot_verify(
    table: pd.DataFrame, centre: Mapping[str, float], hparams: Sequence[str], path: str | Path,
    tolerance: float | None = None,
) -> Limits:
    """The verify phase as two panels: loss against relative distance D, and the ranked losses.

    The centre (mean over its seeds) is a red star at D=0 and at its rank among the N samples;
    diverged samples are x markers along the top of the left panel and left out of the ranking. With the
    certificate's `tolerance`, a dotted line at centre − tolerance marks where a sample counts as better.
    """
    centre_runs, samples = verify_losses(table)
    centre_loss = float(centre_runs.mean())
    distance = relative_distance(phase_rows(table, "verify").loc[samples.index], centre, hparams)
    finite = np.isfinite(samples)
    ranked = np.sort(samples[finite].to_numpy())
    rank = 1 + int((ranked < centre_loss).sum())
    positions = np.arange(1, len(ranked) + 1) + (np.arange(1, len(ranked) + 1) >= rank)
    line = None if tolerance is None else centre_loss - tolerance  # better: below it
    limits = loss_limits([*ranked, centre_loss, *([] if line is None else [line])])
    with figure(path, ncols=2) as axes:
        if line is not None:
            for ax in axes[0]:
                ax.axhline(line, color="red", lw=0.8, ls=":", label=f"centre − tolerance ({tolerance:.3g})")
        ax = axes[0, 0]
        ax.scatter(distance[finite], samples[finite], s=14, label=f"samples (N={len(samples)})")
        mark_diverged(ax, distance[~finite].to_numpy())
        clip_loss_axis(ax, limits, distance[finite], samples[finite])
        ax.scatter([0.0], [centre_loss], **_STAR)
        ax.set(xlabel="relative distance D from the centre", ylabel="eval loss", title="loss vs distance")
        ax.legend(fontsize="small")
        ax = axes[0, 1]
        ax.plot(positions, ranked, "o-", ms=3, lw=0.8, label="samples, ranked")
        ax.scatter([rank], [centre_loss], **_STAR)
        ax.axhline(centre_loss, color="red", lw=0.8, ls="--")
        clip_loss_axis(ax, limits, positions, ranked)
        dropped = f"; {int((~finite).sum())} diverged not shown" if (~finite).any() else ""
        below = "" if line is None else f"; {int((ranked < line).sum())} below the tolerance line"
        ax.set(xlabel="rank", ylabel="eval loss",
               title=f"centre ranks {rank} of {len(ranked) + 1}{below}{dropped}")
        ax.legend(fontsize="small")
    return [limits, limits]


def plot_transfer(table: pd.DataFrame, path: str | Path) -> Limits:
    """Eval loss against width (log2 axis): the tuned base width (the best completed tune trial, when the table
    has tune rows) and the transfer widths; seed-std error bars only when a width has more than one seed."""
    summary, base = transfer_table(table), tuned_base(table)
    seeds = bool((summary["n_seeds"] > 1).any())
    losses = [*summary["eval_loss_mean"], *([base["eval_loss"]] if base is not None else [])]
    limits = loss_limits(losses)
    with figure(path) as axes:
        ax = axes[0, 0]
        ax.errorbar(
            summary["width"],
            summary["eval_loss_mean"],
            yerr=summary["eval_loss_std"].fillna(0.0) if seeds else None,
            fmt="o-",
            capsize=3,
            label="transferred: mean ± std over seeds" if seeds else "transferred (one seed per width)",
        )
        widths, params = list(summary["width"]), list(summary["params"])
        if base is not None:
            ax.scatter([base["width"]], [base["eval_loss"]], marker="s", s=50, color="black", zorder=3,
                       label="tuned at the base width")
            if len(summary):
                ax.plot([base["width"], widths[0]], [base["eval_loss"], summary["eval_loss_mean"].iloc[0]],
                        ls=":", color="black", lw=1)
            widths, params = [int(base["width"]), *widths], [base.get("params", np.nan), *params]
        mark_diverged(ax, summary.loc[summary["n_diverged"] > 0, "width"].to_numpy(), label="a seed diverged")
        clip_loss_axis(ax, limits, summary["width"], summary["eval_loss_mean"])
        ax.set_xscale("log", base=2)
        labels = [f"{w}\n{p / 1e6:.3g}M" if p == p else str(w) for w, p in zip(widths, params, strict=True)]
        ax.set_xticks(widths, labels)
        ax.minorticks_off()
        ax.set(xlabel="width (params)", ylabel="eval loss", title="transfer: the tuned hparams at each width")
        ax.legend(fontsize="small")
    return [limits]


def plot_tune_history(table: pd.DataFrame, path: str | Path) -> Limits:
    """The tune phase's eval loss per trial in completion order (the table's row order), and the best so far.

    Trials stopped early by the scheduler are hollow markers, diverged trials x markers at the top.
    """
    rows = phase_rows(table, "tune").reset_index(drop=True)
    loss = judged_loss(rows)  # indexed by completion position 0..n-1, failed trials left out
    finite = loss[np.isfinite(loss)]
    stopped = (rows.loc[finite.index, "status"] == TrialStatus.STOPPED).to_numpy()
    best = loss.where(np.isfinite(loss)).reindex(rows.index).cummin().ffill()
    limits = loss_limits(finite)
    with figure(path, panel=(7.0, 4.0)) as axes:
        ax = axes[0, 0]
        ax.scatter(finite.index[~stopped] + 1, finite[~stopped], s=16, label="completed")
        hollow = {"facecolors": "none", "edgecolors": "grey", "label": "stopped early"}
        ax.scatter(finite.index[stopped] + 1, finite[stopped], s=16, **hollow)
        mark_diverged(ax, loss.index[np.isinf(loss)] + 1)
        ax.plot(rows.index + 1, best, drawstyle="steps-post", color="black", lw=1, label="best so far")
        clip_loss_axis(ax, limits, finite.index + 1, finite)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="trial (completion order)", ylabel="eval loss", title=f"tune: {len(rows)} trials")
        ax.legend(fontsize="small")
    return [limits]


def plot_mutransfer(table: pd.DataFrame, path: str | Path, hparam: str = "lr") -> Limits:
    """The lr alignment (the headline figure): eval loss against log2(lr), one curve per width, one panel per
    parametrization, shared axes. Each curve's optimum, interpolated in log lr, is a star; each panel's title
    gives its drift per doubling of width. `hparam`: the same for another swept hparam."""
    curves = lr_curves(table, hparam=hparam)
    params = _parametrizations(curves)
    optima = _optima(curves, hparam, WIDTH)
    limits = loss_limits(curves["eval_loss"])
    with figure(path, ncols=len(params), sharey=True) as axes:
        for ax, param in zip(axes[0], params, strict=True):
            _sweep_panel(ax, curves, param, "width", "width {}", hparam, optima, limits)
            ax.set(xlabel=f"log2({hparam})", title=f"{param}{_drift_title(optima, param, hparam)}")
        axes[0, 0].set_ylabel("eval loss (mean over seeds)")
    return [limits] * len(params)


def plot_sweep(rows: pd.DataFrame, path: str | Path, axis: Axis, legend: str, hparam: str = "lr", note: str = ""
               ) -> Limits:
    """A sweep along another axis than width (`rows`: its validate rows): eval loss against log2(lr), one curve per
    value of `axis` (labelled `legend.format(value)`), one row of panels per width and one column per
    parametrization, shared loss axis; stars at the interpolated optima, each panel's title its drift per doubling
    (and `note`, e.g. the rules beside it)."""
    if rows.empty:
        raise ValueError(f"the table has no sweep along the {axis.words}")
    widths = sorted(rows["width"].unique())
    params = _parametrizations(rows)
    by_width = {w: lr_curves(rows[rows["width"] == w], hparam=hparam, column=axis.column) for w in widths}
    limits = loss_limits(pd.concat(by_width.values())["eval_loss"])
    with figure(path, nrows=len(widths), ncols=len(params), sharey=True) as axes:
        for row, (width, curves) in zip(axes, by_width.items(), strict=True):
            optima = _optima(curves, hparam, axis)
            for ax, param in zip(row, params, strict=True):
                _sweep_panel(ax, curves, param, axis.column, legend, hparam, optima, limits)
                drift = _drift_title(optima, param, hparam, axis.words).removeprefix(": ")  # its own line
                ax.set(xlabel=f"log2({hparam})")
                ax.set_title(f"{param}, width {width}" + (f"\n{drift}" if drift else "") + (f"\n{note}" if note
                             and drift else ""), fontsize="medium")
            row[0].set_ylabel("eval loss (mean over seeds)")
    return [limits] * (len(params) * len(widths))


def _parametrizations(curves: pd.DataFrame) -> list[str]:
    present = curves["parametrization"].unique().tolist()
    return [p for p in ("mup", "standard") if p in present] + sorted(set(present) - {"mup", "standard"})


def _optima(curves: pd.DataFrame, hparam: str, axis: Axis) -> dict[tuple[str, int], LROptimum]:
    """Each curve's optimum by (parametrization, `axis` value); a curve whose every value diverged has none."""
    finite = curves[np.isfinite(curves["eval_loss"])]
    try:
        optima = lr_optima(curves, hparam, axis)
    except ValueError:  # a curve where every value diverged: no optimum there
        optima = lr_optima(finite, hparam, axis) if not finite.empty else []
    return {(o.parametrization, o.along(axis.name)): o for o in optima}


def _sweep_panel(ax: Axes, curves: pd.DataFrame, param: str, axis: str, legend: str, hparam: str,
                 optima: Mapping[tuple[str, int], LROptimum], limits: tuple[float, float] | None) -> None:
    """One parametrization's curves, one per value of column `axis` (labelled `legend.format(value)`), coloured
    along it: lines through the finite points on the scale, ^ markers above it, x markers where a value diverged,
    stars at the optima."""
    keys = sorted(curves[axis].unique())
    colours = matplotlib.colormaps["viridis"](np.linspace(0.0, 0.9, len(keys)))
    for colour, key in zip(colours, keys, strict=True):
        curve = curves[(curves["parametrization"] == param) & (curves[axis] == key)]
        ok = np.isfinite(curve["eval_loss"])
        x = np.log2(curve[hparam])
        shown = ok & (curve["eval_loss"] <= (limits[1] if limits else np.inf))  # off-scale: a ^ marker
        ax.plot(x[shown], curve["eval_loss"][shown], "o-", ms=3, color=colour, label=legend.format(key))
        best = optima.get((param, int(key)))
        if best is not None and ok.any():
            star = best.log2_lr_interp if best.log2_lr_interp is not None else best.log2_lr
            on_curve = float(np.interp(star, x[ok], curve["eval_loss"][ok]))  # where the curve passes
            ax.scatter([star], [on_curve], marker="*", s=140, color=colour, edgecolors="black",
                       linewidths=0.5, zorder=3)
        mark_diverged(ax, x[~ok].to_numpy(), color=colour, label=None)
        clip_loss_axis(ax, limits, x[ok], curve["eval_loss"][ok], color=colour, label=None)
    ax.legend(fontsize="small", title="★ optimum (interpolated)", title_fontsize="x-small")


def _drift_title(optima: Mapping[tuple[str, int], LROptimum], param: str, hparam: str = "lr", of: str = "") -> str:
    """': optimum drifts +0.00 log2(lr) per doubling' (`of` steps) from the interpolated optima, or '' with fewer
    than 2 curves."""
    points = [(np.log2(w), o.log2_lr_interp if o.log2_lr_interp is not None else o.log2_lr)
              for (p, w), o in sorted(optima.items()) if p == param]
    if len(points) < 2:
        return ""
    x, y = zip(*points, strict=True)
    slope = float(np.polyfit(x, y, 1)[0]) + 0.0
    return f": optimum drifts {slope:+.2f} log2({hparam})/doubling{' of ' + of if of else ''}"
