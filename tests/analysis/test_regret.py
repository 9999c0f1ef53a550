"""Transfer regret on synthetic sweeps whose loss is an exact parabola in log2(lr): the optimum, its loss, the loss at
the transferred value and so the regret are known in closed form."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.regret import curve_loss_at, curve_minimum, regret_line, transfer_regret
from tests.analysis._tables import paper_like_optimum, sweep_table


def _loss(width, log2_lr, optimum, seed=0):
    """sweep_table's loss: 3 − 0.1·log2(width) + 0.05·(log2 lr − optimum)² + 0.001·seed."""
    return 3.0 - 0.1 * np.log2(width) + 0.05 * (log2_lr - optimum) ** 2 + 0.001 * seed


def _one(regrets, param, width, hparam="lr"):
    return next(r for r in regrets if (r.parametrization, r.width, r.hparam) == (param, width, hparam))


def test_regret_of_an_off_grid_centre_uses_the_parabola_and_the_optimum_is_its_minimum():
    """mup's optimum is 2^-9 at every width; the centre 2^-8.5 sits between grid points inside the parabola's
    bracket: the regret is exactly 0.05 · 0.5², positive, and in % of the optimum's loss."""
    regrets = transfer_regret(sweep_table(paper_like_optimum), {"lr": 2.0**-8.5}, [128, 256], proxy_width=64)
    r = _one(regrets, "mup", 128)
    optimum_loss = _loss(128, -9, -9) + 0.0005  # the seed mean of seeds 0 and 1
    assert r.transferred == 2.0**-8.5 and r.source == "the tuned centre"
    assert r.optimum == pytest.approx(2.0**-9) and r.optimum_loss == pytest.approx(optimum_loss)
    assert r.regret == pytest.approx(0.05 * 0.25)
    assert r.regret_pct == pytest.approx(100 * 0.05 * 0.25 / optimum_loss)
    assert r.loss == pytest.approx(optimum_loss + 0.0125)
    assert r.ci == pytest.approx((0.0125, 0.0125)) and r.n_seeds == 2 and r.note == ""


def test_the_optimum_between_grid_points_is_the_parabolas_minimum_not_the_best_grid_loss():
    """The optimum at 2^-9.3: the best grid point (2^-9) is 0.05·0.09 worse than the true minimum, so a centre
    on the best grid point still has that regret."""
    table = sweep_table(lambda p, w: -9.3, parametrizations=("mup",), seeds=(0,))
    r = _one(transfer_regret(table, {"lr": 2.0**-9}, [64]), "mup", 64)
    assert math.log2(r.optimum) == pytest.approx(-9.3)
    assert r.optimum_loss == pytest.approx(_loss(64, -9.3, -9.3))
    assert r.regret == pytest.approx(0.05 * 0.09)
    assert r.ci is None and r.note == "one seed: no interval"


def test_outside_the_parabolas_bracket_the_curve_is_interpolated_linearly_in_log_lr():
    x = np.arange(-14.0, -3.0)
    y = 0.05 * (x + 9) ** 2
    best = int(np.argmin(y))
    assert curve_minimum(x, y, best) == pytest.approx((-9.0, 0.0))
    assert curve_loss_at(x, y, best, -12.5) == pytest.approx(0.05 * (3**2 + 4**2) / 2)  # between 2^-13 and 2^-12
    assert curve_loss_at(x, y, best, -12.0) == pytest.approx(0.05 * 9)  # a grid point: its own loss
    assert curve_loss_at(x, y, best, -20.0) is None  # outside the grid: no extrapolation
    y[2] = np.inf
    assert curve_loss_at(x, y, best, -11.5) == math.inf  # next to a diverged value


