"""`service.field_errors`: pydantic's errors in the user's words, the one account the CLI and the API share."""

from __future__ import annotations

import pickle

import httpx
import pytest
from pydantic import ValidationError

from service.client import _detail
from service.field_errors import as_json, as_lines, field_problems, flagged
from studies.spec import SpecProblems, StudySpec

BASE = {"name": "x", "tune": {"base_width": 16}, "transfer": {"widths": [32]}}


def _problems(data):
    with pytest.raises(ValidationError) as caught:
        StudySpec.model_validate(data)
    return field_problems(caught.value.errors(), StudySpec, data)


@pytest.mark.parametrize(("change", "line"), [
    ({"model": {"family": "bert", "arch": {"n_layer": 2}}}, "model.arch.n_layer: unknown key; did you mean n_layers?"),
    ({"model": {"arch": {"n_iters": 2}}}, "model.arch.n_iters: unknown key; did you mean n_iter?"),  # PT's arch
    ({"space": {"lr": {"low": 1e-3, "high": 1e-1, "loww": 1}}}, "space.lr.loww: unknown key; did you mean low?"),
    ({"validate_": {}}, "validate_: unknown key; did you mean validate?"),
    ({"space": {"lrr": {"low": 1, "high": 2}}}, "space: unknown hparam(s) ['lrr']: valid ones are ['lr', "),
])
def test_an_unknown_name_gets_the_nearest_valid_one(change, line):
    lines = as_lines(_problems(BASE | change))
    assert any(x.startswith(line) for x in lines), lines


def test_a_unions_members_are_one_problem_at_the_field():
    [problem] = _problems(BASE | {"verify": {"tolerance": "abc"}})
    assert problem.loc == ("verify", "tolerance")
    assert problem.msg == "must be 'seed_spread' or 'seed_noise'; or must be a valid number, unable to parse string " \
                          "as a number"


def test_cross_field_problems_are_placed_and_said_with_flags():
    problems = _problems(BASE | {"transfer": {"widths": [8]}, "verify": {"width": 8}})
    assert [p.loc for p in problems] == [("transfer", "widths", 0), ("verify", "width")]
    flags = {"tune.base_width": "--from-width", "transfer.widths": "--to"}
    assert as_lines(problems, flags)[0] == ("--to 8 must be > --from-width 16 (transfer goes wider): drop it or "
                                            "lower --from-width")
    assert not flagged(problems, flags)  # verify.width is the spec file's, not a flag's
    assert as_json(problems)[1]["loc"] == ["body", "verify", "width"]


def test_spec_problems_survive_pickling():
    """Ray pickles exceptions: the problems come back as a list, not the joined text split into characters."""
    again = pickle.loads(pickle.dumps(SpecProblems(["a=1 is bad", "b=2 is worse"])))
    assert again.problems == ["a=1 is bad", "b=2 is worse"] and str(again) == "a=1 is bad; b=2 is worse"


def test_the_client_shows_a_422_as_the_local_cli_does():
    detail = [{"loc": ["body", "train", "batchsize"], "msg": "unknown key; did you mean batch_size?",
               "type": "extra_forbidden"}, {"loc": ["body"], "msg": "a compare study runs the compare phase only",
                                             "type": "value_error"}]
    text = _detail(httpx.Response(422, json={"detail": detail}))
    assert text == ("\n  train.batchsize: unknown key; did you mean batch_size?\n"
                    "  a compare study runs the compare phase only")
