"""Pure functions over tidy pandas tables: certificate, distances, transfer and coord checks, plots, reports.

Nothing here imports torch, ray, mlflow or fastapi; verdicts are pydantic models and figures are
PNGs written to paths the caller gives.

The trial table
---------------
One row per trial (a training run of one hparam configuration at one width):

==================  =======  ================================================================
column              type     meaning
==================  =======  ================================================================
trial_id            str      unique id of the trial
phase               str      ``tune`` | ``transfer`` | ``verify`` | ``validate`` | ``compare``
width               int      the model's width (for PT, ``d``, the number of Z labels)
seed                int      the training seed
status              str      ``completed`` | ``diverged`` | ``stopped`` (early, by the scheduler)
                             | ``failed`` (crashed: left out of every judgement)
eval_loss           float    final eval loss; NaN unless completed or stopped
best_eval_loss      float    lowest eval loss seen during the run
train_loss          float    the last training loss
steps, tokens       int      optimizer steps and training tokens seen
wall_time_s         float    the run's wall-clock time (a batched trial: its share of the batch's)
tokens_per_s        float    tokens / wall_time_s
params              int      the model's parameter count
eval_curve          str      JSON ``[[tokens, eval_loss], ...]`` at every evaluation (empty in older tables)
is_centre           bool     verify phase only: True for the runs of the unperturbed centre
                             (run with several seeds), False for the perturbed samples
parametrization     str      ``mup`` | ``standard`` (validate phase)
lr, ...             float    one column per hparam of the study's search space (its ``HPARAMS``)
family              str      compare phase: the model family (``pt``, ``bert``, ``ut``)
budget              float    compare phase: the parameter count the width was solved for
role                str      compare phase: ``transferred`` (tuned once at a proxy) or ``tuned``
train_flops         float    compare phase: training FLOPs computed from the shapes
swept               str      validate phase: the hparam the trial's sweep varies
horizon             int      validate phase, a horizon sweep: the steps the trial trains
depth               int      validate phase, a depth sweep: the depth the trial builds
batch_size          int      validate phase, a batch sweep: the sequences per step the trial trains at
optimizer           str      validate phase, an optimizer sweep: the trial's ``train.optimizer``
==================  =======  ================================================================

A run is judged *diverged* when its status is ``diverged`` or its ``eval_loss`` is not finite;
diverged runs count as worse than everything that finished (loss +inf).

The history table (loss curves): ``trial_id, step, eval_loss`` and optionally ``train_loss``.

The coordinate-check table: ``[parametrization,] width, step, name, rms``, where ``name`` is an
activation such as ``z_logits.iter2``, ``head_logits.iter0``, ``msg_dep.iter1`` or ``mlm_logits``
and ``rms`` its root-mean-square at that step (rows repeated over seeds are averaged).

Modules: ``certificate`` (the verify phase's local-optimality certificate), ``distance`` (relative distance from
the centre), ``neighbours`` (where an uncertified centre's better neighbours lie), ``optimizers`` (one optimizer
against another, each at its own transferred lr), ``transfer`` (per-width summary, width trend, lr drift),
``regret`` (what transfer cost against the validate sweep's optimum), ``batch`` (the batch sweep: its rows, the
drift beside the √B and linear rules, the regret of carrying the base batch's lr), ``forecast`` (the target's
optimal lr fitted over the sweeps' widths, horizons and batch sizes, scored on a held-out point beside Step Law),
``coord`` (coordinate-check slopes, verdict, plot), ``plots`` (the study's figures), ``family_ranking`` (the
compare study's families at equal parameter budgets: table and figure), ``report`` (Markdown, and HTML with the
figures inline), ``constants`` (the vocabulary and the sample-size rule, importable without numpy). Names are
loaded from their module on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the module it lives in: loaded on first use (PEP 562), so `from analysis import
# min_samples` pulls neither pandas nor scipy nor matplotlib, and a plot's caller alone pays for matplotlib.
_HOME = {
    **dict.fromkeys(("STATUSES", "WIDTH", "Axis", "TrialStatus", "min_samples"), "constants"),
    **dict.fromkeys(("Certificate", "certify", "confidence", "upper_bound", "verify_losses"), "certificate"),
    **dict.fromkeys(("compare_table", "plot_compare"), "family_ranking"),
    **dict.fromkeys(("Forecast", "HeldOut", "forecast", "forecast_line", "held_out_score", "step_law_lr"),
                    "forecast"),
    **dict.fromkeys(("CoordOffence", "CoordVerdict", "coord_slopes", "coord_verdict", "plot_coord"), "coord"),
    "relative_distance": "distance",
    **dict.fromkeys(("NeighbourAdvice", "neighbour_advice"), "neighbours"),
    **dict.fromkeys(("OptimizerGain", "gain_line", "optimizer_gain"), "optimizers"),
    **dict.fromkeys(("plot_mutransfer", "plot_sweep", "plot_transfer", "plot_tune_history", "plot_verify"),
                    "plots"),
    **dict.fromkeys(("markdown_table", "render_report", "report_html"), "report"),
    **dict.fromkeys(("Regret", "carried_line", "carried_regrets", "regret_line", "transfer_regret"), "regret"),
    **dict.fromkeys(("LRDrift", "LROptimum", "WidthTrend", "lr_curves", "lr_drift", "lr_optima",
                     "transfer_table", "tuned_base", "width_trends"), "transfer"),
}

if TYPE_CHECKING:
    from analysis.certificate import Certificate, certify, confidence, upper_bound, verify_losses
    from analysis.constants import STATUSES, WIDTH, Axis, TrialStatus, min_samples
    from analysis.coord import CoordOffence, CoordVerdict, coord_slopes, coord_verdict, plot_coord
    from analysis.distance import relative_distance
    from analysis.family_ranking import compare_table, plot_compare
    from analysis.forecast import Forecast, HeldOut, forecast, forecast_line, held_out_score, step_law_lr
    from analysis.neighbours import NeighbourAdvice, neighbour_advice
    from analysis.optimizers import OptimizerGain, gain_line, optimizer_gain
    from analysis.plots import plot_mutransfer, plot_sweep, plot_transfer, plot_tune_history, plot_verify
    from analysis.regret import Regret, carried_line, carried_regrets, regret_line, transfer_regret
    from analysis.report import markdown_table, render_report, report_html
    from analysis.transfer import (
        LRDrift,
        LROptimum,
        WidthTrend,
        lr_curves,
        lr_drift,
        lr_optima,
        transfer_table,
        tuned_base,
        width_trends,
    )


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"analysis.{_HOME[name]}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "Axis",
    "Certificate",
    "CoordOffence",
    "CoordVerdict",
    "Forecast",
    "HeldOut",
    "LRDrift",
    "LROptimum",
    "NeighbourAdvice",
    "OptimizerGain",
    "Regret",
    "STATUSES",
    "TrialStatus",
    "WIDTH",
    "WidthTrend",
    "carried_line",
    "carried_regrets",
    "certify",
    "compare_table",
    "confidence",
    "coord_slopes",
    "coord_verdict",
    "forecast",
    "forecast_line",
    "gain_line",
    "held_out_score",
    "lr_curves",
    "lr_drift",
    "lr_optima",
    "markdown_table",
    "min_samples",
    "neighbour_advice",
    "optimizer_gain",
    "plot_compare",
    "plot_coord",
    "plot_mutransfer",
    "plot_sweep",
    "plot_transfer",
    "plot_tune_history",
    "plot_verify",
    "regret_line",
    "relative_distance",
    "render_report",
    "report_html",
    "step_law_lr",
    "transfer_regret",
    "transfer_table",
    "tuned_base",
    "upper_bound",
    "verify_losses",
    "width_trends",
]
