"""The lr forecast on synthetic sweeps with a known power law: log2 η* = -6 + B·log2(w/32) + C·log2(s/100) plus a
per-seed offset, the loss a parabola of curvature K in log2 lr around it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.forecast import STEP_LAW, forecast, forecast_line, held_out_score, step_law_lr, sweep_optima
from analysis.report import forecast_section
from tests.analysis._tables import trials

B, C, K = -0.3, -0.5, 0.05
WIDTHS, HORIZONS, SEEDS = (32, 64, 128), (100, 200, 400), 4
LOG2_LRS = range(-12, -1)
N_PARAMS = {32: 1.0e4, 64: 2.5e4, 128: 7.0e4, 512: 6.0e5}


def _optimum(width: float, steps: float) -> float:
    return -6.0 + B * np.log2(width / 32) + C * np.log2(steps / 100)


def _sweep(widths=WIDTHS, horizons=HORIZONS, seeds=SEEDS, noise=0.08, batches=(None,), d=0.0, shift=None, seed=0):
    """The lr sweeps; `shift(width, steps)` moves one curve's optimum (a grid edge), `d` the batch exponent."""
    rng = np.random.default_rng(seed)
    rows = []
    for w in widths:
        for s in horizons:
            for b in batches:
                for k in range(seeds):
                    opt = _optimum(w, s) + d * np.log2((b or 16) / 16) + rng.normal(0, noise)
                    opt += shift(w, s) if shift else 0.0
                    for x in LOG2_LRS:
                        rows.append({"width": w, "horizon": s, "seed": k, "lr": 2.0**x, "swept": "lr",
                                     "eval_loss": 3.0 - 0.1 * np.log2(w) + K * (x - opt) ** 2,
                                     **({"batch_size": b} if b else {})})
    return trials(rows, phase="validate")


def _forecast(table, **kw):
    args = {"target_width": 512, "target_steps": 800, "target_batch_size": 16, "steps": 100, "batch_size": 16,
            "n_params": N_PARAMS, "seq_len": 64} | kw
    return forecast(table, **args)


def test_the_fit_recovers_the_exponents_and_its_interval_covers_the_truth():
    f = _forecast(_sweep())
    assert f.terms == ["width", "steps"] and f.n_points == 3 * 3 * SEEDS and f.dof == f.n_points - 3
    assert abs(f.coefficients["width"] - B) < 0.06 and abs(f.coefficients["steps"] - C) < 0.06
    lo, hi = f.coefficient_ci["width"] or (0, 0)
    assert lo < B < hi
    truth = _optimum(512, 800)
    assert f.interval is not None and f.interval[0] < truth < f.interval[1]
    assert abs(f.log2_lr - truth) < 0.25 and f.lr == pytest.approx(2.0**f.log2_lr)
    assert f.curvature == pytest.approx(K) and f.curvature_at == (128, 400, 16)
    assert f.edges == [] and f.note == ""


def test_the_interval_covers_the_truth_in_most_draws():
    covered = []
    for seed in range(20):
        f = _forecast(_sweep(seed=seed, seeds=2, noise=0.15))
        assert f.interval is not None
        covered.append(f.interval[0] < _optimum(512, 800) < f.interval[1])
    assert sum(covered) >= 16  # 95 % nominal: 19 of 20 expected


def test_the_regret_of_the_transferred_lr_is_curvature_times_the_squared_miss():
    f = _forecast(_sweep(), transferred_lr=2.0**-6)
    assert f.se is not None and f.regret is not None and f.reference_loss is not None
    miss = -6 - f.log2_lr  # the tuned lr sits at width 32's optimum, ≈ 2.1 octaves above the target's
    assert f.regret == pytest.approx(K * (miss**2 + f.se**2))
    assert f.regret_pct == pytest.approx(100 * f.regret / f.reference_loss)
    assert f.forecast_regret == pytest.approx(K * f.se**2) and f.forecast_regret < 0.01 * f.regret
    line = forecast_line(f)
    assert "Forecast of mup's optimal lr at width 512, 800 steps, batch 16" in line
    assert f"expected regret {f.regret:+.3g} nats" in line and "Step Law η*(N, D)" in line


