"""Headless figure plumbing shared by the plotting functions: the Agg backend, save-and-close, and a loss axis
clipped to its informative range.

A loss axis is scaled by the losses that say something: the upper limit is the Tukey fence q3 + 3·IQR of the
finite losses (at least 5% of their median above q3), so one blown-up run (loss 100 among losses of 5) does
not flatten every curve. Points above it are drawn as ^ markers on the top edge with their value; diverged
runs (no finite loss) as x markers there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes

matplotlib.use("Agg")  # no display on workers or in CI; figures only ever go to files

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

FENCE = 3.0  # the upper limit's multiple of the inter-quartile range above q3


@contextmanager
def figure(
    path: str | Path, nrows: int = 1, ncols: int = 1, panel: tuple[float, float] = (5.0, 4.0), sharey: bool = False
) -> Iterator[np.ndarray]:
    """Yield a 2-D array of axes; on exit save the figure as a PNG at `path` and close it."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel[0] * ncols, panel[1] * nrows), squeeze=False,
                             sharey=sharey)
    try:
        yield axes
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)


def mark_diverged(ax: Axes, x: Sequence[float] | npt.NDArray[Any], **style: Any) -> None:
    """Mark diverged runs (no finite loss) as x markers on the top edge of `ax`, at their x positions."""
    if len(x):
        opts: dict[str, Any] = {"color": "grey", "label": "diverged", "clip_on": False, **style}
        ax.plot(x, [1.0] * len(x), "x", transform=ax.get_xaxis_transform(), **opts)


def loss_limits(losses: Sequence[float]) -> tuple[float, float] | None:
    """The informative (low, high) range of a loss axis: the finite losses up to the Tukey fence, padded 5%.
    None when there is no finite loss."""
    values = np.asarray([v for v in losses if np.isfinite(v)], dtype=float)
    if values.size == 0:
        return None
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    fence = q3 + max(FENCE * (q3 - q1), 0.05 * abs(median))
    kept = values[values <= fence]
    lo, hi = float(kept.min()), float(kept.max())
    pad = 0.05 * (hi - lo) or 0.01 * abs(hi) or 0.01
    return lo - pad, hi + pad


def clip_loss_axis(ax: Axes, limits: tuple[float, float] | None, x: npt.ArrayLike, y: npt.ArrayLike,
                   **style: Any) -> None:
    """Set the y-limits to `limits` and mark the points (x, y) above them as ^ markers with their value."""
    if limits is None:
        return
    ax.set_ylim(*limits)
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    above = np.isfinite(ys) & (ys > limits[1])
    if above.any():
        opts: dict[str, Any] = {"color": "grey", "label": "off the scale (value shown)", "clip_on": False, **style}
        ax.plot(xs[above], [1.0] * int(above.sum()), "^", transform=ax.get_xaxis_transform(), **opts)
        for xi, yi in zip(xs[above], ys[above], strict=True):
            ax.annotate(f"{yi:.3g}", (xi, 1.0), xycoords=("data", "axes fraction"), xytext=(0, -10),
                        textcoords="offset points", ha="center", fontsize="x-small", color=opts["color"])
