"""Relative distance from the centre (eq. 10), checked against hand-computed values."""

import math

import pandas as pd
import pytest

from analysis.distance import relative_distance

CENTRE = {"lr": 0.01, "w_H": 1.0, "w_dep": 2.0}
TABLE = pd.DataFrame(
    {"lr": [0.01, 0.015, 0.005], "w_H": [1.0, 0.5, 1.0], "w_dep": [2.0, 2.0, 3.0]}, index=[10, 11, 12]
)


def test_relative_distance_by_hand():
    d = relative_distance(TABLE, CENTRE, ["lr", "w_H", "w_dep"])
    # row 11: (0.5, -0.5, 0) → √0.5; row 12: (-0.5, 0, 0.5) → √0.5
    assert d.tolist() == pytest.approx([0.0, math.sqrt(0.5), math.sqrt(0.5)])
    assert d.index.tolist() == [10, 11, 12]
    assert d.name == "distance"


def test_log_distance_by_hand():
    d = relative_distance(TABLE, CENTRE, ["lr", "w_H", "w_dep"], log=True)
    assert d[11] == pytest.approx(math.hypot(math.log(1.5), math.log(0.5)))
    assert d[12] == pytest.approx(math.hypot(math.log(0.5), math.log(1.5)))


def test_only_the_named_hparams_count():
    d = relative_distance(TABLE, CENTRE, ["w_dep"])
    assert d.tolist() == pytest.approx([0.0, 0.0, 0.5])


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="centre lacks hparam"):
        relative_distance(TABLE, {"lr": 0.01}, ["lr", "w_H"])
    with pytest.raises(ValueError, match="drop them from hparams"):
        relative_distance(TABLE, {**CENTRE, "w_H": 0.0}, ["lr", "w_H"])
    with pytest.raises(ValueError, match="use log=False"):
        relative_distance(TABLE.assign(w_H=-1.0), CENTRE, ["w_H"], log=True)
    with pytest.raises(ValueError, match="lacks"):
        relative_distance(TABLE, CENTRE, ["lr", "w_topic"])
