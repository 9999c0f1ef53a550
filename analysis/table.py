"""The trial table's vocabulary and the few helpers every analysis shares.

The table itself is documented in `analysis/__init__.py`.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from analysis.constants import LOSS_STATUSES, STATUSES, TrialStatus

__all__ = ["LOSS_STATUSES", "STATUSES", "TrialStatus", "judged_loss", "loss_spread", "phase_rows",
           "require_columns"]


def require_columns(table: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    """Raise a `ValueError` naming the columns `what` needs and `table` lacks."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(
            f"{what} needs column(s) {missing}, which the table lacks (it has {list(table.columns)}); "
            "build it in the trial-table shape documented in analysis/__init__.py"
        )


def phase_rows(table: pd.DataFrame, phase: str) -> pd.DataFrame:
    """The rows of one phase, renumbered 0..n-1; a `ValueError` naming the phases present if none."""
    require_columns(table, ["phase"], f"the {phase} analysis")
    rows = table[table["phase"] == phase].reset_index(drop=True)
    if rows.empty:
        present = sorted(table["phase"].dropna().unique().tolist())
        raise ValueError(
            f"the table has no rows with phase={phase!r} (phases present: {present}); "
            f"run the {phase} phase first or pass the table that holds it"
        )
    return rows


def judged_loss(rows: pd.DataFrame) -> pd.Series:
    """Each run's loss for judging: `failed` runs dropped, diverged runs +inf.

    A run counts as diverged when its status is `diverged` or its `eval_loss` is not finite;
    `failed` runs (crashes of the infrastructure) say nothing about the hparams and are left out.
    The result keeps the table's index.
    """
    require_columns(rows, ["status", "eval_loss"], "judging runs by loss")
    kept = rows[rows["status"] != TrialStatus.FAILED]
    loss = kept["eval_loss"].astype(float)
    diverged = (kept["status"] == TrialStatus.DIVERGED) | ~np.isfinite(loss)
    return loss.where(~diverged, np.inf)


def loss_spread(mean: float, std: float) -> str:
    """A loss over seeds as text: `mean ± std`, `mean` alone with one seed (no std), `—` with none."""
    if not np.isfinite(mean):
        return "—"
    return f"{mean:.4f} ± {std:.4f}" if np.isfinite(std) else f"{mean:.4f}"
