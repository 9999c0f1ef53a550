"""Where an uncertified centre's better neighbours lie: which hparam directions beat it, and what to do.

Pure: reads the verify phase's rows (their hparam columns) and the centre. A direction is reported when at
least `agree` of the samples that beat the centre moved that hparam the same way; its size is the median
relative change among them.

Before blaming the search, the count of better samples is set against the seed-noise model
(`analysis.certificate.noise_better_rate`): when seed noise alone explains it, the advice says so and names the
verify fields that tell noise from better neighbours instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
from pydantic import BaseModel

from analysis.certificate import noise_better_rate, noise_explains, noise_lead, noise_sd, verify_losses
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
    *,
    alpha: float = 0.05,
) -> NeighbourAdvice:
    """The hparam directions in which the verify samples that beat the centre (by more than `tolerance`) moved.

    Args:
        table: the trial table (its verify rows, with one column per hparam).
        centre: the transferred hparams the samples were drawn around.
        hparams: the searched hparams (frozen ones never move).
        tolerance: the margin a sample beat the centre by (the certificate's `tolerance`).
        agree: the least fraction of better samples moving one way for a direction to be reported.
        alpha: the certificate's alpha: a count within the (1-α) quantile of the seed-noise count is noise's.
    """
    rows = phase_rows(table, "verify")
    require_columns(rows, list(hparams), "neighbour_advice")
    centre_loss, samples = verify_losses(table)
    mean = float(centre_loss.mean())
    better = samples[samples < mean - tolerance].index
    directions = []
    for h in hparams:
        change = rows.loc[better, h].astype(float) / float(centre[h]) - 1.0
        up, down = int((change > 0).sum()), int((change < 0).sum())
        if len(better) and max(up, down) >= agree * len(better):
            directions.append(Direction(hparam=h, median_change=float(np.median(change)), n_up=up, n_down=down))
    directions.sort(key=lambda d: -abs(d.median_change))
    seeds = len(centre_loss)
    std = float(centre_loss.std(ddof=1)) if seeds > 1 else 0.0
    noise = _Noise(tolerance, mean, noise_sd(std, seeds), noise_better_rate(tolerance, std, seeds), len(samples))
    explained = noise_explains(len(better), len(samples), noise.q, alpha, noise_lead(mean, samples, noise.sd))
    text = _text(len(better), len(samples), directions, noise, explained)
    return NeighbourAdvice(n_better=len(better), n_samples=len(samples), directions=directions, text=text)


class _Noise(NamedTuple):
    t: float  # the tolerance
    centre: float  # the centre's mean loss
    sd: float  # the sd of a one-seed sample's difference from the centre's mean (0 when unknown)
    q: float | None  # the chance an equally good sample counts as better
    n: int

    def expected(self) -> str:
        return f"≈{(self.q or 0.0) * self.n:.1f} of {self.n}"


def _noise_text(k: int, noise: _Noise) -> str:
    """Seed noise explains k better samples: say so, and how to tell noise from better neighbours."""
    said = (f"{k} of {noise.n} samples beat the centre, but {noise.expected()} would beat an equally good centre by "
            f"seed noise alone at this tolerance (t = {noise.t:.4g} = {noise.t / noise.sd:.2f}·σ, σ = {noise.sd:.4g}, "
            "the sd of a one-seed sample's difference from the centre's mean): the better samples are not evidence "
            "of a better neighbourhood. To tell them apart, ")
    if noise.t < 2 * noise.sd * (1 - 1e-9):  # below seed_noise's margin (up to rounding)
        relative = 2 * noise.sd / noise.centre
        return (f"{said}raise verify.centre_seeds and set verify.tolerance to a margin above the noise "
                f"(≥ 2·σ = {2 * noise.sd:.4g}: seed_noise, or a relative margin ≥ {relative:.2g}).")
    return (f"{said}raise verify.n_samples (the bound can fall under verify.p only when the noise rate, here "
            f"{noise.q or 0.0:.1%}, is below it).")


def _text(k: int, n: int, directions: list[Direction], noise: _Noise, explained: bool | None) -> str:
    if k == 0:
        return (f"no sample of {n} beat the centre by more than the tolerance; the bound is limited by N alone: "
                "run the full N (verify.n_samples: null)")
    if explained:
        return _noise_text(k, noise)
    if directions:
        moves = "; ".join(f"{'larger' if d.n_up > d.n_down else 'smaller'} {d.hparam} (median {d.median_change:+.0%}, "
                          f"{max(d.n_up, d.n_down)} of {k})" for d in directions)
        where = f"the {k} of {n} samples that beat the centre mostly have {moves}"
    else:
        where = f"the {k} of {n} samples that beat the centre share no direction (noise, or a flat neighbourhood)"
    if explained is None:
        where += (" (the seed noise is unknown with one centre seed or no spread: raise verify.centre_seeds to tell "
                  "it from better neighbours)")
    else:
        where += f"; seed noise alone would make {noise.expected()} equally good samples beat it"
    return f"{where}. What to do: {ADVICE}."
