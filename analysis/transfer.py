"""The transfer phase's per-width summary and the validate phase's lr-drift verdict (μTransfer evidence)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel

from analysis.table import TrialStatus, judged_loss, phase_rows, require_columns


def transfer_table(table: pd.DataFrame, phase: str | None = "transfer") -> pd.DataFrame:
    """One row per width: the transferred hparams' loss over seeds and what the runs cost.

    Args:
        table: the trial table.
        phase: the phase whose rows are summarised; None summarises every row.

    Returns:
        Columns `width, params, eval_loss_mean, eval_loss_std, n_seeds, tokens, wall_time_s,
        n_diverged, n_failed`, sorted by width. Loss statistics, tokens and wall time are over the
        runs with a finite eval loss (`n_seeds` of them; std with ddof=1, NaN for one seed).
    """
    rows = table.reset_index(drop=True) if phase is None else phase_rows(table, phase)
    require_columns(
        rows, ["width", "params", "tokens", "wall_time_s", "status", "eval_loss"], "transfer_table"
    )
    loss = judged_loss(rows)
    done = rows.loc[loss.index[np.isfinite(loss)]]
    by_width = done.groupby("width")
    out = pd.DataFrame(
        {
            "params": rows.groupby("width")["params"].max(),
            "eval_loss_mean": by_width["eval_loss"].mean(),
            "eval_loss_std": by_width["eval_loss"].std(ddof=1),
            "n_seeds": by_width.size(),
            "tokens": by_width["tokens"].mean(),
            "wall_time_s": by_width["wall_time_s"].mean(),
            "n_diverged": np.isinf(loss).groupby(rows.loc[loss.index, "width"]).sum(),
            "n_failed": (rows["status"] == TrialStatus.FAILED).groupby(rows["width"]).sum(),
        }
    )
    counts = ["n_seeds", "n_diverged", "n_failed"]
    out[counts] = out[counts].fillna(0).astype(int)
    return out.sort_index().rename_axis("width").reset_index()


def lr_curves(table: pd.DataFrame, phase: str = "validate") -> pd.DataFrame:
    """The lr sweep's loss per (parametrization, width, lr), averaged over seeds.

    Returns:
        Columns `parametrization, width, lr, eval_loss, n_seeds, n_diverged`; `eval_loss` is +inf
        where any seed diverged (failed runs are left out).
    """
    rows = phase_rows(table, phase)
    require_columns(rows, ["parametrization", "width", "lr"], "the lr sweep")
    loss = judged_loss(rows)
    keys = rows.loc[loss.index, ["parametrization", "width", "lr"]]
    grouped = loss.groupby([keys[c] for c in keys.columns])
    out = pd.DataFrame(
        {
            "eval_loss": grouped.mean(),
            "n_seeds": grouped.size(),
            "n_diverged": grouped.agg(lambda s: np.isinf(s).sum()),
        }
    )
    return out.reset_index().sort_values(["parametrization", "width", "lr"], ignore_index=True)


class LROptimum(BaseModel):
    """The best lr of the sweep at one (parametrization, width)."""

    parametrization: str
    width: int
    lr: float
    log2_lr: float
    eval_loss: float  # mean over seeds
    at_grid_edge: bool  # the smallest or largest lr swept: the true optimum may lie outside the grid
    log2_lr_interp: float | None = None  # the vertex of the parabola through the best lr and its neighbours (log2 lr)
    lr_interp: float | None = None  # 2 ** log2_lr_interp: the optimum the drift is fitted to (None: older states)


class LRDrift(BaseModel):
    """The validate phase's verdict: does the optimal lr stay put as width grows under μP?"""

    optima: list[LROptimum]
    drift: dict[str, float]  # per parametrization: slope of the interpolated optimal log2(lr) vs log2(width)
    mup_drift: float
    standard_drift: float | None  # None when the sweep has no standard runs
    threshold: float  # passes when |mup_drift| <= threshold
    passed: bool
    verdict: str


