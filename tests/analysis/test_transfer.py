"""Per-width transfer summary and the lr-drift verdict, on synthetic sweeps with known answers."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis.transfer import lr_curves, lr_drift, transfer_table
from studies.sweeps import SWEEPS
from tests.analysis._tables import SWEEP_WIDTHS, paper_like_optimum, sweep_table, trials


def test_transfer_table_aggregates_seeds_per_width():
    table = trials(
        [
            {
                "width": 128,
                "seed": 0,
                "eval_loss": 2.8,
                "params": 4_000_000,
                "tokens": 200,
                "wall_time_s": 20.0,
            },
            {"width": 128, "seed": 1, "status": "diverged", "params": 4_000_000, "tokens": 50},
            {"width": 128, "seed": 2, "status": "failed", "params": 4_000_000},
            {"width": 64, "seed": 0, "eval_loss": 3.0, "tokens": 100, "wall_time_s": 10.0},
            {"width": 64, "seed": 1, "eval_loss": 3.2, "tokens": 100, "wall_time_s": 12.0},
        ],
        phase="transfer",
    )
    out = transfer_table(table)
    assert out["width"].tolist() == [64, 128]
    w64, w128 = out.iloc[0], out.iloc[1]
    assert w64["eval_loss_mean"] == pytest.approx(3.1)
    assert w64["eval_loss_std"] == pytest.approx(math.sqrt(0.02))
    assert (w64["n_seeds"], w64["n_diverged"], w64["n_failed"]) == (2, 0, 0)
    assert w64["wall_time_s"] == pytest.approx(11.0)
    assert w128["eval_loss_mean"] == pytest.approx(2.8)
    assert math.isnan(w128["eval_loss_std"])
    assert (w128["n_seeds"], w128["n_diverged"], w128["n_failed"]) == (1, 1, 1)
    assert w128["tokens"] == 200  # over the finished runs only
    assert w128["params"] == 4_000_000


def test_transfer_table_ignores_other_phases():
    table = trials([{"eval_loss": 3.0}, {"eval_loss": 1.0, "phase": "tune"}], phase="transfer")
    assert transfer_table(table)["eval_loss_mean"].tolist() == [3.0]
    assert transfer_table(table, phase=None)["eval_loss_mean"].tolist() == [2.0]


def test_lr_drift_flat_for_mup_and_minus_one_for_standard():
    drift = lr_drift(sweep_table(paper_like_optimum))
    assert drift.mup_drift == pytest.approx(0.0, abs=1e-9)
    assert drift.standard_drift == pytest.approx(-1.0)
    assert drift.drift == pytest.approx({"mup": 0.0, "standard": -1.0})
    assert drift.passed
    assert "mup's optimal lr drifts +0.00 [-0.00, +0.00] log2(lr) per doubling of width" in drift.verdict
    assert "pass" in drift.verdict and "standard drifts -1.00 [-1.00, -1.00]" in drift.verdict
    mup_optima = [o for o in drift.optima if o.parametrization == "mup"]
    assert [o.log2_lr for o in mup_optima] == pytest.approx([-9.0] * len(SWEEP_WIDTHS))
    assert not any(o.at_grid_edge for o in drift.optima)


def test_lr_drift_fails_when_mup_drifts_past_the_threshold():
    drift = lr_drift(sweep_table(lambda p, w: -6 - np.log2(w / 64), parametrizations=("mup",)))
    assert drift.mup_drift == pytest.approx(-1.0)
    assert not drift.passed
    assert drift.standard_drift is None
    assert "fail" in drift.verdict
    assert lr_drift(
        sweep_table(lambda p, w: -6 - np.log2(w / 64), parametrizations=("mup",)), threshold=1.5
    ).passed


def test_a_diverged_seed_disqualifies_its_lr():
    table = sweep_table(paper_like_optimum, parametrizations=("mup",))
    at_opt = (table["width"] == 512) & (table["lr"] == 2.0**-9) & (table["seed"] == 1)
    table.loc[at_opt, "status"] = "diverged"
    curves = lr_curves(table)
    row = curves[(curves["width"] == 512) & (curves["lr"] == 2.0**-9)].iloc[0]
    assert np.isinf(row["eval_loss"]) and row["n_diverged"] == 1
    optimum = next(o for o in lr_drift(table).optima if o.width == 512)
    assert optimum.log2_lr in (-10.0, -8.0)


def test_an_optimum_on_the_grid_edge_is_flagged():
    drift = lr_drift(sweep_table(lambda p, w: -4, parametrizations=("mup",)))
    assert all(o.at_grid_edge for o in drift.optima)
    assert "edge of the lr grid" in drift.verdict


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (sweep_table(paper_like_optimum).query("width == 64"), "add a width to the validate sweep"),
        (sweep_table(paper_like_optimum, parametrizations=("standard",)), "no mup runs"),
        (sweep_table(paper_like_optimum).assign(status="diverged"), "add smaller learning rates"),
    ],
)
def test_lr_drift_errors_name_the_fix(table, message):
    with pytest.raises(ValueError, match=message):
        lr_drift(table)


def test_transfer_table_with_repeated_index_labels():
    one = trials([{"eval_loss": 3.0, "seed": 0}, {"status": "diverged", "seed": 1}], phase="transfer")
    out = transfer_table(pd.concat([one, one]), phase=None)
    assert (out.loc[0, "n_seeds"], out.loc[0, "n_diverged"]) == (2, 2)


def test_lr_optimum_is_interpolated_between_grid_points():
    """A parabola through the best grid lr and its neighbours finds an optimum between grid points; the drift
    fits the interpolated optima (the grid alone would say -0.4 for a true drift of -0.3)."""
    table = sweep_table(lambda p, w: -9.0 - 0.3 * np.log2(w / 64), parametrizations=("mup",))
    drift = lr_drift(table, threshold=0.5)
    interp = [o.log2_lr_interp for o in drift.optima]
    assert interp == pytest.approx([-9.0 - 0.3 * i for i in range(len(SWEEP_WIDTHS))])
    assert [o.log2_lr for o in drift.optima] == [-9.0, -9.0, -10.0, -10.0]  # the grid points are kept
    assert drift.mup_drift == pytest.approx(-0.3)
    assert "interpolated" in drift.verdict


def test_lr_optimum_next_to_a_diverged_lr_stays_on_the_grid():
    table = sweep_table(lambda p, w: -9.3, parametrizations=("mup",))
    table.loc[table["lr"] == 2.0**-10, "status"] = "diverged"
    optima = lr_drift(table).optima
    assert all(o.log2_lr_interp == o.log2_lr == -9.0 for o in optima)


def test_the_drift_interval_comes_from_each_seeds_own_optima():
    """Seeds whose optima scatter by ±0.4 octave around a flat μP optimum: the interval covers 0 and is wide;
    without scatter it collapses; one seed at two widths has no interval."""
    scatter = {0: -0.4, 1: 0.4, 2: 0.0}

    def noisy(seed_table):
        rows = seed_table.copy()
        shift = rows["seed"].map(scatter) * np.where(rows["width"] % 128 == 0, 1, -1)  # not a trend in width
        shift[rows["parametrization"] == "standard"] = 0.0
        optimum = [paper_like_optimum(p, w) for p, w in zip(rows["parametrization"], rows["width"], strict=True)]
        rows["eval_loss"] = 3.0 + 0.05 * (np.log2(rows["lr"]) - (optimum + shift)) ** 2
        return rows

    drift = lr_drift(noisy(sweep_table(paper_like_optimum, seeds=(0, 1, 2))))
    low, high = drift.drift_ci["mup"]
    assert low < 0.0 < high and high - low > 0.2
    assert drift.drift_ci["standard"] == pytest.approx((-1.0, -1.0), abs=1e-6)
    two_widths = sweep_table(paper_like_optimum, seeds=(0,))
    assert lr_drift(two_widths[two_widths["width"].isin([64, 128])]).drift_ci["mup"] is None


def test_a_swept_information_weight_is_judged_apart_from_lr():
    lr = sweep_table(paper_like_optimum).assign(swept="lr")
    w_h = sweep_table(lambda p, w: -9 if p == "mup" else -11 + np.log2(w / 64))  # values 2^-14..2^-4, as lr
    w_h["w_H"], w_h["lr"], w_h["swept"] = w_h["lr"], 2.0**-9, "w_H"
    table = pd.concat([lr, w_h], ignore_index=True)
    assert lr_drift(table).drift == pytest.approx({"mup": 0.0, "standard": -1.0})
    drift = lr_drift(table, hparam="w_H")
    assert drift.hparam == "w_H" and drift.drift == pytest.approx({"mup": 0.0, "standard": 1.0})
    assert "mup's optimal w_H drifts" in drift.verdict
    with pytest.raises(ValueError, match="sweep no 'w_dep'.*validate.hparams"):
        lr_drift(table, hparam="w_dep")


def _horizon_table(optimum, seeds=(0, 1, 2), width=64):
    """A horizon sweep at one width: the loss is a parabola in log2(lr) around optimum(steps, seed)."""
    rows = [{"parametrization": "mup", "width": width, "horizon": steps, "lr": 2.0**x, "seed": seed,
             "eval_loss": 3.0 - 0.1 * np.log2(steps) + 0.05 * (x - optimum(steps, seed)) ** 2}
            for steps in (150, 300, 600) for x in range(-14, -3) for seed in seeds]
    return trials(rows, phase="validate")


def test_the_lr_optimums_drift_per_doubling_of_steps():
    """The optimum falls 0.4 octave per doubling of steps; seeds scatter it by ±0.2 (not a trend), so the interval
    is the t-interval of the per-seed slope and covers -0.4."""
    scatter = {0: -0.2, 1: 0.2, 2: 0.0}
    table = _horizon_table(lambda steps, seed: -8.0 - 0.4 * np.log2(steps / 150) + scatter[seed] * (
        1 if steps == 300 else -1))
    drift = lr_drift(table, axis=SWEEPS["horizon"].axis)
    assert drift.axis == "horizon" and drift.mup_drift == pytest.approx(-0.4)
    assert [o.at for o in drift.optima] == [150, 300, 600] and {o.width for o in drift.optima} == {64}
    lo, hi = drift.drift_ci["mup"]
    assert lo < -0.4 < hi and hi - lo > 0.1
    assert drift.verdict.startswith("mup's optimal lr at width 64 drifts -0.40 [")
    assert "log2(lr) per doubling of training steps" in drift.verdict
    flat = lr_drift(_horizon_table(lambda steps, seed: -8.0), axis=SWEEPS["horizon"].axis)
    assert flat.mup_drift == pytest.approx(0.0, abs=1e-9) and flat.passed


def test_a_horizon_drift_needs_one_widths_rows():
    table = pd.concat([_horizon_table(lambda s, seed: -8.0), _horizon_table(lambda s, seed: -8.0, width=128)])
    with pytest.raises(ValueError, match="needs one width's rows"):
        lr_drift(table, axis=SWEEPS["horizon"].axis)
    with pytest.raises(ValueError, match="add a horizon to the validate sweep"):
        lr_drift(_horizon_table(lambda s, seed: -8.0).query("horizon == 150"), axis=SWEEPS["horizon"].axis)


def depth_sweep(rows):
    """A depth sweep's rows as the depth sweep judges them (`studies.sweeps.depth.Depth.rows`)."""
    rows = rows[rows["depth"].notna()] if "depth" in rows else rows.iloc[0:0]
    return rows.assign(parametrization=rows["depth_parametrization"], depth=rows["depth"].astype(int)) \
        if not rows.empty else rows