def test_the_held_out_point_is_predicted_within_a_quarter_octave_and_step_law_scored_beside_it():
    table = _sweep()
    h = held_out_score(table, steps=100, batch_size=16, n_params=N_PARAMS, seq_len=64)
    assert (h.width, h.steps, h.batch_size) == (128, 400, 16)
    assert h.terms == ["width", "steps"] and h.n_fit == 2 * 2 * SEEDS  # widths 32, 64 at 100 and 200 steps
    assert abs(h.error_log2) < 0.25 and h.regret is not None and 0 <= h.regret < K * 0.25**2 + 1e-9
    assert abs(h.observed_log2_lr - _optimum(128, 400)) < 0.15
    law = math.log2(step_law_lr(N_PARAMS[128], 400 * 16 * 64))
    assert h.steplaw_log2_lr == pytest.approx(law)
    assert h.steplaw_error_log2 == pytest.approx(law - h.observed_log2_lr)
    assert abs(h.steplaw_error_log2) > abs(h.error_log2)
    f = _forecast(table)
    assert f.held_out == h and f.target_check is None  # the target, 512 wide, has no sweep of its own


def test_with_two_horizons_both_stay_in_the_fit():
    h = held_out_score(_sweep(horizons=(100, 400)), steps=100, batch_size=16)
    assert h.terms == ["width", "steps"] and h.n_fit == 2 * 2 * SEEDS  # widths 32, 64 at both horizons
    assert (h.width, h.steps) == (128, 400)


def test_a_term_is_dropped_where_its_axis_does_not_vary():
    table = _sweep(horizons=(100,)).drop(columns=["horizon"])
    f = _forecast(table)
    assert f.terms == ["width"] and set(f.coefficients) == {"intercept", "width"}
    assert f.note == "the sweeps fix the training steps at 100: the optimum is taken not to move from there to the " \
                     "target's 800"
    assert abs(f.log2_lr - _optimum(512, 100)) < 0.25  # the steps' move is not forecast
    assert "held out" not in forecast_line(_forecast(_sweep(widths=(32, 64), horizons=(100,))))


def test_without_a_parameter_count_the_line_says_there_is_no_step_law_baseline():
    line = forecast_line(_forecast(_sweep(), n_params=None))
    assert "no Step Law baseline" in line and "Step Law η*(N, D)" not in line


def test_a_batch_sweep_adds_a_batch_term():
    table = _sweep(widths=(32, 64), horizons=(100,), batches=(8, 16, 32), d=0.5, seeds=2)
    f = _forecast(table, target_width=256, target_steps=100, target_batch_size=64)
    assert f.terms == ["width", "batch_size"] and abs(f.coefficients["batch_size"] - 0.5) < 0.1
    assert abs(f.log2_lr - (_optimum(256, 100) + 0.5 * 2)) < 0.3


def test_diverged_runs_and_other_sweeps_are_handled():
    table = _sweep()
    high = table["lr"] >= 2.0**-2
    table.loc[high, "status"] = "diverged"
    table.loc[high, "eval_loss"] = math.nan
    table.loc[(table["lr"] == 2.0**-3) & (table["width"] == 128), "eval_loss"] = math.inf
    other = table.iloc[:3].assign(swept="w_H", eval_loss=0.0)  # another hparam's sweep: never an lr optimum
    f = _forecast(pd.concat([table, other], ignore_index=True))
    assert f.n_points == 3 * 3 * SEEDS and abs(f.coefficients["width"] - B) < 0.06
    optima = sweep_optima(table, steps=100, batch_size=16)
    assert len(optima) == 3 * 3 * SEEDS and not optima["at_grid_edge"].any()


def test_grid_edge_optima_are_left_out_and_listed():
    table = _sweep(shift=lambda w, s: 6.0 if (w, s) == (64, 200) else 0.0)  # optimum past the grid's top
    f = _forecast(table)
    assert f.edges == [f"w64-t200-b16-s{k}" for k in range(SEEDS)]
    assert f.n_points == (3 * 3 - 1) * SEEDS and abs(f.coefficients["width"] - B) < 0.06
    assert f"{SEEDS} optima on the lr grid's edge left out of the fit" in f.note


