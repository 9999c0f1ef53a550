"""The transfer phase's per-width summary and width trend, and the validate phase's lr-drift verdict (μTransfer
evidence)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, model_validator

from analysis.constants import WIDTH, Axis
from analysis.table import TrialStatus, judged_loss, phase_rows, require_columns


def transfer_table(table: pd.DataFrame, phase: str | None = "transfer") -> pd.DataFrame:
    """One row per width: the transferred hparams' loss over seeds and what the runs cost.

    `phase`: the phase whose rows are summarised (None: every row). Returns columns `width, params, eval_loss_mean,
    eval_loss_std, n_seeds, tokens, wall_time_s, n_diverged, n_failed`, sorted by width; loss, tokens and wall time
    are over the runs with a finite eval loss (`n_seeds` of them; std with ddof=1, NaN for one seed).
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


def sweep_rows(table: pd.DataFrame, phase: str = "validate", hparam: str = "lr") -> pd.DataFrame:
    """The rows of `phase` that sweep `hparam` (column `swept`; a table without it sweeps only lr)."""
    rows = phase_rows(table, phase)
    swept = rows["swept"].fillna("lr") if "swept" in rows.columns else pd.Series("lr", index=rows.index)
    rows = rows[swept == hparam].reset_index(drop=True)
    if rows.empty:
        raise ValueError(f"the {phase} rows sweep no {hparam!r}: add it to validate.hparams (or validate.lrs)")
    return rows


LEGACY_JUDGED = {"depth": ("completep", "none")}
"""The judged pair of a drift recorded before `LRDrift.judged` (state.json of older studies): by its axis."""


def lr_curves(table: pd.DataFrame, phase: str = "validate", hparam: str = "lr", by_seed: bool = False,
              column: str = "width") -> pd.DataFrame:
    """The sweep of `hparam` (lr by default): loss per (parametrization, `column`, value), averaged over seeds.

    Returns:
        Columns `parametrization, <column>, [seed,] <hparam>, eval_loss, n_seeds, n_diverged`; `eval_loss` is
        +inf where any seed diverged (failed runs are left out). `by_seed`: one curve per seed. `column`: `width`,
        or another axis's (`Axis.column`: pass one width's rows of that sweep).
    """
    rows = sweep_rows(table, phase, hparam)
    columns = ["parametrization", column, *(["seed"] if by_seed else []), hparam]
    require_columns(rows, columns, f"the {hparam} sweep")
    loss = judged_loss(rows)
    keys = rows.loc[loss.index, columns]
    grouped = loss.groupby([keys[c] for c in keys.columns])
    out = pd.DataFrame(
        {
            "eval_loss": grouped.mean(),
            "n_seeds": grouped.size(),
            "n_diverged": grouped.agg(lambda s: np.isinf(s).sum()),
        }
    )
    return out.reset_index().sort_values(columns, ignore_index=True)


class LROptimum(BaseModel):
    """The best value of the sweep at one (parametrization, width): of lr, or of `LRDrift.hparam` (fields keep
    lr's names)."""

    parametrization: str
    width: int
    lr: float
    log2_lr: float
    eval_loss: float  # mean over seeds
    at_grid_edge: bool  # the smallest or largest lr swept: the true optimum may lie outside the grid
    log2_lr_interp: float | None = None  # the vertex of the parabola through the best lr and its neighbours (log2 lr)
    lr_interp: float | None = None  # 2 ** log2_lr_interp: the optimum the drift is fitted to (None: older states)
    at: int | None = None  # a curve along another axis than width (`LRDrift.axis`): its value there

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """A record from before `at`: its horizon, depth or batch_size."""
        if isinstance(data, dict) and data.keys() & {"horizon", "depth", "batch_size"}:
            data = dict(data)
            values = [data.pop(k, None) for k in ("horizon", "depth", "batch_size")]
            data.setdefault("at", next((v for v in values if v is not None), None))
        return data

    def along(self, axis: str) -> int:
        """Its value along `axis`: the width, else `at`."""
        return self.width if axis == "width" else int(self.at or 0)


class LRDrift(BaseModel):
    """The validate phase's verdict: does the optimal lr (or `hparam`) stay put as width grows under μP? (`axis`
    horizon: as the training steps grow, at one width; depth: as depth grows under CompleteP, at one width.)"""

    hparam: str = "lr"  # the swept hparam
    axis: str = "width"  # what the drift is per doubling of (`Axis.name`)
    judged: tuple[str, str] = ("mup", "standard")  # the parametrization judged, the one beside it (`Axis.judged`)
    optima: list[LROptimum]
    drift: dict[str, float]  # per parametrization: slope of the interpolated optimal log2(lr) vs log2(width)
    # per parametrization: 95 % interval of that slope from each seed's own optima (None: too few points)
    drift_ci: dict[str, tuple[float, float] | None] = {}
    mup_drift: float  # the judged parametrization's (mup; along depth completep)
    standard_drift: float | None  # the one beside it (standard; along depth none); None when the sweep has none
    threshold: float  # passes when |mup_drift| <= threshold
    passed: bool
    verdict: str

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """A record from before `judged`: its axis's (`LEGACY_JUDGED`)."""
        if isinstance(data, dict) and "judged" not in data and data.get("axis") in LEGACY_JUDGED:
            data = {**data, "judged": LEGACY_JUDGED[data["axis"]]}
        return data

    @property
    def width(self) -> int | None:
        """The width a drift along another axis was measured at (None along width)."""
        return self.optima[0].width if self.axis != "width" and self.optima else None