def interpolate_optimum(log2_lrs: np.ndarray, losses: np.ndarray, best: int) -> float:
    """The optimum in log2(lr): the vertex of the parabola through grid point `best` and its two neighbours.

    The grid point itself when it sits on the grid's edge, a neighbour diverged (no finite loss) or the three
    points are not convex; the vertex is kept between the two neighbours.
    """
    if best == 0 or best == len(log2_lrs) - 1:
        return float(log2_lrs[best])
    x, y = log2_lrs[best - 1 : best + 2], losses[best - 1 : best + 2]
    if not np.isfinite(y).all():
        return float(log2_lrs[best])
    a, b, _ = np.polyfit(x, y, 2)
    if a <= 0:
        return float(log2_lrs[best])
    return float(np.clip(-b / (2 * a), x[0], x[2]))


def lr_optima(curves: pd.DataFrame) -> list[LROptimum]:
    """The lowest-loss lr per (parametrization, width) of `lr_curves`' output (ties go to the smaller lr),
    with the optimum interpolated in log2(lr) by `interpolate_optimum`."""
    optima = []
    for (param, width), curve in curves.groupby(["parametrization", "width"]):
        if np.isinf(curve["eval_loss"]).all():
            raise ValueError(
                f"every lr diverged for {param} at width {width}: "
                "add smaller learning rates to the validate sweep"
            )
        curve = curve.sort_values("lr")
        best = curve.loc[curve["eval_loss"].idxmin()]
        position = int(np.flatnonzero(curve.index == best.name)[0])
        interp = interpolate_optimum(np.log2(curve["lr"].to_numpy()), curve["eval_loss"].to_numpy(), position)
        optima.append(
            LROptimum(
                parametrization=str(param),
                width=int(width),
                lr=float(best["lr"]),
                log2_lr=float(np.log2(best["lr"])),
                eval_loss=float(best["eval_loss"]),
                at_grid_edge=bool(best["lr"] in (curve["lr"].min(), curve["lr"].max())),
                log2_lr_interp=interp,
                lr_interp=float(2.0**interp),
            )
        )
    return optima


def lr_drift(table: pd.DataFrame, *, threshold: float = 0.5, phase: str = "validate") -> LRDrift:
    """Fit the drift of the optimal log2(lr) per doubling of width, per parametrization.

    Args:
        table: the trial table; the rows of `phase` form an lr sweep over widths, seeds and
            parametrizations (`mup` required, `standard` reported beside it).
        threshold: the largest |drift| of `mup` that passes, in log2(lr) per doubling of width.
        phase: the phase holding the sweep.
    """
    optima = lr_optima(lr_curves(table, phase))
    frame = pd.DataFrame([o.model_dump() for o in optima])
    drift = {}
    for param, rows in frame.groupby("parametrization"):
        if rows["width"].nunique() < 2:
            raise ValueError(
                "lr_drift needs at least two widths per parametrization "
                f"({param} has {rows['width'].tolist()}); "
                "add a width to the validate sweep"
            )
        drift[str(param)] = float(np.polyfit(np.log2(rows["width"]), rows["log2_lr_interp"], 1)[0])
    if "mup" not in drift:
        raise ValueError(f"the validate sweep has no mup runs (parametrizations: {sorted(drift)}); add them")
    passed = abs(drift["mup"]) <= threshold
    verdict = (
        f"mup's optimal lr drifts {drift['mup']:+.2f} log2(lr) per doubling of width "
        f"(optimum interpolated in log lr; |drift| {'≤' if passed else '>'} {threshold:g}: "
        f"{'pass' if passed else 'fail'})"
    )
    if "standard" in drift:
        verdict += f"; standard drifts {drift['standard']:+.2f}"
    edges = [f"{o.parametrization}@{o.width}" for o in optima if o.at_grid_edge]
    if edges:
        verdict += f"; optimum at the edge of the lr grid for {', '.join(edges)}: widen the sweep there"
    return LRDrift(
        optima=optima,
        drift=drift,
        mup_drift=drift["mup"],
        standard_drift=drift.get("standard"),
        threshold=threshold,
        passed=passed,
        verdict=verdict,
    )
