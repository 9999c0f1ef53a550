"""Distance of each trial's hparams from a centre (PT spec §3.6, eq. 10, reconstructed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from analysis.table import require_columns


def relative_distance(
    table: pd.DataFrame,
    centre: Mapping[str, float],
    hparams: Sequence[str],
    log: bool = False,
) -> pd.Series:
    """D(θ, θ₀) for every row of `table`, indexed like it.

    Args:
        table: rows with one column per hparam.
        centre: the centre θ₀, hparam name → value.
        hparams: the hparams the distance is taken over (the study's space's `HPARAMS`).
        log: False: sqrt(Σ((x - x₀)/x₀)²), the relative distance of eq. 10.
            True: sqrt(Σ(ln x - ln x₀)²), symmetric in up and down moves; needs positive values.

    Returns:
        A float Series named `distance`.
    """
    hparams = list(hparams)
    require_columns(table, hparams, "relative_distance")
    missing = [h for h in hparams if h not in centre]
    if missing:
        raise ValueError(f"centre lacks hparam(s) {missing}; pass a value for each of {hparams}")
    x = table[hparams].astype(float).to_numpy()
    x0 = np.array([float(centre[h]) for h in hparams])
    if log:
        if (x0 <= 0).any() or (x <= 0).any():
            raise ValueError("log=True needs positive hparam values; use log=False for signed hparams")
        terms = np.log(x) - np.log(x0)
    else:
        if (x0 == 0).any():
            zero = [h for h, v in zip(hparams, x0, strict=True) if v == 0]
            raise ValueError(
                f"the relative distance is undefined for centre value 0 of {zero}; drop them from hparams"
            )
        terms = (x - x0) / x0
    return pd.Series(np.sqrt((terms**2).sum(axis=1)), index=table.index, name="distance")
