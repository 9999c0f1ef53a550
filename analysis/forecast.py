"""A forecast of the target's optimal learning rate from the validate sweeps, and a published law beside it.

Each seed's lr curve at each swept (width, steps, batch size, seq_len) gives one optimum: the vertex of the parabola
in log2 lr through the best lr and its neighbours (`analysis.transfer.interpolate_optimum`, as the drift finds it),
and that parabola's curvature k (nats per log2 unit²). Optima on the edge of the lr grid are left out of the fit
(the true one lies outside the grid) and listed. One ordinary least-squares fit, seeds as replicates,

    log2 η* = a + b·log2 width + c·log2 steps + d·log2 batch + e·log2 seq_len,

(seq_len: a row's own where a sweep varies the context, else the `seq_len` given) keeps each term only where the
sweeps vary its axis (and where it is not collinear with the terms before it), and
predicts the mean log2 η* at the target with a Student-t interval (n − p degrees of freedom; with none left, the
prediction has no interval and says so). The expected regret of an lr x at the target is
k·((x − μ)² + s²): μ the prediction, s its standard error, k the mean curvature of the swept point nearest the target
(in log2 distance: width first, then steps and batch size), in nats and in % of that point's optimum loss.

Held-out scoring fits on the sweeps without one point and predicts it: by default the largest width, at its longest
steps and the largest batch size swept there. The fit leaves out every row at that width, and with three or more
horizons (`validate.steps`) every horizon-sweep row at the held-out steps (two are left to fit the term); with two
horizons both stay, and so does every batch size (a batch sweep at a fixed token budget moves its steps with the
batch: leaving one batch size out can leave the two collinear). The error is the prediction's log2 distance from the
held-out seed-mean curve's interpolated optimum, and in nats the loss there at the predicted lr minus the curve's
minimum (`analysis.regret.curve_loss_at`). Step Law's closed form is scored on the same point: η*(N, D) = 1.79 ·
N^−0.713 · D^0.307, N the non-embedding parameters, D the training tokens (Li et al. 2025, "Predictable Scale: Part
I — Optimal Hyperparameter Scaling Law in Large Language Model Pretraining", arXiv:2503.04715). It was fitted on
some 3,700 LLM pretraining runs (its test model: 1B parameters on 100B tokens), so at toy scale it is a baseline,
not a prediction. N per width comes from the caller (analysis imports no model code); D takes each point's own
seq_len.

Leave-out scoring (`leave_out_score`) measures how good the fit and its interval are: every distinct swept point in
turn is held out as above (its whole width leaves the fit: the forecast is always for a width it has not seen, and
a width's other horizons and batches would carry that width's own departure from the law into the fit; with three
or more horizons its horizon leaves too), where the fit without it still has every term of the fit over all points
(with two widths none has: leaving one leaves no width term). Per point: the error in log2 and nats, Step Law's,
and whether the nominal 95 % t-interval held the observed seed-mean optimum. That interval is the law's mean's: it
leaves out the held-out curve's own seed noise and any bend of the law, so it under-covers observed optima even
when the law holds. The interval that holds what it says is split-conformal (`conformal_quantile`) on the scores
|error| / se of those points, scaled by each prediction's standard error so that it widens with the extrapolation:
the target's is log2 η* ± q·se, q the ⌈(n + 1)·0.95⌉-th smallest of the n scores, its coverage measured by
leave-one-out (each point against the quantile of the others). Below 19 points (at 95 %) no finite quantile has
the guarantee; the forecast then takes `POOLED_MULTIPLIERS`, the same quantile over the catalog's stored studies
(`benchmarks/forecast_coverage.py`, which measures its coverage on each study left out of it), and states the
coverage of its own points under it; without one, the largest of its n scores, an interval whose guaranteed level
is n / (n + 1) (86 % for 6 points), said as such. Exchangeability of the target with the held-out points is
assumed: the target usually lies further out than any of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel

from analysis.regret import curve_loss_at, curve_minimum
from analysis.table import phase_rows, require_columns
from analysis.transfer import interpolate_optimum, lr_curves, parabola

__all__ = ["POOLED_MULTIPLIERS", "STEP_LAW", "ErrorSummary", "Forecast", "HeldOut", "LeaveOut", "fit_optimum_law",
           "conformal_quantile", "forecast", "forecast_line", "held_out_score", "leave_out_score", "loo_coverage",
           "min_scores", "step_law_lr", "summarise", "sweep_optima"]

STEP_LAW = {"coefficient": 1.79, "n_exponent": -0.713, "d_exponent": 0.307}
"""Step Law's optimal lr, η*(N, D) = 1.79 · N^−0.713 · D^0.307 (N non-embedding parameters, D training tokens;
arXiv:2503.04715, its optimal batch B*(D) = 0.58 · D^0.571 tokens beside it)."""

AXES = ("width", "steps", "batch_size", "seq_len")
"""The axes of the fit, in the order their terms enter it; the trial table's `horizon` is `steps` here."""

POOLED_MULTIPLIERS: dict[float, float] = {}
"""The conformal multiplier pooled over the catalog's studies, per level: the half-width of the interval in units of
the prediction's standard error, used when a study's own leave-out scores are too few (`leave_out_score`)."""


