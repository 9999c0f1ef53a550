"""The batch sweep judged on synthetic trial tables: the lr optimum's drift per doubling of the batch size, recovered
with its interval, beside the √B and linear rules; the regret of carrying the base batch's lr; the figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import carried_line, carried_regrets, lr_drift, plot_sweep
from analysis.regret import base_of
from studies.sweeps.batch import RULES, SWEEP, nearest_rule, rules_text
from tests.analysis._tables import trials

BATCH = SWEEP.axis


def batch_regret(table, base_batch):
    return carried_regrets(table, base_batch, BATCH)


def batch_regret_line(regrets, width=64):
    return carried_line(regrets, width, title="Batch", label="batch", words="batch size")


def plot_batch(table, path):
    return plot_sweep(table, path, BATCH, SWEEP.legend)

BATCHES = [8, 16, 32, 64]
LRS = [2.0**k for k in range(-11, -1)]  # 2^-11 … 2^-2: every optimum inside the grid
SLOPE = {"mup": 0.5, "standard": 1.0}  # the true drift of log2(lr*) per doubling of the batch size
CURVATURE = 0.05  # nats per octave² away from the optimum


def _optimum(param: str, batch: int) -> float:
    """log2 of the true optimal lr: 2^-8 at batch 8, moving SLOPE[param] per doubling."""
    return -8.0 + SLOPE[param] * np.log2(batch / 8)


def _table(seeds: int = 3, width: int = 64, noise: float = 0.1, **extra: object) -> pd.DataFrame:
    """A batch sweep at `width`: each seed's optimum shifted by up to ±`noise` octaves (so the interval has a width)."""
    rng = np.random.default_rng(0)
    rows = []
    for param in SLOPE:
        for batch in BATCHES:
            for seed in range(seeds):
                shift = rng.uniform(-noise, noise)
                for lr in LRS:
                    x = np.log2(lr) - _optimum(param, batch) - shift
                    rows.append({"parametrization": param, "batch_size": batch, "seed": seed, "lr": lr,
                                 "width": width, "swept": "lr", "eval_loss": 4.0 + CURVATURE * x**2, **extra})
    return trials(rows, phase="validate")


def test_the_drift_per_doubling_of_batch_is_recovered_with_its_interval():
    drift = lr_drift(_table(), axis=BATCH)
    assert drift.axis == "batch" and abs(drift.mup_drift - 0.5) < 0.05
    assert drift.standard_drift is not None and abs(drift.standard_drift - 1.0) < 0.05
    for param, slope in SLOPE.items():
        ci = drift.drift_ci[param]
        assert ci is not None and ci[0] < slope < ci[1] and ci[1] - ci[0] < 0.5
    assert {o.at for o in drift.optima} == set(BATCHES) and {o.width for o in drift.optima} == {64}
    assert "per doubling of batch size" in drift.verdict and "fail" in drift.verdict  # +0.5 is not ≤ 0.5 - noise
    assert drift.passed == (abs(drift.mup_drift) <= 0.5)


def test_the_drift_along_batch_needs_one_widths_rows():
    two = pd.concat([_table(width=32), _table(width=64)], ignore_index=True)
    with pytest.raises(ValueError, match="needs one width's rows, not widths \\[32, 64\\]"):
        lr_drift(two, axis=BATCH)
    assert lr_drift(two[two["width"] == 32], axis=BATCH).optima[0].width == 32


def test_one_batch_size_has_no_drift_and_says_what_to_add():
    one = _table()
    with pytest.raises(ValueError, match="at least two batch_sizes per parametrization"):
        lr_drift(one[one["batch_size"] == 16], axis=BATCH)


def test_the_rules_text_names_the_nearest_rule_and_what_the_interval_holds():
    drift = lr_drift(_table(), axis=BATCH)
    text = rules_text(drift)
    assert text.startswith(f"mup's optimal lr at width 64 moves {drift.mup_drift:+.2f} [95 % CI ")
    assert "per doubling of the batch size: nearest the √B rule (+0.5; unchanged 0, linear +1.0)" in text
    assert text.endswith("the interval holds √B")
    standard = rules_text(drift, "standard")
    assert "nearest the linear rule (+1.0; unchanged 0, √B +0.5)" in standard and standard.endswith("holds linear")
    two = _table(seeds=1)
    two = two[two["batch_size"] <= 16]  # one seed at two batch sizes: two optima, no interval
    few = rules_text(lr_drift(two, axis=BATCH))
    assert "(too few optima for an interval)" in few and "interval holds" not in few


@pytest.mark.parametrize(("drift", "rule"), [(0.0, "unchanged"), (0.2, "unchanged"), (0.25, "unchanged"),
                                             (0.3, "√B"), (0.74, "√B"), (0.8, "linear"), (1.6, "linear"),
                                             (-0.4, "unchanged")])
def test_nearest_rule(drift, rule):
    assert nearest_rule(drift) == rule and RULES == {"unchanged": 0.0, "√B": 0.5, "linear": 1.0}


def test_the_regret_of_carrying_the_base_batchs_lr():
    """mup's optimum at batch 8 is 2^-8; at batch 32 it is 2^-7 (one octave higher): carrying 2^-8 there costs
    CURVATURE · 1² nats; standard's moves two octaves: 4 × that."""
    regrets = batch_regret(_table(noise=0.0), base_batch=8)
    assert [(r.parametrization, r.at) for r in regrets] == [
        ("mup", 16), ("mup", 32), ("mup", 64), ("standard", 16), ("standard", 32), ("standard", 64)]
    by = {(r.parametrization, r.at): r for r in regrets}
    for (param, batch), r in by.items():
        octaves = SLOPE[param] * np.log2(batch / 8)
        assert r.width == 64 and r.hparam == "lr" and r.source == f"{param}'s own optimum at batch size 8"
        assert r.transferred == pytest.approx(2.0**-8, rel=1e-6)
        assert r.regret == pytest.approx(CURVATURE * octaves**2, abs=2e-3)
        assert r.regret_pct == pytest.approx(100 * r.regret / r.optimum_loss)
        assert r.ci is not None and r.n_seeds == 3
    line = batch_regret_line(regrets)
    assert line is not None and line.startswith("Batch regret in lr at width 64: batch 16: mup +0.0125 nats")
    assert "mup carries mup's own optimum at batch size 8" in line
    assert batch_regret_line(regrets, width=32) is None


def test_an_unswept_base_batch_carries_the_nearest_swept_one():
    assert base_of([8, 16, 32], 16) == 16 and base_of([8, 32], 16) == 8 and base_of([16, 64], 40) == 64
    regrets = batch_regret(_table(noise=0.0), base_batch=12)  # nearest in log2: 16 (0.42 octave) over 8 (0.58)
    assert {r.at for r in regrets} == {8, 32, 64}
    assert all(r.source.endswith("at batch size 16") for r in regrets)


def test_plot_batch_clips_the_axis_and_marks_diverged_points(tmp_path):
    table = _table(seeds=1)
    blown = (table["lr"] == LRS[-1]) & (table["batch_size"] == 64)
    table.loc[blown & (table["parametrization"] == "mup"), "eval_loss"] = 1e4  # far off the scale
    table.loc[blown & (table["parametrization"] == "standard"), "status"] = "diverged"
    limits = plot_batch(table, tmp_path / "batch.png")
    data = (tmp_path / "batch.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    assert len(limits) == 2 and all(lim is not None and lim[1] < 100 for lim in limits)  # 1e4 is a ^ marker
    with pytest.raises(ValueError, match="no sweep along the batch size"):
        plot_batch(table.iloc[0:0], tmp_path / "none.png")
