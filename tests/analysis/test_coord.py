"""Coordinate-check slopes and verdict on synthetic rms = c·width^a tables."""

import numpy as np
import pandas as pd
import pytest

from analysis.coord import coord_slopes, coord_verdict
from tests.analysis._tables import COORD_WIDTHS, coord_table, mup_like


def test_coord_slopes_recover_the_exponent():
    table = coord_table({("mup", "a"): 0.0, ("mup", "b"): 0.5, ("standard", "a"): -1.0})
    slopes = coord_slopes(table)
    assert list(slopes.columns) == ["parametrization", "name", "step", "slope", "n_widths"]
    assert len(slopes) == 9
    got = slopes.groupby(["parametrization", "name"])["slope"].agg(["min", "max"])
    assert got.loc[("mup", "a")].tolist() == pytest.approx([0.0, 0.0], abs=1e-9)
    assert got.loc[("mup", "b")].tolist() == pytest.approx([0.5, 0.5])
    assert got.loc[("standard", "a")].tolist() == pytest.approx([-1.0, -1.0])
    assert (slopes["n_widths"] == len(COORD_WIDTHS)).all()


def test_coord_slopes_without_a_parametrization_column():
    slopes = coord_slopes(coord_table({("mup", "a"): 0.25}).drop(columns="parametrization"))
    assert list(slopes.columns) == ["name", "step", "slope", "n_widths"]
    assert slopes["slope"].tolist() == pytest.approx([0.25] * 3)


def test_a_zero_or_infinite_rms_leaves_the_slope_unfitted():
    table = coord_table({("mup", "a"): 0.0})
    table.loc[(table["step"] == 2) & (table["width"] == 64), "rms"] = np.inf
    table.loc[(table["step"] == 3) & (table["width"] == 128), "rms"] = [np.nan, 3.0]  # one seed blew up
    slopes = coord_slopes(table).set_index("step")["slope"]
    assert np.isnan(slopes[2]) and np.isnan(slopes[3])
    assert slopes[1] == pytest.approx(0.0, abs=1e-9)


def test_coord_slopes_need_two_widths():
    table = coord_table({("mup", "a"): 0.0})
    with pytest.raises(ValueError, match="at least two widths"):
        coord_slopes(table[table["width"] == 64])


def test_verdict_passes_flat_hidden_and_shrinking_output():
    verdict = coord_verdict(coord_slopes(coord_table(mup_like())))
    assert verdict.passed and verdict.offending == []
    assert verdict.n_judged == 12
    assert verdict.parametrization == "mup"
    assert verdict.verdict.startswith("coordinate check passes")


@pytest.mark.parametrize("hidden", [0.5, -0.5])
def test_verdict_fails_a_hidden_activation_that_grows_or_shrinks(hidden):
    exponents = mup_like() | {("mup", "msg_dep.iter1"): hidden}
    verdict = coord_verdict(coord_slopes(coord_table(exponents)))
    assert not verdict.passed
    assert {(o.name, o.step) for o in verdict.offending} == {("msg_dep.iter1", s) for s in (1, 2, 3)}
    assert verdict.offending[0].slope == pytest.approx(hidden)
    assert verdict.offending[0].rule == "|slope| <= 0.2"
    assert "msg_dep.iter1" in verdict.verdict


def test_verdict_fails_a_growing_output():
    verdict = coord_verdict(coord_slopes(coord_table(mup_like(output=0.5))))
    assert not verdict.passed
    assert {o.name for o in verdict.offending} == {"mlm_logits"}
    assert verdict.offending[0].rule == "slope <= 0.2"


def test_tolerances_are_parameters():
    slopes = coord_slopes(coord_table(mup_like(hidden=0.3, output=0.3)))
    assert not coord_verdict(slopes).passed
    assert coord_verdict(slopes, hidden_tol=0.35, output_max=0.35).passed


def test_only_the_judged_steps_count():
    good = coord_table(mup_like(), steps=(1, 2, 3))
    bad_at_init = coord_table(mup_like(hidden=1.0), steps=(0,))
    slopes = coord_slopes(pd.concat([good, bad_at_init]))
    assert coord_verdict(slopes).passed
    assert not coord_verdict(slopes, steps=(0, 1)).passed


def test_only_the_judged_parametrization_counts():
    table = pd.concat([coord_table(mup_like()), coord_table(mup_like(hidden=0.5, param="standard"))])
    slopes = coord_slopes(table)
    assert coord_verdict(slopes).passed
    assert not coord_verdict(slopes, parametrization="standard").passed


def test_an_unfitted_slope_fails():
    table = coord_table(mup_like())
    table.loc[(table["name"] == "z_logits.iter2") & (table["step"] == 3), "rms"] = 0.0
    verdict = coord_verdict(coord_slopes(table))
    assert not verdict.passed
    assert [(o.name, o.step, o.slope) for o in verdict.offending] == [("z_logits.iter2", 3, None)]
    assert "unfitted" in verdict.verdict


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"output_name": "logits"}, "pass output_name="),
        ({"steps": (1, 2, 3, 4)}, "pass steps="),
        ({"parametrization": "sp"}, "no 'sp' rows"),
    ],
)
def test_verdict_errors_name_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        coord_verdict(coord_slopes(coord_table(mup_like())), **kwargs)
