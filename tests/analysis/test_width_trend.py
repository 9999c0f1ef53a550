"""Wider is better, checked: the transferred hparams' eval loss against width, on hand-built tables whose trend is
known (falling, rising, flat within the seeds' noise, too few points, diverged and failed runs)."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis.transfer import BETTER, CAUSE, NOISE, UNJUDGED, WORSE, width_trends
from tests.analysis._tables import trials


def _table(losses: dict[int, list[float]], parametrization: str = "mup", **defaults: object):
    """Transfer rows: at each width one run per seed with the loss given."""
    return trials([{"width": w, "seed": s, "eval_loss": loss, "parametrization": parametrization}
                   for w, seeds in losses.items() for s, loss in enumerate(seeds)], phase="transfer", **defaults)


def test_a_falling_loss_is_wider_is_better():
    noise = [-0.01, 0.0, 0.012]
    [trend] = width_trends(_table({w: [5.3 - 0.15 * math.log2(w / 32) + e for e in noise] for w in (32, 64, 128)}))
    assert trend.verdict == BETTER and trend.slope == pytest.approx(-0.15) and trend.ci[1] < 0
    assert (trend.widths, trend.n_runs, trend.diverged, trend.warning) == ([32, 64, 128], 9, [], False)
    assert trend.line.startswith("wider is better under mup: eval loss 5.301 → 5.151 → 5.001 at widths 32, 64, 128 "
                                 "(-0.150 per doubling, 95 % interval [-0.")
    assert CAUSE not in trend.line


def test_a_rising_loss_is_a_warning_naming_the_widths_losses_and_cause():
    """The issue's numbers, one seed: 5.01 → 5.16 → 5.33; the interval from the residuals has 1 degree of freedom."""
    [trend] = width_trends(_table({32: [5.01], 64: [5.16], 128: [5.33]}))
    assert trend.verdict == WORSE and trend.warning and trend.ci[0] > 0
    assert trend.slope == pytest.approx(0.16) and trend.ci == pytest.approx((0.0866, 0.2334), abs=1e-3)
    assert trend.line == ("wider is worse under mup: eval loss 5.010 → 5.160 → 5.330 at widths 32, 64, 128 "
                          f"(+0.160 per doubling, 95 % interval [+0.087, +0.233]); {CAUSE}")


def test_a_flat_noisy_loss_is_within_noise():
    rng = np.random.default_rng(0)
    [trend] = width_trends(_table({w: list(5.0 + 0.05 * rng.standard_normal(3)) for w in (32, 64, 128, 256)}))
    assert trend.verdict == NOISE and trend.ci[0] < 0 < trend.ci[1] and not trend.warning
    assert trend.line.startswith("within noise under mup: eval loss ")


def test_too_few_runs_are_not_judged():
    [one_width] = width_trends(_table({64: [5.0, 5.1, 5.2]}))
    assert (one_width.verdict, one_width.slope, one_width.ci) == (UNJUDGED, None, None)
    assert one_width.line == ("not judged under mup: eval loss 5.100 at width 64 (3 finished runs: judging needs 3 "
                              "or more runs over 2 or more widths; add a transfer width or seeds)")
    [two_points] = width_trends(_table({64: [5.0], 128: [5.4]}))  # a slope, but no residual to size the noise
    assert two_points.verdict == UNJUDGED and two_points.slope == pytest.approx(0.4) and two_points.ci is None
    [none] = width_trends(_table({64: [math.nan]}, status="diverged"))
    assert none.verdict == UNJUDGED and none.widths == [] and none.line.startswith("not judged under mup: no run fini")


def test_diverged_and_failed_runs_are_left_out_and_the_diverged_named():
    clean = _table({32: [5.01], 64: [5.16], 128: [5.33]})
    [want] = width_trends(clean)
    broken = trials([{"width": 256, "status": "diverged"}, {"width": 256, "status": "completed"},  # NaN: diverged
                     {"width": 512, "status": "failed"}, {"width": 64, "eval_loss": math.inf}], phase="transfer")
    [trend] = width_trends(pd.concat([clean, broken], ignore_index=True))
    assert (trend.slope, trend.ci, trend.widths, trend.n_runs) == (want.slope, want.ci, want.widths, 3)
    assert trend.diverged == [64, 256] and "; runs diverged at widths 64, 256 (left out)" in trend.line


def test_mup_is_judged_and_standard_told_beside_it():
    table = pd.concat([_table({32: [5.3], 64: [5.1], 128: [4.9]}),
                       _table({32: [5.0], 64: [5.2], 128: [5.41]}, parametrization="standard")], ignore_index=True)
    mup, standard = width_trends(table)
    assert (mup.parametrization, mup.verdict) == ("mup", BETTER)
    assert (standard.parametrization, standard.verdict, standard.warning) == ("standard", WORSE, False)
    assert CAUSE not in standard.line  # standard scales nothing with width: its rise is no misconfiguration


def test_the_tuned_base_width_joins_from_the_tune_rows():
    """The best completed tune trial is the transferred hparams' run at the base width (ASHA-stopped trials and
    other phases' rows are not)."""
    tune = trials([{"eval_loss": 5.4, "lr": 0.02}, {"eval_loss": 5.01}, {"eval_loss": 4.0, "status": "stopped"}],
                  phase="tune", width=32)
    table = pd.concat([tune, _table({64: [5.16], 128: [5.33]})], ignore_index=True)
    [trend] = width_trends(table)
    assert trend.widths == [32, 64, 128] and trend.losses == pytest.approx([5.01, 5.16, 5.33])
    assert trend.verdict == WORSE
    [alone] = width_trends(table[table["phase"] == "transfer"])
    assert alone.widths == [64, 128] and alone.verdict == UNJUDGED