def test_standard_carries_its_own_optimum_from_the_proxy_and_loses_what_its_drift_costs():
    """standard's optimum falls one octave per doubling from 2^-8 at 64: carried from 64, it is one octave off at 128
    (0.05 nats) and two at 256 (0.2 nats); the proxy width itself has no standard regret."""
    regrets = transfer_regret(sweep_table(paper_like_optimum), {"lr": 2.0**-9}, [64, 128, 256], proxy_width=64)
    assert [(r.parametrization, r.width) for r in regrets] == [
        ("mup", 64), ("mup", 128), ("mup", 256), ("standard", 128), ("standard", 256)]
    assert all(r.regret == pytest.approx(0.0, abs=1e-12) for r in regrets if r.parametrization == "mup")
    s128, s256 = _one(regrets, "standard", 128), _one(regrets, "standard", 256)
    assert s128.transferred == pytest.approx(2.0**-8) and s128.source == "standard's own optimum at width 64"
    assert s128.regret == pytest.approx(0.05) and s256.regret == pytest.approx(0.2)
    assert s256.regret_pct == pytest.approx(100 * 0.2 / (_loss(256, -10, -10) + 0.0005))


def test_the_interval_is_the_t_interval_of_each_seeds_own_regret():
    """Seeds whose optima scatter: each seed's regret is its own curve at the centre minus its own minimum."""
    offsets = {0: -0.4, 1: 0.0, 2: 0.6}
    table = sweep_table(lambda p, w: -9.0, parametrizations=("mup",), seeds=tuple(offsets))
    table["eval_loss"] = [_loss(w, np.log2(lr), -9.0 + offsets[s], s)
                          for w, lr, s in zip(table["width"], table["lr"], table["seed"], strict=True)]
    r = _one(transfer_regret(table, {"lr": 2.0**-9}, [128]), "mup", 128)
    per_seed = np.array([0.05 * o**2 for o in offsets.values()])
    half = stats.t.ppf(0.975, 2) * per_seed.std(ddof=1) / np.sqrt(3)
    assert r.ci == pytest.approx((per_seed.mean() - half, per_seed.mean() + half))
    assert r.regret > 0 and r.n_seeds == 3


def test_a_diverged_transferred_value_has_no_regret_but_says_so():
    table = sweep_table(paper_like_optimum, parametrizations=("mup",))
    table.loc[(table["width"] == 128) & (table["lr"] == 2.0**-6), "status"] = "diverged"
    regrets = transfer_regret(table, {"lr": 2.0**-6}, [128, 256])
    assert _one(regrets, "mup", 128).regret is None and _one(regrets, "mup", 128).note == \
        "diverged at the transferred value"
    assert _one(regrets, "mup", 256).regret == pytest.approx(0.05 * 9)
    outside = _one(transfer_regret(table, {"lr": 2.0**-20}, [256]), "mup", 256)
    assert outside.regret is None and "outside the swept grid" in outside.note


def test_other_swept_hparams_and_unswept_widths():
    table = sweep_table(paper_like_optimum, parametrizations=("mup",)).assign(swept="lr")
    w_h = sweep_table(lambda p, w: -6.0, parametrizations=("mup",)).assign(swept="w_H")  # optimum w_H = 2^-6
    w_h["w_H"], w_h["lr"] = w_h["lr"], 2.0**-9
    both = pd.concat([table, w_h], ignore_index=True)
    regrets = transfer_regret(both, {"lr": 2.0**-9, "w_H": 2.0**-5.5}, [128, 1024])  # 1024 is not swept
    assert {(r.hparam, r.width) for r in regrets} == {("lr", 128), ("w_H", 128)}
    assert _one(regrets, "mup", 128, "w_H").regret == pytest.approx(0.05 * 0.25)


def test_the_one_line_answer():
    regrets = transfer_regret(sweep_table(paper_like_optimum), {"lr": 2.0**-8.5}, [128], proxy_width=64)
    line = regret_line(regrets)
    assert line is not None and line.startswith("Transfer regret in lr at width 128: mup +0.0125 nats (+0.54 %)")
    assert "[95 % CI +0.0125, +0.0125], standard +0.05 nats (+2.2 %)" in line
    assert "standard carries standard's own optimum at width 64" in line
    assert regret_line(regrets, "w_H") is None