# Split-conformal quantiles: given n exchangeable scores, the ⌈(n + 1)·level⌉-th smallest bounds a new score with
# probability ≥ `level` (Vovk et al. 2005; Lei et al. 2018, "Distribution-free predictive inference for regression").
# Below `min_scores(level)` scores (19 at 95 %) that rank exceeds n: no finite quantile has the guarantee (None).

def _conformal_rank(n: int, level: float) -> int:
    if not 0 < level < 1:
        raise ValueError(f"the conformal level must lie in (0, 1) (got {level})")
    return math.ceil((n + 1) * level - 1e-9)  # the 1e-9: 20 × 0.95 is 19.000000000000004 in floats


def min_scores(level: float) -> int:
    """The fewest scores whose `level` quantile is finite: the smallest n with ⌈(n + 1)·level⌉ ≤ n."""
    n = 1
    while _conformal_rank(n, level) > n:
        n += 1
    return n


def conformal_quantile(scores: Sequence[float], level: float) -> float | None:
    """The ⌈(n + 1)·level⌉-th smallest of `scores`; None with fewer than `min_scores(level)` of them."""
    k = _conformal_rank(len(scores), level)
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


def step_law_lr(n_params: float, tokens: float) -> float:
    """Step Law's optimal lr at `n_params` non-embedding parameters and `tokens` training tokens (`STEP_LAW`)."""
    if not (n_params > 0 and tokens > 0):
        raise ValueError(f"Step Law needs n_params > 0 and tokens > 0 (got {n_params}, {tokens})")
    c = STEP_LAW
    return float(c["coefficient"] * n_params ** c["n_exponent"] * tokens ** c["d_exponent"])


class HeldOut(BaseModel):
    """One swept point predicted by a fit that did not see it: the forecast's error there, and Step Law's."""

    width: int
    steps: int
    batch_size: int
    observed_log2_lr: float  # the seed-mean curve's interpolated optimum there
    observed_at_grid_edge: bool  # the observed optimum is the grid's edge: the errors are lower bounds
    predicted_log2_lr: float
    interval: tuple[float, float] | None  # the prediction's 95 % interval (log2 lr); None: no residual dof
    error_log2: float  # predicted − observed
    regret: float | None  # nats: the curve's loss at the predicted lr minus its minimum (None: outside the grid)
    n_fit: int  # optima the fit used
    terms: list[str]  # the fit's terms
    steplaw_log2_lr: float | None = None  # Step Law's η*(N, D) there (None: no parameter count given)
    steplaw_error_log2: float | None = None
    steplaw_regret: float | None = None  # nats, as `regret` (None: outside the grid or no Step Law)
    note: str = ""
    seq_len: int | None = None  # the point's tokens per sequence (None: not given)
    se: float | None = None  # the prediction's standard error (log2 lr; None: no residual dof)
    covered: bool | None = None  # `interval` holds the observed optimum (None: no interval)


class ErrorSummary(BaseModel):
    """|error| over held-out points: the median and the 90th percentile (linear between order statistics)."""

    n: int  # points with an error in log2 lr
    median_log2: float | None  # None: no point
    p90_log2: float | None
    n_nats: int  # points whose regret is inside the swept grid
    median_nats: float | None
    p90_nats: float | None


class LeaveOut(BaseModel):
    """Every swept point the forecast could predict, each fitted without it (`leave_out_score`), and the conformal
    multiplier its scores |error| / se give."""

    points: list[HeldOut]
    skipped: list[str] = []  # the points the fit cannot predict, with why
    errors: ErrorSummary  # the forecast's
    steplaw: ErrorSummary | None = None  # Step Law's on the same points (None: no parameter count)
    t_covered: int  # points whose nominal t-interval held the observed optimum
    t_scored: int  # points with a t-interval
    multiplier: float | None = None  # the conformal interval's half-width in standard errors (None: no point)
    source: str = ""  # "leave-out": the level's quantile of the study's own scores; "pooled": `POOLED_MULTIPLIERS`;
    # "max": too few for the level, the largest own score
    level: float | None = None  # the conformal interval's guaranteed coverage: the level, or n / (n + 1) for "max"
    covered: int | None = None  # points the conformal interval held: each against the others' quantile (leave-out),
    scored: int = 0  # or against the pooled one; `scored`: points with a standard error
    note: str = ""


