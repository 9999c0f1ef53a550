"""The study's figures, each written as a PNG to a path the caller gives.

`plot_verify` is the μP-PT paper's Figure 1; `plot_mutransfer` is the μTransfer lr-vs-width plot.
The coordinate-check plot lives beside its numbers in `analysis.coord`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from analysis._figures import figure, mark_diverged
from analysis.certificate import verify_losses
from analysis.distance import relative_distance
from analysis.table import judged_loss, phase_rows
from analysis.transfer import lr_curves, transfer_table

_STAR = {"marker": "*", "s": 220, "color": "red", "zorder": 3, "label": "centre"}


def plot_verify(
    table: pd.DataFrame, centre: Mapping[str, float], hparams: Sequence[str], path: str | Path
) -> None:
    """The verify phase as two panels: loss against relative distance D, and the ranked losses.

    The centre (mean over its seeds) is a red star at D=0 and at its rank among the N samples;
    diverged samples are x markers along the top of the left panel and left out of the ranking.
    """
    centre_runs, samples = verify_losses(table)
    centre_loss = float(centre_runs.mean())
    distance = relative_distance(phase_rows(table, "verify").loc[samples.index], centre, hparams)
    finite = np.isfinite(samples)
    ranked = np.sort(samples[finite].to_numpy())
    rank = 1 + int((ranked < centre_loss).sum())
    positions = np.arange(1, len(ranked) + 1) + (np.arange(1, len(ranked) + 1) >= rank)
    with figure(path, ncols=2) as axes:
        ax = axes[0, 0]
        ax.scatter(distance[finite], samples[finite], s=14, label=f"samples (N={len(samples)})")
        mark_diverged(ax, distance[~finite].to_numpy())
        ax.scatter([0.0], [centre_loss], **_STAR)
        ax.set(xlabel="relative distance D from the centre", ylabel="eval loss", title="loss vs distance")
        ax.legend(fontsize="small")
        ax = axes[0, 1]
        ax.plot(positions, ranked, "o-", ms=3, lw=0.8, label="samples, ranked")
        ax.scatter([rank], [centre_loss], **_STAR)
        ax.axhline(centre_loss, color="red", lw=0.8, ls="--")
        dropped = f"; {int((~finite).sum())} diverged not shown" if (~finite).any() else ""
        ax.set(xlabel="rank", ylabel="eval loss", title=f"centre ranks {rank} of {len(ranked) + 1}{dropped}")
        ax.legend(fontsize="small")


def plot_transfer(table: pd.DataFrame, path: str | Path) -> None:
    """The transfer phase's eval loss against width (log2 axis), with seed-std error bars."""
    summary = transfer_table(table)
    with figure(path) as axes:
        ax = axes[0, 0]
        ax.errorbar(
            summary["width"],
            summary["eval_loss_mean"],
            yerr=summary["eval_loss_std"].fillna(0.0),
            fmt="o-",
            capsize=3,
            label="mean ± std over seeds",
        )
        mark_diverged(ax, summary.loc[summary["n_diverged"] > 0, "width"].to_numpy(), label="a seed diverged")
        ax.set_xscale("log", base=2)
        labels = [f"{w}\n{p / 1e6:.3g}M" for w, p in zip(summary["width"], summary["params"], strict=True)]
        ax.set_xticks(summary["width"], labels)
        ax.minorticks_off()
        ax.set(xlabel="width (params)", ylabel="eval loss", title="transfer: the tuned hparams at each width")
        ax.legend(fontsize="small")


def plot_tune_history(table: pd.DataFrame, path: str | Path) -> None:
    """The tune phase's eval loss per trial in completion order (the table's row order), and the best so far.

    Trials stopped early by the scheduler are hollow markers, diverged trials x markers at the top.
    """
    rows = phase_rows(table, "tune").reset_index(drop=True)
    loss = judged_loss(rows)  # indexed by completion position 0..n-1, failed trials left out
    finite = loss[np.isfinite(loss)]
    stopped = (rows.loc[finite.index, "status"] == "stopped").to_numpy()
    best = loss.where(np.isfinite(loss)).reindex(rows.index).cummin().ffill()
    with figure(path, panel=(7.0, 4.0)) as axes:
        ax = axes[0, 0]
        ax.scatter(finite.index[~stopped] + 1, finite[~stopped], s=16, label="completed")
        hollow = {"facecolors": "none", "edgecolors": "grey", "label": "stopped early"}
        ax.scatter(finite.index[stopped] + 1, finite[stopped], s=16, **hollow)
        mark_diverged(ax, loss.index[np.isinf(loss)] + 1)
        ax.plot(rows.index + 1, best, drawstyle="steps-post", color="black", lw=1, label="best so far")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="trial (completion order)", ylabel="eval loss", title=f"tune: {len(rows)} trials")
        ax.legend(fontsize="small")


def plot_mutransfer(table: pd.DataFrame, path: str | Path) -> None:
    """The validate sweep: eval loss against log2(lr), one curve per width, one panel per parametrization.

    Each curve's optimum is a filled star; diverged points are x markers at the top.
    """
    curves = lr_curves(table)
    present = curves["parametrization"].unique().tolist()
    params = [p for p in ("mup", "standard") if p in present] + sorted(set(present) - {"mup", "standard"})
    widths = sorted(curves["width"].unique())
    colours = matplotlib.colormaps["viridis"](np.linspace(0.0, 0.9, len(widths)))
    with figure(path, ncols=len(params)) as axes:
        for ax, param in zip(axes[0], params, strict=True):
            for colour, width in zip(colours, widths, strict=True):
                curve = curves[(curves["parametrization"] == param) & (curves["width"] == width)]
                ok = np.isfinite(curve["eval_loss"])
                x = np.log2(curve["lr"])
                ax.plot(x[ok], curve["eval_loss"][ok], "o-", ms=3, color=colour, label=f"width {width}")
                if ok.any():
                    best = curve["eval_loss"][ok].idxmin()
                    ax.scatter(
                        [x[best]], [curve["eval_loss"][best]], marker="*", s=120, color=colour, zorder=3
                    )
                mark_diverged(ax, x[~ok].to_numpy(), color=colour, label=None)
            ax.set(xlabel="log2(lr)", ylabel="eval loss (mean over seeds)", title=param)
            ax.legend(fontsize="small")
