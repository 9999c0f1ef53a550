"""Every family declares its context (`studies.arch.Arch.context_field`): the arch field, whatever its name, that holds
the longest sequence its model takes, which the spec checks against data.seq_len with an error naming both fields;
`ANY_LENGTH` for a model that takes sequences of any length (PT). Every built-in declares one; a plugin's arch that
declares none is accepted (the plan says its context is unchecked: tests/service/test_plan_plugins.py), and one that
names a field its arch lacks is skipped at start-up."""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError

from studies import load_catalog
from studies.arch import ANY_LENGTH, Arch, PosInt, context_line
from studies.family import FAMILIES, PLUGINS, _malformed, from_mup
from studies.space import Range, Space
from studies.spec import StudySpec


class PositionsArch(Arch):  # a GPT-2-style arch: its context is `n_positions`
    context_field = "n_positions"
    n_heads: PosInt = Field(2, description="attention heads")
    n_positions: PosInt = Field(32, description="learned positions: the longest sequence")

    def width_steps(self, base_width: int) -> dict[str, int]:
        return {"n_heads": self.n_heads}


class TinySpace(Space):
    HPARAMS = ("lr", "output_mult")
    lr: Range = Field(default_factory=lambda: Range(low=1e-4, high=1e-1, default=1e-2))
    output_mult: Range = Field(default_factory=lambda: Range(low=0.1, high=10.0, default=1.0))
    frozen: list[str] = Field(default_factory=list)


@pytest.fixture
def positions(monkeypatch) -> str:
    monkeypatch.setitem(FAMILIES, "positions", from_mup("positions", "nowhere:make_model", PositionsArch, TinySpace))
    return "positions"


def _spec(family: str, seq_len: int, **arch: int) -> dict:
    data = load_catalog("tiny").as_dict()
    data["model"] = {"family": family, "parametrization": "mup", "arch": arch}
    data["data"] = {**data["data"], "seq_len": seq_len, "objective": "clm"}
    data.pop("space")
    return data


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - set(PLUGINS)))
def test_every_built_in_declares_its_context(family):
    arch = FAMILIES[family].arch
    assert arch.context_field == ANY_LENGTH or arch().context() is not None, family


def test_a_context_under_another_name_is_checked_and_the_error_names_both_fields(positions):
    with pytest.raises(ValidationError) as err:
        StudySpec.model_validate(_spec(positions, 64, n_positions=32))
    assert ("data.seq_len 64 exceeds model.arch.n_positions 32, the longest sequence the model takes: set "
            "model.arch.n_positions to at least 64, or lower data.seq_len") in str(err.value)
    spec = StudySpec.model_validate(_spec(positions, 32, n_positions=32))  # it fits exactly
    assert context_line(spec.model.arch, 32, positions) == "data.seq_len 32 within model.arch.n_positions 32"


def test_a_compare_baselines_context_is_named_by_its_path():
    data = load_catalog("compare_cpu").as_dict()
    data["compare"]["baselines"][0]["model"]["arch"]["max_len"] = 8
    seq_len = data["data"]["seq_len"]
    with pytest.raises(ValidationError, match=rf"data.seq_len {seq_len} exceeds compare.baselines\[0\].model.arch."
                                              rf"max_len 8, .*set compare.baselines\[0\].model.arch.max_len to"):
        StudySpec.model_validate(data)


def test_an_undeclared_context_is_accepted_and_said_unchecked(monkeypatch):
    class LooseArch(PositionsArch):
        context_field = None

    monkeypatch.setitem(FAMILIES, "loose", from_mup("loose", "nowhere:make_model", LooseArch, TinySpace))
    spec = StudySpec.model_validate(_spec("loose", 64, n_positions=32))  # nothing to check it against
    assert context_line(spec.model.arch, 64, "loose").startswith("not declared: model family 'loose' names no arch "
                                                                 "field holding its longest sequence")
    assert "any length" in context_line(load_catalog("tiny").model.arch, 32, "pt")


def test_a_plugin_whose_context_field_is_not_a_field_of_its_arch_is_malformed():
    class Misnamed(PositionsArch):
        context_field = "n_position"

    family = from_mup("misnamed", "nowhere:make_model", Misnamed, TinySpace)
    problem = _malformed(family) or ""
    assert "context_field names 'n_position', which is not a field of its arch" in problem, problem
    assert "n_positions" in problem and "ANY_LENGTH" in problem
    assert _malformed(from_mup("fine", "nowhere:make_model", PositionsArch, TinySpace)) is None