class Forecast(BaseModel):
    """The target's optimal lr forecast from the validate sweeps (module docstring)."""

    parametrization: str
    target_width: int
    target_steps: int
    target_batch_size: int
    terms: list[str]  # the axes whose log2 entered the fit (`AXES`), in order
    coefficients: dict[str, float]  # "intercept" and one slope per term (log2 lr per doubling)
    coefficient_ci: dict[str, tuple[float, float] | None]  # 95 % t-intervals (None: no residual dof)
    n_points: int  # per-seed optima fitted
    dof: int  # n_points − coefficients
    residual_sd: float | None  # log2 units (None: no residual dof)
    log2_lr: float  # the predicted mean log2 η* at the target
    lr: float
    interval: tuple[float, float] | None  # 95 % interval of log2_lr (None: no residual dof)
    se: float | None  # standard error of log2_lr (None: no residual dof)
    curvature: float | None  # nats per log2 unit² near the target (None: no curve had a parabola)
    curvature_at: tuple[int, int, int] | None  # the swept (width, steps, batch) it was measured at
    reference_loss: float | None  # that point's optimum loss: the base of the % regrets
    transferred_lr: float | None = None  # the tune winner's lr
    regret: float | None = None  # expected nats lost at the target by the transferred lr
    regret_pct: float | None = None
    forecast_regret: float | None = None  # expected nats lost by the forecast itself: k·s²
    steplaw_lr: float | None = None  # Step Law's η*(N, D) at the target (None: no parameter count)
    edges: list[str] = []  # optima left out on the grid's edge: "w128-t300-b16-s1"
    held_out: HeldOut | None = None  # the hold-out rule's point (three or more widths)
    target_check: HeldOut | None = None  # the target's own sweep, predicted without its width (when swept)
    note: str = ""  # what the forecast assumes or lacks
    target_seq_len: int | None = None  # the target's tokens per sequence (the `seq_len` given)
    leave_out: LeaveOut | None = None  # every swept point predicted without its width (None: not scored)
    conformal_interval: tuple[float, float] | None = None  # log2_lr ± leave_out.multiplier · se (None: none)


def _keyed(table: pd.DataFrame, steps: int, batch_size: int, parametrization: str, phase: str,
           batch_steps: Mapping[int, int] | None = None, seq_len: int | None = None) -> pd.DataFrame:
    """The lr sweep's rows of `parametrization` with `steps`, `batch_size` and `seq_len` filled: a row's `horizon`,
    else its batch's `batch_steps`, else `steps`; its `batch_size`, else `batch_size`; its `seq_len`, else `seq_len`,
    else 0 (not known: allowed only where no row has one)."""
    rows = phase_rows(table, phase)
    require_columns(rows, ["width", "seed", "parametrization", "lr"], "the lr forecast")
    swept = rows["swept"].fillna("lr") if "swept" in rows else pd.Series("lr", index=rows.index)
    rows = rows[(rows["parametrization"] == parametrization) & (swept == "lr")]
    if rows.empty:
        raise ValueError(f"the {phase} phase has no lr sweep under {parametrization}: add {parametrization} to "
                         "validate.parametrizations")
    unset = pd.Series(np.nan, index=rows.index)
    batch, horizon = rows.get("batch_size", unset), rows.get("horizon", unset)
    filled = {"steps": horizon.fillna(batch.map(dict(batch_steps or {}))).fillna(steps),
              "batch_size": batch.fillna(batch_size), "seq_len": rows.get("seq_len", unset).fillna(seq_len or 0)}
    if (filled["seq_len"] == 0).any() and filled["seq_len"].nunique() > 1:
        raise ValueError("some lr-sweep rows have a seq_len and some none: pass the forecast's seq_len (the spec's "
                         "data.seq_len) for the rows without one")
    return rows.drop(columns=[c for c in filled if c in rows]).assign(**{k: v.astype(int) for k, v in filled.items()})


def sweep_optima(table: pd.DataFrame, *, steps: int, batch_size: int, batch_steps: Mapping[int, int] | None = None,
                 parametrization: str = "mup", phase: str = "validate", by_seed: bool = True,
                 seq_len: int | None = None) -> pd.DataFrame:
    """Each lr curve's optimum per (width, steps, batch_size, seq_len[, seed]) of `parametrization` (module
    docstring).

    `steps`, `batch_size`, `seq_len`: what rows without a `horizon` (`batch_size`, `seq_len`) trained; `batch_steps`:
    the steps a batch sweep's row (a `batch_size`, no `horizon`) trained at each batch size (None: `steps`). Returns
    columns `width, steps, batch_size, seq_len, [seed,] log2_lr, at_grid_edge, curvature, optimum_loss` (`seq_len` 0:
    not known): the interpolated optimum (log2), whether
    the best lr is the grid's smallest or largest, the parabola's curvature (NaN where it has none: an edge, a
    diverged neighbour, a concave triple) and the curve's minimum. A curve whose every lr diverged is left out."""
    return _optima(_keyed(table, steps, batch_size, parametrization, phase, batch_steps, seq_len), phase, by_seed)


def _optima(rows: pd.DataFrame, phase: str, by_seed: bool = True) -> pd.DataFrame:
    """`sweep_optima` of `_keyed` rows."""
    out = []
    for (s, b, q), group in rows.groupby(["steps", "batch_size", "seq_len"]):
        curves = lr_curves(group, phase, by_seed=by_seed)
        for key, curve in curves.groupby(["width", *(["seed"] if by_seed else [])]):
            curve = curve.sort_values("lr")
            x, y = np.log2(curve["lr"].to_numpy(dtype=float)), curve["eval_loss"].to_numpy(dtype=float)
            if not np.isfinite(y).any():
                continue
            best = int(np.argmin(y))  # ties: the smaller lr, as `lr_optima`
            coeffs = parabola(x, y, best)
            out.append({"width": int(key[0]), "steps": int(s), "batch_size": int(b), "seq_len": int(q),
                        **({"seed": int(key[1])} if by_seed else {}),
                        "log2_lr": interpolate_optimum(x, y, best), "at_grid_edge": best in (0, len(x) - 1),
                        "curvature": float(coeffs[0]) if coeffs is not None else np.nan,
                        "optimum_loss": curve_minimum(x, y, best)[1]})
    columns = [*AXES, *(["seed"] if by_seed else []), "log2_lr", "at_grid_edge",
               "curvature", "optimum_loss"]
    return pd.DataFrame(out, columns=columns)