def interpolate_optimum(log2_lrs: np.ndarray, losses: np.ndarray, best: int) -> float:
    """The optimum in log2(lr): the vertex of the parabola through grid point `best` and its two neighbours.

    The grid point itself when it sits on the grid's edge, a neighbour diverged (no finite loss) or the three
    points are not convex; the vertex is kept between the two neighbours.
    """
    coeffs = parabola(log2_lrs, losses, best)
    if coeffs is None:
        return float(log2_lrs[best])
    a, b, _ = coeffs
    return float(np.clip(-b / (2 * a), log2_lrs[best - 1], log2_lrs[best + 1]))


def parabola(x: np.ndarray, y: np.ndarray, best: int) -> np.ndarray | None:
    """The coefficients (a, b, c) of the parabola through point `best` and its two neighbours; None when `best` is
    on the grid's edge, a neighbour diverged (no finite loss) or the three points are not convex (a <= 0)."""
    if best == 0 or best == len(x) - 1 or not np.isfinite(y[best - 1 : best + 2]).all():
        return None
    coeffs = np.polyfit(x[best - 1 : best + 2], y[best - 1 : best + 2], 2)
    return coeffs if coeffs[0] > 0 else None


def lr_optima(curves: pd.DataFrame, hparam: str = "lr", axis: Axis = WIDTH, width: int | None = None
              ) -> list[LROptimum]:
    """The lowest-loss value of `hparam` per (parametrization, `axis`) of `lr_curves`' output (ties go to the
    smaller value), with the optimum interpolated in log2 by `interpolate_optimum`. Along another axis than width,
    `width` is the curves' width."""
    optima = []
    for (param, at), curve in curves.groupby(["parametrization", axis.column]):
        if np.isinf(curve["eval_loss"]).all():
            raise ValueError(
                f"every {hparam} diverged for {param} at {axis.words} {at}: "
                f"add smaller {'learning rates' if hparam == 'lr' else f'values of {hparam}'} to the validate sweep"
            )
        curve = curve.sort_values(hparam)
        best = curve.loc[curve["eval_loss"].idxmin()]
        position = int(np.flatnonzero(curve.index == best.name)[0])
        interp = interpolate_optimum(np.log2(curve[hparam].to_numpy()), curve["eval_loss"].to_numpy(), position)
        along = axis.name == "width"
        optima.append(
            LROptimum(
                parametrization=str(param),
                width=int(at) if along else int(width or 0),
                at=None if along else int(at),
                lr=float(best[hparam]),
                log2_lr=float(np.log2(best[hparam])),
                eval_loss=float(best["eval_loss"]),
                at_grid_edge=bool(best[hparam] in (curve[hparam].min(), curve[hparam].max())),
                log2_lr_interp=interp,
                lr_interp=float(2.0**interp),
            )
        )
    return optima


def drift_interval(points: pd.DataFrame, level: float = 0.95, x: str = "log2_width", y: str = "log2_opt"
                   ) -> tuple[float, float] | None:
    """The `level` interval of the slope of `y` on `x` (log2 of the width, or of the steps): `y` per-seed optima
    (`log2_opt`) or `width_trends`' losses; OLS, Student t with n − 2 degrees of freedom; None with fewer than 3
    points or fewer than 2 x values."""
    if len(points) < 3 or points[x].nunique() < 2:
        return None
    from scipy import stats  # here: SciPy's import is a second of every trial actor's start

    fit = stats.linregress(points[x], points[y])
    half = float(stats.t.ppf(0.5 + level / 2, len(points) - 2) * fit.stderr)
    return (float(fit.slope) - half, float(fit.slope) + half)


