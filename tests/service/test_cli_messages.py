"""What `ptctl` says, in fresh interpreters: `ptctl train --help` lists every installed family; a `ptctl train` error
names the flags typed (`--base-width`, not tune.base_width), once; `--set`'s valid keys are the arch's fields and the
hparams; no message the CLI or the API prints links pydantic's docs; `ptctl study run` says once, at its start, that
a family trains each trial alone, and why."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from nanogpt_mup import GPTArch, GPTSpace
from pydantic import BaseModel

from service.app import create_app
from service.settings import Settings
from studies import load_catalog
from studies.family import FAMILIES, family_names, from_mup
from tests.service._cli import data_dir, ptctl
from tests.service.conftest import FakeExecutor
from tests.service.test_cli_plan import _ptctl
from workers.model_check import ContractError, check_model

PYDANTIC_LINK = "errors.pydantic.dev"
BAD = {  # each a command line a user may type that ends in a validation error somewhere in ptctl
    "plugin --set": ["train", "--model", "nanogpt", "--set", "n_heads=abc", "--steps", "1"],
    "plugin hparam": ["coord-check", "--model", "nanogpt", "--set", "output_mult=abc"],
    "built-in --set": ["train", "--model", "pt", "--set", "n_iter=abc", "--steps", "1"],
    "flag": ["transfer", "--from-width", "-32", "--to", "64", "--dry-run", "--no-probe"],
}
CALLS = {
    "help": ["train", "--help"],
    "base width": ["train", "--model", "pt", "--width", "30", "--base-width", "64", "--steps", "1"],
    "whole heads": ["train", "--model", "tauformer", "--width", "30", "--steps", "1"],
    "scaled size": ["train", "--model", "pt", "--width", "48", "--base-width", "32", "--set", "paradigm=rank",
                    "--set", "rank=3", "--steps", "1"],
    "unknown key": ["train", "--model", "bert", "--set", "foo=1", "--steps", "1"],
    **BAD,
}


@pytest.fixture(scope="module")
def said() -> dict[str, tuple[int, str]]:
    """Each of CALLS' exit code and output, from one fresh `ptctl` interpreter."""
    return {name: (rc, out) for name, (rc, out, _) in zip(CALLS, _ptctl(list(CALLS.values())), strict=True)}


def test_train_help_lists_every_installed_family(said):
    rc, out = said["help"]
    assert rc == 0 and "nanogpt" in family_names(), out
    text = " ".join(out.split())
    assert f"one of {', '.join(family_names())}" in text, out


def test_a_train_width_error_names_the_flags_typed_once(said):
    rc, out = said["base width"]
    assert rc == 2 and out.startswith("error: --width 30 is incompatible with --base-width 64: "), out
    assert "tune.base_width" not in out and "model.arch" not in out and "--set n_channels" in out, out
    rc, out = said["scaled size"]
    assert rc == 2 and "--width 48 is incompatible with --base-width 32: --set rank=3 would scale to 4.5" in out, out
    rc, out = said["whole heads"]  # width and base width are one value here: one line, said once
    assert rc == 2 and out.strip() == ("error: --width 30 is not a multiple of --set head_dim · kv_group = 32 "
                                       "(TauGPT widens by whole heads): use a multiple of 32"), out


def test_set_lists_the_arch_fields_and_hparams_as_its_valid_keys(said):
    rc, out = said["unknown key"]
    assert rc == 2 and "unknown bert hyperparameter(s) ['foo']: valid ones are [" in out, out
    valid = out.split("valid ones are ", 1)[1]
    assert "'max_len'" in valid and "'init_std'" in valid and "'n_layers'" in valid, out
    for internal in ("'width'", "'base_width'", "'parametrization'", "'vocab_size'"):
        assert internal not in valid, out


@pytest.mark.parametrize("name", sorted(BAD))
def test_no_cli_error_links_pydantics_docs(said, name):
    rc, out = said[name]
    assert rc == 2 and "error:" in out and PYDANTIC_LINK not in out and "Traceback" not in out, out


class _Strict(BaseModel):
    n: int


def pydantic_raising(width: int, vocab_size: int, **_: object) -> None:
    """A plugin factory whose own pydantic model refuses its input."""
    _Strict(n="abc")  # type: ignore[arg-type]


def test_a_plugins_own_validation_error_is_quoted_without_the_link(monkeypatch):
    monkeypatch.setitem(FAMILIES, "strict", from_mup("strict", f"{__name__}:pydantic_raising", GPTArch, GPTSpace))
    with pytest.raises(ContractError) as err:
        check_model("strict", {"width": 32, "base_width": 32, "parametrization": "standard"}, 16)
    text = str(err.value)
    assert "could not be built" in text and "n: Input should be a valid integer" in text, text
    assert PYDANTIC_LINK not in text, text


def test_no_api_error_links_pydantics_docs(tmp_path, migrated):
    bodies = [{**load_catalog("tiny").as_dict(), "train": {"steps": "many"}},
              {**load_catalog("tiny").as_dict(), "model": {"family": "bert", "arch": {"n_layers": "two"}}},
              {"name": 3}]
    app = create_app(Settings(data_dir=migrated(tmp_path / "data")), FakeExecutor())
    with TestClient(app, raise_server_exceptions=False) as client:
        for body in bodies:
            for path in ("/studies", "/plans"):
                answer = client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
                assert answer.status_code == 422 and PYDANTIC_LINK not in answer.text, answer.text
        answer = client.get("/studies", params={"limit": "lots"})
        assert answer.status_code == 422 and PYDANTIC_LINK not in answer.text, answer.text


def test_study_run_says_once_at_its_start_that_a_mup_family_trains_each_trial_alone(tmp_path):
    """The study stops at its first MLflow call (nothing listens on port 9): the line came before it."""
    spec = tmp_path / "nanogpt.yaml"
    data = load_catalog("nanogpt_mup").as_dict()
    data["tune"] = {**data["tune"], "num_trials": 1}
    spec.write_text(json.dumps(data))
    done = ptctl(["study", "run", str(spec), "--runner", "local"], data_dir(tmp_path, "data"),
                 tracking_uri="http://127.0.0.1:9", timeout=300)
    out = done.stdout + done.stderr
    line = ("family 'nanogpt' trains each trial alone: its model brings its own optimiser (mup's MuAdamW), which a "
            "batch cannot stack")
    assert out.count("trains each trial alone") == 1 and line in " ".join(out.split()), out
    assert out.index("trains each trial alone") < out.index("error:"), out
