"""Split-conformal quantiles of nonconformity scores, with the finite-sample rule and its leave-one-out coverage.

Given n exchangeable scores, the ⌈(n + 1)·level⌉-th smallest bounds a new score with probability ≥ `level`
(Vovk et al. 2005; Lei et al. 2018, "Distribution-free predictive inference for regression"). Below
`min_scores(level)` scores (19 at 95 %) that rank exceeds n: the quantile is infinite and no finite interval has the
guarantee, which these functions say by returning None. The coverage of a quantile is measured by leave-one-out:
each score against the quantile of the others, so no score calibrates its own interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["conformal_quantile", "loo_coverage", "min_scores"]


def _rank(n: int, level: float) -> int:
    if not 0 < level < 1:
        raise ValueError(f"the conformal level must lie in (0, 1) (got {level})")
    return math.ceil((n + 1) * level - 1e-9)  # the 1e-9: 20 × 0.95 is 19.000000000000004 in floats


def min_scores(level: float) -> int:
    """The fewest scores whose `level` quantile is finite: the smallest n with ⌈(n + 1)·level⌉ ≤ n."""
    n = 1
    while _rank(n, level) > n:
        n += 1
    return n


def conformal_quantile(scores: Sequence[float], level: float) -> float | None:
    """The ⌈(n + 1)·level⌉-th smallest of `scores`; None with fewer than `min_scores(level)` of them."""
    k = _rank(len(scores), level)
    return None if k > len(scores) else sorted(scores)[k - 1]


def loo_coverage(scores: Sequence[float], level: float) -> int | None:
    """How many of `scores` lie at or below the `level` quantile of the others; None when n − 1 scores are too few
    for a finite quantile."""
    covered = 0
    for i, score in enumerate(scores):
        q = conformal_quantile([s for j, s in enumerate(scores) if j != i], level)
        if q is None:
            return None
        covered += score <= q
    return covered
