"""Headless figure plumbing shared by the plotting functions: the Agg backend and save-and-close."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.axes import Axes

matplotlib.use("Agg")  # no display on workers or in CI; figures only ever go to files

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


@contextmanager
def figure(
    path: str | Path, nrows: int = 1, ncols: int = 1, panel: tuple[float, float] = (5.0, 4.0)
) -> Iterator[np.ndarray]:
    """Yield a 2-D array of axes; on exit save the figure as a PNG at `path` and close it."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel[0] * ncols, panel[1] * nrows), squeeze=False)
    try:
        yield axes
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)


def mark_diverged(ax: Axes, x: Sequence[float], **style: object) -> None:
    """Mark diverged runs (no finite loss) as x markers on the top edge of `ax`, at their x positions."""
    if len(x):
        style = {"color": "grey", "label": "diverged", "clip_on": False} | style
        ax.plot(x, [1.0] * len(x), "x", transform=ax.get_xaxis_transform(), **style)