def _seed_optima(table: pd.DataFrame, phase: str, hparam: str, axis: Axis = WIDTH) -> pd.DataFrame:
    """Each seed's own interpolated optimum per (parametrization, `axis`): columns `parametrization, log2_<axis>,
    log2_opt` (a seed whose every value diverged at a point of the axis is left out there)."""
    rows = []
    for _, curves in lr_curves(table, phase, hparam, by_seed=True, column=axis.column).groupby("seed"):
        finite = curves.groupby(["parametrization", axis.column]).filter(
            lambda c: np.isfinite(c["eval_loss"]).any())
        rows += [{"parametrization": o.parametrization, f"log2_{axis.name}": np.log2(o.along(axis.name)),
                  "log2_opt": o.log2_lr_interp} for o in (lr_optima(finite, hparam, axis) if not finite.empty else [])]
    return pd.DataFrame(rows, columns=["parametrization", f"log2_{axis.name}", "log2_opt"])


def lr_drift(table: pd.DataFrame, *, threshold: float = 0.5, phase: str = "validate", hparam: str = "lr",
             axis: Axis = WIDTH) -> LRDrift:
    """Fit the drift of the optimal log2(lr) (or log2 of `hparam`) per doubling of width, per parametrization.

    The drift is the slope over the seed-mean curves' interpolated optima; `drift_ci` is its 95 % t-interval over
    every seed's own optima. `table`'s `phase` rows are a sweep over widths, seeds and parametrizations (the axis's
    judged one required, the other beside it); `threshold` is the largest |drift| of the judged one that passes;
    `hparam` selects the rows whose `swept` it is. `axis`: `WIDTH`, or another sweep's (`Axis`: per doubling of its
    column's value, at one width: pass that width's rows of the sweep).
    """
    rows = phase_rows(table, phase)
    widths = rows["width"].unique() if axis.name != "width" and "width" in rows else []
    if len(widths) > 1:
        raise ValueError(f"a drift along the {axis.name} needs one width's rows, not widths "
                         f"{sorted(int(w) for w in widths)}: select one")
    width = int(widths[0]) if len(widths) else None
    optima = lr_optima(lr_curves(table, phase, hparam, column=axis.column), hparam, axis, width)
    per_seed = _seed_optima(table, phase, hparam, axis)
    drift, ci = {}, {}
    col = axis.column
    for param in dict.fromkeys(sorted(o.parametrization for o in optima)):
        points = [o for o in optima if o.parametrization == param]
        values = [o.along(axis.name) for o in points]
        if len(set(values)) < 2:
            raise ValueError(
                f"lr_drift needs at least two {col}s per parametrization "
                f"({param} has {values}); "
                f"add a {col} to the validate sweep"
            )
        optimal = [o.log2_lr if o.log2_lr_interp is None else o.log2_lr_interp for o in points]
        drift[param] = float(np.polyfit(np.log2(np.array(values, dtype=float)), optimal, 1)[0])
        ci[param] = drift_interval(per_seed[per_seed["parametrization"] == param], x=f"log2_{axis.name}")
    judged, beside = axis.judged
    if judged not in drift:
        raise ValueError(f"the validate sweep has no {judged} runs (parametrizations: {sorted(drift)}); add them")
    passed = abs(drift[judged]) <= threshold

    def said(param: str) -> str:
        interval = ci[param]
        return f"{drift[param]:+.2f}" + (f" [{interval[0]:+.2f}, {interval[1]:+.2f}]" if interval else "")

    at = f" at width {width}" if axis.name != "width" and width is not None else ""
    verdict = (
        f"{judged}'s optimal {hparam}{at} drifts {said(judged)} log2({hparam}) per doubling of {axis.words} "
        f"(optimum interpolated in log {hparam}; |drift| {'≤' if passed else '>'} {threshold:g}: "
        f"{'pass' if passed else 'fail'})"
    )
    if beside in drift:
        verdict += f"; {beside} drifts {said(beside)}"
    edges = [f"{o.parametrization}@{o.along(axis.name)}" for o in optima if o.at_grid_edge]
    if edges:
        verdict += f"; optimum at the edge of the {hparam} grid for {', '.join(edges)}: widen the sweep there"
    return LRDrift(
        hparam=hparam,
        axis=axis.name,
        judged=axis.judged,
        optima=optima,
        drift=drift,
        drift_ci=ci,
        mup_drift=drift[judged],
        standard_drift=drift.get(beside),
        threshold=threshold,
        passed=passed,
        verdict=verdict,
    )


# μP: with the same hparams, wider is better. The transferred hparams' eval loss per width, fitted against
# log2(width) over every finished run (seeds as replicates), judged by the slope's interval.
BETTER, WORSE, NOISE, UNJUDGED = "wider is better", "wider is worse", "within noise", "not judged"
CAUSE = "usually a parameter group's lr or init not scaled with width (check docs/mup.md's rules for this family)"


