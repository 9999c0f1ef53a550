"""The compare study's judgement: eval loss per family and parameter budget, as a table and as the
μP-PT paper's Figure 2 (eval loss against parameters) beside eval loss against training FLOPs.

The input is the compare phase's trial table: the trial-table columns (`analysis/__init__.py`) plus
`family`, `budget` (the requested parameter count), `role` (`transferred` or `tuned`) and `train_flops`
(computed from the shapes, `studies.budget`); `params` is the model's own count.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from analysis._figures import figure
from analysis.table import TrialStatus, judged_loss, phase_rows, require_columns

COLUMNS = ("family", "budget", "width", "params", "train_flops", "seed", "status", "eval_loss")


def compare_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (family, budget): width, params, FLOPs, tokens, seeds, eval loss mean/std/min/max, rank.

    Diverged and failed seeds are counted, not averaged in (`n_diverged`, `n_failed`). `rank` orders the
    families within a budget by mean eval loss (1 = lowest; families with no finished seed rank last).
    """
    rows = phase_rows(table, "compare")
    require_columns(rows, COLUMNS, "compare_table")
    out = []
    for (family, budget), group in rows.groupby(["family", "budget"], sort=False):
        loss = judged_loss(group)
        ok = loss[np.isfinite(loss)]
        first = group.iloc[0]
        out.append({"family": family, "budget": float(budget), "role": first.get("role", ""),
                    "width": int(first["width"]), "params": _int(group["params"]),
                    "train_flops": float(first["train_flops"]), "tokens": _int(group.get("tokens")),
                    "n_seeds": len(ok), "n_diverged": int(np.isinf(loss).sum()),
                    "n_failed": int((group["status"] == TrialStatus.FAILED).sum()),
                    "eval_loss_mean": float(ok.mean()) if len(ok) else np.nan,
                    "eval_loss_std": float(ok.std(ddof=1)) if len(ok) > 1 else np.nan,
                    "eval_loss_min": float(ok.min()) if len(ok) else np.nan,
                    "eval_loss_max": float(ok.max()) if len(ok) else np.nan})
    summary = pd.DataFrame(out)
    summary["rank"] = (summary.groupby("budget")["eval_loss_mean"].rank(method="min", na_option="bottom")
                       .astype(int))
    return summary.sort_values(["budget", "rank", "family"], kind="stable").reset_index(drop=True)


def _int(values: pd.Series | None) -> int | None:
    if values is None:
        return None
    finite = pd.to_numeric(values, errors="coerce").dropna()
    return int(finite.iloc[0]) if len(finite) else None


def plot_compare(table: pd.DataFrame, path: str | Path) -> None:
    """Two panels: mean eval loss (± seed std) against parameters and against training FLOPs, one line per
    family (log x axes). Budgets where a family has no finished seed are left out of its line."""
    summary = compare_table(table)
    families = list(dict.fromkeys(summary["family"]))
    colours = matplotlib.colormaps["tab10"]
    with figure(path, ncols=2) as axes:
        for ax, x, label in ((axes[0, 0], "params", "parameters"), (axes[0, 1], "train_flops", "training FLOPs")):
            for k, family in enumerate(families):
                rows = summary[(summary["family"] == family) & summary["eval_loss_mean"].notna()]
                rows = rows.sort_values(x)
                role = rows["role"].iloc[0] if len(rows) else ""
                ax.errorbar(rows[x].astype(float), rows["eval_loss_mean"], yerr=rows["eval_loss_std"].fillna(0.0),
                            fmt="o-", capsize=3, color=colours(k % 10), label=f"{family} ({role})" if role else family)
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # labelled within a decade
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}".replace("e+0", "e").replace("e+", "e")))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set(xlabel=label, ylabel="eval loss (mean ± std over seeds)", title=f"eval loss vs {label}")
            ax.legend(fontsize="small")