class _Fit(BaseModel):
    terms: list[str]
    collinear: list[str]  # axes that vary but move with a term before them: left out
    beta: list[float]
    cov: list[list[float]] | None  # None: no residual dof
    n: int
    dof: int
    residual_sd: float | None

    def design(self, point: Mapping[str, float]) -> np.ndarray:
        return np.array([1.0, *(np.log2(point[t]) for t in self.terms)])

    def predict(self, point: Mapping[str, float]) -> tuple[float, float | None]:
        """(mean log2 η*, its standard error or None) at `point` (an axis → value mapping)."""
        x = self.design(point)
        mean = float(x @ np.array(self.beta))
        return mean, None if self.cov is None else float(np.sqrt(max(x @ np.array(self.cov) @ x, 0.0)))


def _t(dof: int, level: float) -> float:
    from scipy import stats  # here: SciPy's import is a second of every trial actor's start

    return float(stats.t.ppf(0.5 + level / 2, dof))


def fit_optimum_law(optima: pd.DataFrame) -> _Fit:
    """OLS of `log2_lr` on 1 and the log2 of each of `AXES` that varies in `optima` (in order, a term dropped when
    it is collinear with those before it); a `ValueError` with fewer optima than coefficients."""
    if optima.empty:
        raise ValueError("no lr optimum to fit: every swept optimum is on the edge of the lr grid or diverged; "
                         "widen validate.lrs")
    columns, terms, collinear = [np.ones(len(optima))], [], []
    for axis in AXES:
        values = optima[axis].to_numpy(dtype=float) if axis in optima else np.ones(len(optima))
        if np.ptp(values) == 0:
            continue
        candidate = np.log2(values)
        if np.linalg.matrix_rank(np.column_stack([*columns, candidate])) > len(columns):
            columns.append(candidate)
            terms.append(axis)
        else:
            collinear.append(axis)
    design, y = np.column_stack(columns), optima["log2_lr"].to_numpy(dtype=float)
    n, p = design.shape
    if n < p:
        raise ValueError(f"{n} lr optima cannot fit {p} coefficients (intercept, {', '.join(terms)}): add seeds or "
                         "widen validate.lrs so fewer optima sit on the grid's edge")
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    dof = n - p
    cov, sd = None, None
    if dof > 0:
        rss = float(np.sum((y - design @ beta) ** 2))
        sd = float(np.sqrt(rss / dof))
        cov = (sd**2 * np.linalg.inv(design.T @ design)).tolist()
    return _Fit(terms=terms, collinear=collinear, beta=[float(b) for b in beta], cov=cov, n=n, dof=dof,
                residual_sd=sd)