class WidthTrend(BaseModel):
    """Does the transferred hparams' eval loss fall with width under one parametrization? (`width_trends`)"""

    parametrization: str
    widths: list[int]  # the widths with a finished run, narrowest first
    losses: list[float]  # the mean eval loss of the finished runs at each
    n_runs: int  # the finished runs fitted
    slope: float | None  # eval loss per doubling of width, least squares over the runs (None: under 2 widths)
    ci: tuple[float, float] | None  # its 95 % t-interval from the fit's residuals (None: too few runs)
    verdict: str  # BETTER (the interval below 0), WORSE (above 0), NOISE (across 0) or UNJUDGED (no interval)
    diverged: list[int] = []  # the widths where a run diverged (left out of the fit)
    line: str  # the verdict in words: the widths, the losses, the slope and, on a warning, what usually causes it

    @property
    def warning(self) -> bool:
        """The judged parametrization (`WIDTH.judged`: mup) got worse with width: μP's own diagnostic failed."""
        return self.verdict == WORSE and self.parametrization == WIDTH.judged[0]


def tuned_base(table: pd.DataFrame) -> pd.Series | None:
    """The tune phase's best completed trial (the tuned base width's run), None when the table has none."""
    if "tune" not in set(table["phase"]):
        return None
    tune = phase_rows(table, "tune")
    done = tune[(tune["status"] == TrialStatus.COMPLETED) & np.isfinite(tune["eval_loss"].astype(float))]
    return None if done.empty else done.loc[done["eval_loss"].astype(float).idxmin()]


def width_trends(table: pd.DataFrame, phase: str = "transfer") -> list[WidthTrend]:
    """Per parametrization, whether the eval loss of `phase`'s runs falls with width beyond the seeds' noise.

    Every finished run's final eval loss is fitted against log2(width) by least squares; `ci` is the slope's 95 %
    t-interval with n − 2 degrees of freedom from the residuals (the seeds' spread and any curvature), judged with
    3 runs at 2 widths or more, else `not judged`. Verdict: `wider is better` when the interval lies below 0, `wider
    is worse` when it lies above 0, `within noise` otherwise. Diverged runs are left out and named, failed runs
    ignored. A table with tune rows adds `tuned_base`'s run at its width: pass them only when it trained as `phase`'s
    runs do. The judged parametrization (`WIDTH.judged`: mup) comes first.
    """
    rows = phase_rows(table, phase)
    base = tuned_base(table)
    if base is not None:
        rows = pd.concat([rows, base.to_frame().T], ignore_index=True)
    require_columns(rows, ["width", "parametrization", "status", "eval_loss"], "width_trends")
    loss = judged_loss(rows)
    kept = rows.loc[loss.index]
    trends = [_trend(str(param), group["width"].astype(int), loss[group.index])
              for param, group in kept.groupby("parametrization")]
    return sorted(trends, key=lambda t: (t.parametrization != WIDTH.judged[0], t.parametrization))


def _trend(param: str, widths: pd.Series, loss: pd.Series) -> WidthTrend:
    """One parametrization's `WidthTrend` from its runs' widths and judged losses (+inf: diverged)."""
    finite = np.isfinite(loss)
    points = pd.DataFrame({"log2_width": np.log2(widths[finite].astype(float)), "eval_loss": loss[finite]})
    means = loss[finite].groupby(widths[finite]).mean()
    slope = float(np.polyfit(points["log2_width"], points["eval_loss"], 1)[0]) if len(means) > 1 else None
    ci = drift_interval(points, y="eval_loss")
    verdict = UNJUDGED if ci is None else BETTER if ci[1] < 0 else WORSE if ci[0] > 0 else NOISE
    trend = WidthTrend(parametrization=param, widths=[int(w) for w in means.index], losses=means.tolist(),
                       n_runs=len(points), slope=slope, ci=ci, verdict=verdict,
                       diverged=sorted({int(w) for w in widths[~finite]}), line="")
    trend.line = _said(trend)
    return trend


def _said(t: WidthTrend) -> str:
    """"wider is worse under mup: eval loss 5.010 → 5.160 → 5.330 at widths 32, 64, 128 (+0.160 per doubling,
    95 % interval [+0.087, +0.233]); usually ..." (module-level `CAUSE` on a warning)."""
    losses = " → ".join(f"{v:.3f}" for v in t.losses)
    at = f"eval loss {losses} at width{'s' * (len(t.widths) > 1)} {', '.join(map(str, t.widths))}" if t.widths \
        else "no run finished"
    fit = (f" ({t.slope:+.3f} per doubling, 95 % interval [{t.ci[0]:+.3f}, {t.ci[1]:+.3f}])"
           if t.ci is not None and t.slope is not None else
           f" ({t.n_runs} finished run{'s' * (t.n_runs != 1)}: judging needs 3 or more runs over 2 or more widths; "
           "add a transfer width or seeds)")
    diverged = (f"; runs diverged at width{'s' * (len(t.diverged) > 1)} {', '.join(map(str, t.diverged))} "
                "(left out)") if t.diverged else ""
    return f"{t.verdict} under {t.parametrization}: {at}{fit}{diverged}" + (f"; {CAUSE}" if t.warning else "")
