"""The search space: default ranges, frozen hparams, validation messages."""

import math

import pytest
from pydantic import ValidationError

from studies.families.pt import HPARAMS, INFORMATION_WEIGHTS, PTWeights, SearchSpace
from studies.space import Range

WEIGHTS = ("w_H", "w_topic", "w_unary", "w_dep", "w_head", "w_topic_z")


def test_hparams_are_lr_and_the_information_weights():
    assert ("lr", *WEIGHTS) == HPARAMS
    assert INFORMATION_WEIGHTS == WEIGHTS


def test_pt_hparams_are_declared_once():
    """The space's weights are `PTWeights`' fields: the same names, defaults and descriptions."""
    space = SearchSpace.model_fields
    assert SearchSpace.HPARAMS == HPARAMS and set(space) == {*HPARAMS, "frozen", "weight_decay"}  # λ: optional
    for name, field in PTWeights.model_fields.items():
        assert SearchSpace().ranges()[name].centre == field.default, name
        assert field.description and field.description in (space[name].description or ""), name


def test_default_ranges():
    space = SearchSpace()
    assert space.lr == Range(low=1e-4, high=1e-1, log=True, default=1e-2)
    for name in WEIGHTS:
        assert getattr(space, name) == Range(low=0.25, high=4.0, log=True, default=1.0), name


def test_defaults_is_the_default_point_in_hparam_order():
    defaults = SearchSpace().defaults()
    assert list(defaults) == list(HPARAMS)
    assert defaults == {"lr": 1e-2, **{w: 1.0 for w in WEIGHTS}}


def test_frozen_hparams_are_fixed_not_searched():
    space = SearchSpace(frozen=["w_topic_z", "w_topic"], w_topic=Range(low=0.5, high=2, default=0.7))
    assert list(space.searched()) == ["lr", "w_H", "w_unary", "w_dep", "w_head"]
    assert space.fixed() == {"w_topic": 0.7, "w_topic_z": 1.0}
    assert space.defaults()["w_topic"] == 0.7


def test_nothing_frozen_searches_all_seven():
    space = SearchSpace()
    assert list(space.searched()) == list(HPARAMS)
    assert space.fixed() == {}


def test_complete_fills_missing_hparams_with_defaults():
    space = SearchSpace(frozen=["w_head"], w_head=Range(low=0.5, high=2, default=0.5))
    full = space.complete({"lr": 3e-3, "w_H": 2})
    assert full == {"lr": 3e-3, "w_H": 2.0, "w_topic": 1.0, "w_unary": 1.0, "w_dep": 1.0, "w_head": 0.5,
                    "w_topic_z": 1.0}
    with pytest.raises(ValueError, match=r"unknown hparam\(s\) \['w_bogus'\].*valid ones are"):
        space.complete({"w_bogus": 1.0})


def test_unknown_hparam_name_lists_the_valid_ones():
    with pytest.raises(ValidationError) as err:
        SearchSpace.model_validate({"w_foo": {"low": 0.5, "high": 2.0}})
    message = str(err.value)
    assert "w_foo" in message
    assert all(name in message for name in HPARAMS)


def test_unknown_frozen_name_is_rejected():
    with pytest.raises(ValidationError, match=r"space.frozen.*valid ones are"):
        SearchSpace(frozen=["lr", "momentum"])


def test_frozen_twice_and_frozen_everything_are_rejected():
    with pytest.raises(ValidationError, match="more than once"):
        SearchSpace(frozen=["lr", "lr"])
    with pytest.raises(ValidationError, match="nothing to tune"):
        SearchSpace(frozen=list(HPARAMS))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"low": 2.0, "high": 1.0, "default": 1.5}, "must be < high"),
        ({"low": 1.0, "high": 1.0, "default": 1.0}, "must be < high"),
        ({"low": 0.0, "high": 1.0, "default": 0.5}, "must be > 0 for a log range"),
        ({"low": -1.0, "high": 1.0, "default": 0.5}, "must be > 0 for a log range"),
        ({"low": 0.5, "high": 2.0, "default": 3.0}, r"default=3.0 must lie in \[low, high\]"),
        ({"low": 0.5, "high": 2.0, "default": 0.25}, r"must lie in \[low, high\]"),
    ],
)
def test_invalid_ranges(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        Range(**kwargs)


def test_linear_range_may_start_at_zero_or_below():
    assert Range(low=-1.0, high=1.0, log=False, default=0.0).low == -1.0


def test_omitted_default_is_the_centre_of_the_range():
    assert math.isclose(Range(low=1e-4, high=1e-2).default, 1e-3)
    assert Range(low=0.0, high=2.0, log=False).default == 1.0


def test_range_rejects_unknown_keys():
    with pytest.raises(ValidationError, match="step"):
        Range.model_validate({"low": 1, "high": 2, "step": 0.1})