def _depth_table(optimum, seeds=(0, 1, 2), width=32):
    """A depth sweep at one width, as the validate phase writes it: `parametrization` the width one (mup), the depth
    parametrization beside it; the loss is a parabola in log2(lr) around optimum(depth parametrization, depth,
    seed)."""
    rows = [{"parametrization": "mup", "depth_parametrization": dp, "width": width, "depth": depth, "swept": "lr",
             "lr": 2.0**x, "seed": seed, "eval_loss": 3.0 + 0.05 * (x - optimum(dp, depth, seed)) ** 2}
            for dp in ("completep", "none") for depth in (2, 4, 8) for x in range(-14, -3) for seed in seeds]
    return trials(rows, phase="validate")


def test_the_lr_optimums_drift_per_doubling_of_depth_completep_judged_none_beside_it():
    """completep's optimum stays at 2^-8 (seeds scatter it by ±0.2), none's falls 0.8 octave per doubling of depth:
    completep passes and none's drift is reported with its own interval."""
    scatter = {0: -0.2, 1: 0.2, 2: 0.0}

    def optimum(dp, depth, seed):
        return -8.0 + (0.0 if dp == "completep" else -0.8 * np.log2(depth / 2)) + scatter[seed] * (depth == 4)

    rows = _depth_table(optimum)
    rows = pd.concat([rows, trials([{"parametrization": "mup", "width": 32, "swept": "lr", "lr": 0.01, "seed": 0,
                                     "eval_loss": 9.0}], phase="validate")])  # a width sweep's row: not a depth's
    sweep = depth_sweep(rows)
    assert len(sweep) == len(rows) - 1 and set(sweep["parametrization"]) == {"completep", "none"}
    drift = lr_drift(sweep, axis=SWEEPS["depth"].axis)
    assert drift.axis == "depth" and drift.mup_drift == pytest.approx(0.0, abs=1e-9)  # the judged one: completep
    assert drift.standard_drift == pytest.approx(-0.8) and drift.passed
    assert [(o.parametrization, o.at) for o in drift.optima] == [
        ("completep", 2), ("completep", 4), ("completep", 8), ("none", 2), ("none", 4), ("none", 8)]
    assert {o.width for o in drift.optima} == {32}
    lo, hi = drift.drift_ci["completep"]
    assert lo < 0.0 < hi and hi - lo > 0.05
    lo, hi = drift.drift_ci["none"]
    assert lo < -0.8 < hi
    assert drift.verdict.startswith("completep's optimal lr at width 32 drifts +0.00 [")
    assert "log2(lr) per doubling of depth" in drift.verdict and "; none drifts -0.80 [" in drift.verdict
    failing = lr_drift(depth_sweep(_depth_table(lambda dp, depth, seed: -8.0 - 0.8 * np.log2(depth / 2))),
                       axis=SWEEPS["depth"].axis)
    assert not failing.passed and "|drift| > 0.5: fail" in failing.verdict


def test_a_depth_drift_needs_completep_runs_and_two_depths():
    table = depth_sweep(_depth_table(lambda dp, depth, seed: -8.0))
    with pytest.raises(ValueError, match="has no completep runs"):
        lr_drift(table[table["parametrization"] == "none"], axis=SWEEPS["depth"].axis)
    with pytest.raises(ValueError, match="add a depth to the validate sweep"):
        lr_drift(table[table["depth"] == 2], axis=SWEEPS["depth"].axis)
    assert depth_sweep(trials([{"parametrization": "mup", "width": 32, "lr": 0.01, "seed": 0, "eval_loss": 3.0}],
                              phase="validate")).empty