def test_without_residual_dof_there_is_no_interval():
    f = _forecast(_sweep(widths=(32, 64), horizons=(100, 200), seeds=1, noise=0.0))
    assert f.n_points == 4 and f.dof == 1 and f.interval is not None
    f = _forecast(_sweep(widths=(32, 64), horizons=(100,), seeds=1, noise=0.0))
    assert f.dof == 0 and f.interval is None and f.se is None and f.residual_sd is None
    assert f.coefficient_ci == {"intercept": None, "width": None}
    assert "as many optima as coefficients: no interval" in f.note
    assert "(no interval: no residual dof)" in forecast_line(f)
    assert abs(f.coefficients["width"] - B) < 1e-9


def test_the_targets_own_sweep_is_checked_without_its_width():
    table = _sweep()
    f = _forecast(table, target_width=64, target_steps=400)
    check = f.target_check
    assert check is not None and (check.width, check.steps) == (64, 400)
    assert check.terms == ["width", "steps"] and abs(check.error_log2) < 0.3
    assert f.held_out is not None and f.held_out.width == 128
    section = forecast_section(f)
    assert "| held out |" in section and "| target's own sweep |" in section and "Step Law" in section


def test_too_few_optima_name_the_fix():
    table = _sweep(widths=(32, 64), horizons=(100,), seeds=1, shift=lambda w, s: 6.0 if w == 64 else 0.0)
    with pytest.raises(ValueError, match="widen validate.lrs"):
        _forecast(table.assign(eval_loss=np.where(table["width"] == 32, 9.0 - table["lr"], table["eval_loss"])))


def test_step_law_is_the_closed_form():
    n, d = 1.0e9, 1.0e11
    assert step_law_lr(n, d) == pytest.approx(math.exp(math.log(1.79) - 0.713 * math.log(n) + 0.307 * math.log(d)))
    assert step_law_lr(n, d) == pytest.approx(1.79 * n**-0.713 * d**0.307)
    assert STEP_LAW == {"coefficient": 1.79, "n_exponent": -0.713, "d_exponent": 0.307}
    assert 3e-4 < step_law_lr(n, d) < 3e-3  # a 1B model on 100B tokens: a few 1e-4 to 1e-3, as LLMs train
    with pytest.raises(ValueError, match="n_params > 0"):
        step_law_lr(0, d)


def test_a_batch_sweep_at_fixed_tokens_takes_its_steps_and_says_they_move_together():
    """Batch 8, 16, 32 trained 200, 100, 50 steps (validate.batch_fixed: tokens): log2 steps = const − log2 batch."""
    table = _sweep(widths=(32, 64), horizons=(100,), batches=(8, 16, 32), d=0.5, seeds=2).drop(columns=["horizon"])
    steps = {8: 200, 16: 100, 32: 50}
    optima = sweep_optima(table, steps=100, batch_size=16, batch_steps=steps)
    assert set(zip(optima["batch_size"], optima["steps"], strict=True)) == {(8, 200), (16, 100), (32, 50)}
    f = _forecast(table, batch_steps=steps, target_width=256, target_steps=100, target_batch_size=16)
    assert f.terms == ["width", "steps"]  # batch moves with steps: its effect is in steps' (−0.5 per doubling)
    assert abs(f.coefficients["steps"] + 0.5) < 0.1
    assert "batch_size moves with a term before it in the sweeps" in f.note


def test_a_batch_sweep_keeps_every_batch_size_in_the_held_out_fit():
    """Widths 32–128, one horizon and a batch sweep at a fixed token budget: leaving batch 32 out of the fit would
    leave steps and batch collinear; with every batch size kept the held-out point is predicted."""
    table = _sweep(horizons=(100,), batches=(8, 16, 32), d=0.5, seeds=2, noise=0.0).drop(columns=["horizon"])
    h = held_out_score(table, steps=100, batch_size=16, batch_steps={8: 200, 16: 100, 32: 50})
    assert (h.width, h.steps, h.batch_size) == (128, 200, 8)  # the longest steps at 128: batch 8's
    assert h.terms == ["width", "steps"] and h.n_fit == 2 * 3 * 2 and abs(h.error_log2) < 1e-6