def _fitted(optima: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The optima the fit takes (off the grid's edge) and the names of those left out."""
    edge = optima["at_grid_edge"].astype(bool)
    contexts = "seq_len" in optima and optima["seq_len"].nunique() > 1
    names = [f"w{r.width}-t{r.steps}-b{r.batch_size}" + (f"-l{r.seq_len}" if contexts else "")
             + (f"-s{r.seed}" if "seed" in optima else "") for r in optima[edge].itertuples()]
    return optima[~edge], names


def _interval(fit: _Fit, mean: float, se: float | None, level: float) -> tuple[float, float] | None:
    if se is None:
        return None
    half = _t(fit.dof, level) * se
    return (mean - half, mean + half)


def _point_loss(curve: pd.DataFrame, at: float) -> tuple[float, float | None]:
    """(log2 optimum, loss at log2 lr `at` minus the minimum) on one seed-mean curve (None: outside the grid or
    diverged there)."""
    curve = curve.sort_values("lr")
    x, y = np.log2(curve["lr"].to_numpy(dtype=float)), curve["eval_loss"].to_numpy(dtype=float)
    best = int(np.argmin(y))
    vertex, minimum = curve_minimum(x, y, best)
    loss = curve_loss_at(x, y, best, at)
    return vertex, (loss - minimum if loss is not None and np.isfinite(loss) else None)


def _axis_values(rows: pd.DataFrame, axis: str) -> list[int]:
    return sorted(int(v) for v in rows[axis].unique())


Point = tuple[int, int, int] | tuple[int, int, int, int]
"""A swept point: (width, steps, batch_size[, seq_len]); without its seq_len, the forecast's `seq_len`."""


def _hold_out(rows: pd.DataFrame) -> tuple[int, int, int, int]:
    """The default held-out point: the largest width, its longest steps, the largest batch swept there, the longest
    context there."""
    width = int(rows["width"].max())
    at = rows[rows["width"] == width]
    at = at[at["steps"] == at["steps"].max()]
    at = at[at["batch_size"] == at["batch_size"].max()]
    return width, int(at["steps"].iloc[0]), int(at["batch_size"].iloc[0]), int(at["seq_len"].max())


def _words(point: tuple[int, ...]) -> str:
    context = f", seq_len {point[3]}" if len(point) > 3 and point[3] else ""
    return f"width {point[0]}, {point[1]} steps, batch {point[2]}{context}"


def _at(rows: pd.DataFrame, point: tuple[int, ...]) -> np.ndarray:
    """The rows at `point` (its first axes: a 3-tuple matches every seq_len)."""
    return np.asarray(np.logical_and.reduce([rows[a] == v for a, v in zip(AXES, point, strict=False)]), dtype=bool)


def held_out_score(table: pd.DataFrame, *, steps: int, batch_size: int, batch_steps: Mapping[int, int] | None = None,
                   point: Point | None = None, n_params: Mapping[int, float] | None = None,
                   seq_len: int | None = None, parametrization: str = "mup", phase: str = "validate",
                   level: float = 0.95) -> HeldOut:
    """Fit without one swept point and predict it (module docstring): `point` = (width, steps, batch_size[,
    seq_len]), by default the largest width, at its longest swept steps, at the largest batch swept there (at the
    longest context there). `steps`, `batch_size`, `batch_steps`, `seq_len`: as `sweep_optima`. `n_params` (width →
    non-embedding parameters) adds Step Law's error, D = steps × batch × the point's seq_len."""
    rows = _keyed(table, steps, batch_size, parametrization, phase, batch_steps, seq_len)
    where = dict(zip(AXES, point if point is None or len(point) == 4 else (*point, seq_len or 0), strict=True)) \
        if point is not None else dict(zip(AXES, _hold_out(rows), strict=True))
    key = tuple(where.values())
    held = rows[_at(rows, key)]
    if held.empty:
        raise ValueError(f"the {phase} sweep has no lr curve at {_words(key)}")
    width = where["width"]
    keep = rows["width"] != width
    horizons = rows["horizon"].dropna().unique() if "horizon" in rows else []
    if len(horizons) >= 3:  # a batch sweep's rows all stay: at a fixed token budget their steps move with the batch
        keep &= rows["horizon"] != where["steps"]
    optima, _ = _fitted(_optima(rows[keep], phase))
    fit = fit_optimum_law(optima)
    mean, se = fit.predict(where)
    curve = lr_curves(held, phase)
    if not np.isfinite(curve["eval_loss"]).any():
        raise ValueError(f"every lr diverged at {_words(key)}: add smaller lrs")
    observed, regret = _point_loss(curve, mean)
    finite = curve.sort_values("lr")["eval_loss"].to_numpy(dtype=float)
    edge = int(np.argmin(finite)) in (0, len(finite) - 1)
    interval = _interval(fit, mean, se, level)
    context = where["seq_len"] or None
    out = HeldOut(width=width, steps=where["steps"], batch_size=where["batch_size"], observed_log2_lr=observed,
                  observed_at_grid_edge=edge, predicted_log2_lr=mean, interval=interval,
                  error_log2=mean - observed, regret=regret, n_fit=fit.n, terms=fit.terms,
                  note="the held-out optimum is on the lr grid's edge: the errors are lower bounds" if edge else "",
                  seq_len=context, se=se, covered=interval[0] <= observed <= interval[1] if interval else None)
    if n_params is not None and context is not None and width in n_params:
        law = float(np.log2(step_law_lr(n_params[width], where["steps"] * where["batch_size"] * context)))
        out = out.model_copy(update={"steplaw_log2_lr": law, "steplaw_error_log2": law - observed,
                                     "steplaw_regret": _point_loss(curve, law)[1]})
    return out


def _summary(errors: Sequence[float], nats: Sequence[float | None]) -> ErrorSummary:
    def q(values: list[float], at: float) -> float | None:
        return float(np.quantile(values, at)) if values else None

    log2 = [abs(e) for e in errors]
    known = [abs(n) for n in nats if n is not None]
    return ErrorSummary(n=len(log2), median_log2=q(log2, 0.5), p90_log2=q(log2, 0.9), n_nats=len(known),
                        median_nats=q(known, 0.5), p90_nats=q(known, 0.9))


def summarise(points: Sequence[HeldOut]) -> tuple[ErrorSummary, ErrorSummary | None]:
    """The forecast's |error| over `points`, and Step Law's over those it was scored on (None: none)."""
    law = [(h.steplaw_error_log2, h.steplaw_regret) for h in points if h.steplaw_error_log2 is not None]
    return (_summary([h.error_log2 for h in points], [h.regret for h in points]),
            _summary([e for e, _ in law], [n for _, n in law]) if law else None)


def _calibrated(points: list[HeldOut], level: float, pooled: Mapping[float, float]) -> dict[str, Any]:
    """The conformal fields of `LeaveOut` over `points`' scores |error| / se: the `level` split-conformal quantile,
    its coverage by leave-one-out; with too few points, `pooled[level]`, else the largest score, whose guaranteed
    level is n / (n + 1) (each point's coverage against the others' largest)."""
    scores = [abs(h.error_log2) / h.se for h in points if h.se]
    n, q = len(scores), conformal_quantile(scores, level)
    if q is not None:
        covered = loo_coverage(scores, level)
        return {"multiplier": q, "source": "leave-out", "level": level, "covered": covered, "scored": n,
                "note": "" if covered is not None else f"{n} points: leaving one out leaves too few to measure the "
                                                       "coverage"}
    few = f"{n} held-out points are too few for a {level:.0%} conformal interval (it needs {min_scores(level)})"
    if level in pooled:
        q = pooled[level]
        return {"multiplier": q, "source": "pooled", "level": level, "covered": sum(s <= q for s in scores),
                "scored": n, "note": few + ": the multiplier pooled over the catalog"}
    if n == 0:
        return {"scored": 0, "note": few}
    others = [max(scores[:i] + scores[i + 1:]) if n > 1 else None for i in range(n)]
    return {"multiplier": max(scores), "source": "max", "level": n / (n + 1),
            "covered": sum(o is not None and s <= o for s, o in zip(scores, others, strict=True)) if n > 1 else None,
            "scored": n, "note": few + f": the largest of them, a {n / (n + 1):.0%} interval"}


def leave_out_score(table: pd.DataFrame, *, steps: int, batch_size: int,
                    batch_steps: Mapping[int, int] | None = None, n_params: Mapping[int, float] | None = None,
                    seq_len: int | None = None, parametrization: str = "mup", phase: str = "validate",
                    level: float = 0.95, pooled: Mapping[float, float] | None = None) -> LeaveOut:
    """Every distinct swept point in turn scored by `held_out_score` (its whole width, and with three or more
    horizons its horizon, left out of the fit), where the fit without it keeps every term of the full fit (else it
    would assume no move along an axis the sweeps vary); the errors' and Step Law's summaries, the nominal
    t-interval's coverage and the conformal multiplier (module docstring). `pooled`: the multiplier per level used
    when the points are too few for their own (None: `POOLED_MULTIPLIERS`; {}: none)."""
    rows = _keyed(table, steps, batch_size, parametrization, phase, batch_steps, seq_len)
    full = fit_optimum_law(_fitted(_optima(rows, phase))[0]).terms
    points, skipped = [], []
    for key in sorted(set(rows[list(AXES)].itertuples(index=False, name=None))):
        point = tuple(int(v) for v in key)
        try:
            h = held_out_score(table, steps=steps, batch_size=batch_size, batch_steps=batch_steps, n_params=n_params,
                               seq_len=seq_len, parametrization=parametrization, phase=phase, level=level,
                               point=point)  # type: ignore[arg-type]
        except ValueError as e:
            skipped.append(f"{_words(point)}: {e}")
            continue
        if "width" not in full:
            skipped.append(f"{_words(point)}: the fit over every point has no width term: nothing to forecast")
            continue
        if h.terms != full:
            skipped.append(f"{_words(point)}: without width {point[0]} the fit's terms are "
                           f"{', '.join(h.terms) or 'none'}, not {', '.join(full)}")
            continue
        points.append(h)
    calibrated = _calibrated(points, level, POOLED_MULTIPLIERS if pooled is None else pooled)
    errors, steplaw = summarise(points)
    return LeaveOut(points=points, skipped=skipped, errors=errors, steplaw=steplaw,
                    t_covered=sum(bool(h.covered) for h in points), t_scored=sum(h.covered is not None for h in points),
                    **calibrated)


def _nearest(optima: pd.DataFrame, target: Mapping[str, float]) -> tuple[int, int, int, int] | None:
    """The swept (width, steps, batch, seq_len) nearest `target` in log2 distance (width first) with a curvature; an
    axis the target has no value for (0) is not a distance."""
    curved = optima[np.isfinite(optima["curvature"])]
    if curved.empty:
        return None
    axes = [a for a in AXES if target[a]]
    distance = [tuple(abs(np.log2(getattr(r, a) / target[a])) if getattr(r, a) else 0.0 for a in axes)
                for r in curved.itertuples()]
    r = curved.iloc[min(range(len(distance)), key=lambda i: distance[i])]
    return int(r["width"]), int(r["steps"]), int(r["batch_size"]), int(r["seq_len"])


def _absent(terms: Sequence[str], target: Mapping[str, int], swept: Mapping[str, list[int]]) -> str:
    """What the fit assumes for the axes it has no term for, where the target lies off the one swept value."""
    words = {"width": "width", "steps": "training steps", "batch_size": "batch size", "seq_len": "context (seq_len)"}
    return "; ".join(f"the sweeps fix the {words[a]} at {swept[a][0]}: the optimum is taken not to move from there "
                     f"to the target's {target[a]}" for a in AXES
                     if a not in terms and len(swept[a]) == 1 and target[a] and swept[a][0] != target[a])


def _coefficient_ci(fit: _Fit, level: float) -> dict[str, tuple[float, float] | None]:
    """Each coefficient's `level` t-interval (None without residual dof)."""
    names = ["intercept", *fit.terms]
    if fit.cov is None:
        return dict.fromkeys(names)
    t = _t(fit.dof, level)
    return {name: (fit.beta[i] - t * float(np.sqrt(fit.cov[i][i])), fit.beta[i] + t * float(np.sqrt(fit.cov[i][i])))
            for i, name in enumerate(names)}


def _scores(score: Callable[..., HeldOut], rows: pd.DataFrame, target: tuple[int, int, int, int], notes: list[str]
            ) -> tuple[HeldOut | None, HeldOut | None]:
    """(the hold-out rule's score with three or more widths, the target's own sweep's score where it is swept and
    is not that point); a score the sweeps cannot give is None, its reason added to `notes`."""
    held = check = None
    widths = rows["width"].nunique()
    if widths >= 3:
        try:
            held = score()
        except ValueError as e:
            notes.append(f"no held-out score: {e}")
    swept = _at(rows, target).any()
    if swept and widths >= 2 and (held is None or (held.width, held.steps, held.batch_size, held.seq_len or 0)
                                  != target):
        try:
            check = score(point=target)
        except ValueError as e:
            notes.append(f"no check on the target's own sweep: {e}")
    return held, check


def forecast(table: pd.DataFrame, *, target_width: int, target_steps: int, target_batch_size: int, steps: int,
             batch_size: int, batch_steps: Mapping[int, int] | None = None, transferred_lr: float | None = None,
             n_params: Mapping[int, float] | None = None, seq_len: int | None = None, parametrization: str = "mup",
             phase: str = "validate", level: float = 0.95) -> Forecast:
    """The target's optimal lr from the validate sweeps of `parametrization` (module docstring).

    `table`'s `phase` rows are the lr sweeps (rows whose `swept` is another hparam, and a depth sweep's, are left
    out); `steps`, `batch_size`, `batch_steps`: what rows without a `horizon` (`batch_size`) trained (the validate
    horizon, the base batch, a batch sweep's steps per batch size: `sweep_optima`). `transferred_lr`: the tune
    winner's lr, whose expected regret at the target is stated. `seq_len`: the target's tokens per sequence, and
    that of the rows without a `seq_len` (a context sweep's rows carry theirs); with `n_params` (width →
    non-embedding parameters, the target's and the swept widths') it adds Step Law's η*(N, D). The held-out score
    needs three or more widths; the target check, the target's own sweep; the leave-out scoring and its conformal
    interval, three or more widths (`leave_out_score`)."""
    rows = _keyed(table, steps, batch_size, parametrization, phase, batch_steps, seq_len)
    optima = _optima(rows, phase)
    fitted, edges = _fitted(optima)
    fit = fit_optimum_law(fitted)
    target = {"width": target_width, "steps": target_steps, "batch_size": target_batch_size, "seq_len": seq_len or 0}
    if "seq_len" in fit.terms and not seq_len:
        raise ValueError("the sweeps vary seq_len: the forecast needs the target's seq_len (the spec's data.seq_len)")
    mean, se = fit.predict(target)
    interval = _interval(fit, mean, se, level)
    near = _nearest(fitted, target)
    at = fitted[_at(fitted, near)] if near else fitted.iloc[0:0]
    k = float(at["curvature"].mean()) if near else None
    reference = float(at["optimum_loss"].mean()) if near else None
    variance = se**2 if se is not None else 0.0
    regret = k * ((np.log2(transferred_lr) - mean) ** 2 + variance) if k is not None and transferred_lr else None
    swept = {axis: _axis_values(rows, axis) for axis in AXES}
    notes = [n for n in (
        _absent(fit.terms, target, swept),
        *(f"{a} moves with a term before it in the sweeps: its effect is in that term's" for a in fit.collinear),
        "as many optima as coefficients: no interval" if se is None else "",
        f"{len(edges)} optima on the lr grid's edge left out of the fit" if edges else "",
        "no curve has a parabola at its optimum: no curvature, no regret" if k is None else "") if n]
    law = None
    if n_params is not None and seq_len is not None and target_width in n_params:
        law = step_law_lr(n_params[target_width], target_steps * target_batch_size * seq_len)
    common: dict[str, Any] = {"steps": steps, "batch_size": batch_size, "batch_steps": batch_steps,
                              "n_params": n_params, "seq_len": seq_len, "parametrization": parametrization,
                              "phase": phase, "level": level}
    held, check = _scores(partial(held_out_score, table, **common), rows,
                          (target_width, target_steps, target_batch_size, seq_len or 0), notes)
    leave_out = leave_out_score(table, **common) if rows["width"].nunique() >= 3 else None
    q = leave_out.multiplier if leave_out else None
    return Forecast(
        parametrization=parametrization, target_width=target_width, target_steps=target_steps,
        target_batch_size=target_batch_size, terms=fit.terms,
        coefficients=dict(zip(["intercept", *fit.terms], fit.beta, strict=True)),
        coefficient_ci=_coefficient_ci(fit, level),
        n_points=fit.n, dof=fit.dof, residual_sd=fit.residual_sd, log2_lr=mean, lr=float(2.0**mean),
        interval=interval, se=se, curvature=k, curvature_at=near[:3] if near else None, reference_loss=reference,
        transferred_lr=transferred_lr, regret=regret,
        regret_pct=100 * regret / reference if regret is not None and reference else None,
        forecast_regret=k * variance if k is not None and se is not None else None,
        steplaw_lr=law, edges=edges, held_out=held, target_check=check, note="; ".join(notes),
        target_seq_len=seq_len, leave_out=leave_out,
        conformal_interval=(mean - q * se, mean + q * se) if q is not None and se is not None else None)


def _signed(x: float) -> str:
    """`x` to two decimals with its sign, a rounded zero as +0.00."""
    text = f"{x:+.2f}"
    return "+0.00" if float(text) == 0 else text


def _said(h: HeldOut, what: str) -> str:
    nats = f", {h.regret:+.3g} nats" if h.regret is not None else ", outside the swept grid"
    law = ""
    if h.steplaw_error_log2 is not None:
        law_nats = f", {h.steplaw_regret:+.3g} nats" if h.steplaw_regret is not None else ", outside the swept grid"
        law = f"; Step Law {_signed(h.steplaw_error_log2)} log2{law_nats}"
    return (f"{what} (width {h.width}, {h.steps} steps, batch {h.batch_size}; fitted on {h.n_fit} optima): "
            f"error {_signed(h.error_log2)} log2{nats}{law}")


def _covered(k: int | None, n: int) -> str:
    return f"covered {k}/{n} held-out points" if k is not None else f"coverage not measurable on {n} points"


def _intervals(f: Forecast) -> str:
    """The t-interval with its coverage, and the conformal interval with its multiplier and coverage."""
    if f.interval is None:
        return " (no interval: no residual dof)"
    lo, hi = (2.0**x for x in f.interval)
    lo_out = f.leave_out
    if lo_out is None:
        return f" [95 % t {lo:.3g}, {hi:.3g}; coverage not measured: fewer than three widths]"
    text = f" [95 % t {lo:.3g}, {hi:.3g}; {_covered(lo_out.t_covered, lo_out.t_scored)}]"
    if f.conformal_interval is None or lo_out.multiplier is None:
        return text + f" (no conformal interval: {lo_out.note or 'no standard error at the target'})"
    c_lo, c_hi = (2.0**x for x in f.conformal_interval)
    how = {"leave-out": "leave-one-out", "pooled": "the catalog's pooled multiplier",
           "max": f"each against the others' largest; {lo_out.note}"}[lo_out.source]
    return text + (f" [{100 * (lo_out.level or 0):.0f} % conformal {c_lo:.3g}, {c_hi:.3g} (±{lo_out.multiplier:.2f} "
                   f"se); {_covered(lo_out.covered, lo_out.scored)}, {how}]")


def _distribution(lo_out: LeaveOut) -> str:
    e, law = lo_out.errors, lo_out.steplaw

    def said(s: ErrorSummary) -> str:
        nats = (f", {s.median_nats:.3g} nats (p90 {s.p90_nats:.3g})" if s.median_nats is not None and
                s.p90_nats is not None else "")
        return f"{s.median_log2:.2f} log2 (p90 {s.p90_log2:.2f}){nats}"

    if e.median_log2 is None:
        return "leave-out: no swept point could be predicted without its width"
    steplaw = f"; Step Law {said(law)}" if law is not None and law.median_log2 is not None else ""
    return f"leave-out over {e.n} points: median |error| {said(e)}{steplaw}"


def forecast_line(f: Forecast) -> str:
    """The forecast in one line: the target's predicted η* with its t-interval and conformal interval, each with the
    coverage it achieved on the held-out points, the transferred lr's expected regret, Step Law beside it, the
    leave-out errors' distribution and the held-out errors when scored."""
    terms = "".join(f" {_signed(f.coefficients[t])}·log2 {t}" for t in f.terms)
    parts = [f"Forecast of {f.parametrization}'s optimal lr at width {f.target_width}, {f.target_steps} steps, batch "
             f"{f.target_batch_size}: {f.lr:.3g} (log2 {_signed(f.log2_lr)}){_intervals(f)}, from {f.n_points} "
             f"optima (log2 η* = {_signed(f.coefficients['intercept'])}{terms})"]
    if f.regret is not None and f.transferred_lr is not None:
        pct = f" ({f.regret_pct:+.2g} %)" if f.regret_pct is not None else ""
        parts.append(f"transferred lr {f.transferred_lr:.3g}: expected regret {f.regret:+.3g} nats{pct}")
    parts.append(f"Step Law η*(N, D) {f.steplaw_lr:.3g}" if f.steplaw_lr is not None else
                 "no Step Law baseline (no non-embedding parameter count N for this family)")
    if f.leave_out is not None:
        parts.append(_distribution(f.leave_out))
    for h, what in ((f.held_out, "held out"), (f.target_check, "the target's own sweep")):
        if h is not None:
            parts.append(_said(h, what))
    return "; ".join(parts) + "."
