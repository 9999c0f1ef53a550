"""Where an uncertified centre's better neighbours lie: which hparam directions beat it, and what to do.

Pure: reads the verify phase's rows (their hparam columns) and the centre. A direction is reported when at
least `agree` of the samples that beat the centre moved that hparam the same way; its size is the median
relative change among them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from pydantic import BaseModel

from analysis.certificate import verify_losses
from analysis.table import phase_rows, require_columns

ADVICE = ("the tuned point is not the optimum of its neighbourhood at this width: give the tune phase more "
          "trials (tune.num_trials) or train the proxy longer (train.steps / tune.steps), then run the study "
          "again; a direction that persists after that is the transfer's, not the search's")


class Direction(BaseModel):
    """One hparam's move among the samples that beat the centre."""

    hparam: str
    median_change: float  # median of sample/centre - 1 among the better samples
    n_up: int  # better samples with the hparam above the centre
    n_down: int


class NeighbourAdvice(BaseModel):
    n_better: int
    n_samples: int
    directions: list[Direction]  # consistent directions only, largest |median_change| first
    text: str


def neighbour_advice(
    table: pd.DataFrame,
    centre: Mapping[str, float],
    hparams: Sequence[str],
    tolerance: float,
    agree: float = 0.75,
) -> NeighbourAdvice:
    """The hparam directions in which the verify samples that beat the centre (by more than `tolerance`) moved.

    Args:
        table: the trial table (its verify rows, with one column per hparam).
        centre: the transferred hparams the samples were drawn around.
        hparams: the searched hparams (frozen ones never move).
        tolerance: the margin a sample beat the centre by (the certificate's `tolerance`).
        agree: the least fraction of better samples moving one way for a direction to be reported.
    """
    rows = phase_rows(table, "verify")
    require_columns(rows, list(hparams), "neighbour_advice")
    centre_loss, samples = verify_losses(table)
    better = samples[samples < float(centre_loss.mean()) - tolerance].index
    directions = []
    for h in hparams:
        change = rows.loc[better, h].astype(float) / float(centre[h]) - 1.0
        up, down = int((change > 0).sum()), int((change < 0).sum())
        if len(better) and max(up, down) >= agree * len(better):
            directions.append(Direction(hparam=h, median_change=float(np.median(change)), n_up=up, n_down=down))
    directions.sort(key=lambda d: -abs(d.median_change))
    return NeighbourAdvice(n_better=len(better), n_samples=len(samples), directions=directions,
                           text=_text(len(better), len(samples), directions))


def _text(k: int, n: int, directions: list[Direction]) -> str:
    if k == 0:
        return (f"no sample of {n} beat the centre by more than the tolerance; the bound is limited by N alone: "
                "run the full N (verify.n_samples: null)")
    if directions:
        moves = "; ".join(f"{'larger' if d.n_up > d.n_down else 'smaller'} {d.hparam} (median {d.median_change:+.0%}, "
                          f"{max(d.n_up, d.n_down)} of {k})" for d in directions)
        where = f"the {k} of {n} samples that beat the centre mostly have {moves}"
    else:
        where = f"the {k} of {n} samples that beat the centre share no direction (noise, or a flat neighbourhood)"
    return f"{where}. What to do: {ADVICE}."
