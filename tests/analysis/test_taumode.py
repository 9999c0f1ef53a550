"""The taumode collapse warning over a monitoring table."""

import pandas as pd
import pytest

from analysis.taumode import collapse_warning


def table(medians, spreads, layer="layer0", steps=None):
    steps = steps or [10 * (i + 1) for i in range(len(medians))]
    return pd.DataFrame({"step": steps, f"tau.E_k.p50.{layer}": medians,
                         f"tau.E_k.p05.{layer}": [m - s / 2 for m, s in zip(medians, spreads, strict=True)],
                         f"tau.E_k.p95.{layer}": [m + s / 2 for m, s in zip(medians, spreads, strict=True)]})


def test_a_falling_median_with_a_shrinking_spread_is_flagged_at_the_step_it_shows():
    v = collapse_warning(table([2.0, 2.0, 2.0, 1.8, 1.6], [1.0, 1.0, 1.0, 0.8, 0.7]), window=3, tol=0.05)
    assert v.warned and [(f.step, f.layer) for f in v.flags] == [(40, "layer0"), (50, "layer0")]
    assert v.flags[0].median_change == pytest.approx(-0.1) and v.flags[0].spread_change == pytest.approx(-0.2)
    assert "layer0 at step 40" in v.verdict


@pytest.mark.parametrize(("medians", "spreads"), [
    ([2.0, 2.0, 2.0, 1.6], [1.0, 1.0, 1.0, 1.0]),  # median falls, spread holds: λ shifts, keys still spread
    ([2.0, 2.0, 2.0, 2.0], [1.0, 1.0, 1.0, 0.5]),  # spread shrinks at a steady median
    ([2.0, 2.0, 2.0, 1.98], [1.0, 1.0, 1.0, 0.98]),  # both fall, within tol
])
def test_one_sign_alone_or_a_change_within_tol_is_not_flagged(medians, spreads):
    v = collapse_warning(table(medians, spreads), window=3, tol=0.05)
    assert not v.warned and v.flags == [] and v.verdict == "no collapse sign in 1 layer(s) over 4 monitors"


def test_layers_are_judged_separately_and_unordered_rows_are_sorted_by_step():
    df = table([2.0, 1.5], [1.0, 0.5]).merge(table([2.0, 2.5], [1.0, 1.5], layer="layer1"), on="step")
    v = collapse_warning(df.iloc[::-1], window=1, tol=0.05)
    assert [(f.step, f.layer) for f in v.flags] == [(20, "layer0")]


def test_a_table_without_taumode_columns_has_nothing_to_flag_and_bad_settings_raise():
    assert not collapse_warning(pd.DataFrame({"step": [1, 2]})).warned
    with pytest.raises(ValueError, match="window=0 must be >= 1"):
        collapse_warning(table([1.0], [1.0]), window=0)
