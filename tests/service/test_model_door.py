"""The model contract at the door, end to end (`workers.model_check`): an installed plugin distribution whose causal
LM takes its input as (seq, batch) is stopped with one line, before any step, by `ptctl train`, by `ptctl study run`
(before the first trial: no MLflow run made) and by `POST /studies` (a 422 on `model`, nothing stored), while its
correct twin is accepted; a plugin model that raises in its third training step ends `ptctl train` with one line
naming the family and its distribution, no traceback. In process: an error is blamed on a plugin distributed as one
top-level module only when a frame lies in that module, not anywhere in the folder it is installed in.

The plugin is a throwaway distribution in a temporary folder (`tests.studies.test_plugins`' way), laid out as the
README asks: a torch-free package `door_plugin` registering three families whose models are "module:Class" paths
into `door_plugin.model`, put on the `PYTHONPATH` of a fresh interpreter (`ptctl` as a subprocess,
`tests.service._cli`). Its models are `tests.workers.test_model_check`'s HandMup and SeqFirst, self-contained.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from studies.family import FAMILIES, register
from tests.service._cli import data_dir, one_line_error, ptctl
from tests.studies.test_plugins import _distribution, _python
from workers.model_check import ContractError, plugin_errors

REPO = Path(__file__).parents[2]
DIST = "door-plugin"

PACKAGE = '''
    """Three tiny causal LMs' families (torch-free: the models are imported when ptctl builds one)."""

    from typing import ClassVar

    from pydantic import BaseModel, ConfigDict, Field

    from studies.arch import ModelSize
    from studies.family import Family
    from studies.space import Range, Space


    class DoorArch(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        block_size: int = 64

        def width_steps(self, base_width: int) -> dict[str, int]:
            return {}


    class DoorConfig(DoorArch, ModelSize):
        out_mult: float = 1.0


    class DoorSpace(Space):
        HPARAMS: ClassVar[tuple[str, ...]] = ("lr", "out_mult")
        lr: Range = Field(default_factory=lambda: Range(low=1e-4, high=1e-1, default=1e-2))
        out_mult: Range = Field(default_factory=lambda: Range(low=0.1, high=10.0, default=1.0))
        frozen: list[str] = Field(default_factory=list)


    def _family(name: str, model: str) -> Family:
        return Family(name, DoorArch, DoorConfig, DoorSpace, f"door_plugin.model:{model}", objective="clm",
                      readout="logits")


    SEQFIRST = _family("doorseq", "SeqFirst")
    BATCHFIRST = _family("doorok", "RunningMean")
    LATE = _family("doorlate", "FailsLater")
'''

MODELS = '''
    """The plugin's models."""

    from typing import Any

    import torch
    from torch import nn

    from door_plugin import DoorConfig
    from workers.models.contract import LanguageModel


    class RunningMean(LanguageModel):
        """A μP causal LM that keeps ptctl's contract: a running mean over each sequence's prefix (dim 1 of
        (batch, seq, width)), one hidden layer, a readout scaled base_width/width under μP."""

        def __init__(self, cfg: DoorConfig) -> None:
            super().__init__()
            self.cfg = cfg
            self.emb = nn.Embedding(cfg.vocab_size, cfg.width)
            self.pos = nn.Embedding(cfg.block_size, cfg.width)
            self.hidden = nn.Linear(cfg.width, cfg.width)
            self.readout = nn.Linear(cfg.width, cfg.vocab_size, bias=False)
            self.groups = {"input": [self.emb.weight, self.pos.weight], "hidden": [self.hidden.weight],
                           "output": [self.readout.weight], "bias": [self.hidden.bias]}

        def mult(self) -> float:
            return self.cfg.base_width / self.cfg.width if self.cfg.parametrization == "mup" else 1.0

        def lr_multipliers(self) -> dict[str, float]:
            return {"input": 1.0, "hidden": self.mult(), "output": self.mult(), "bias": 1.0}

        def mix(self, x: torch.Tensor) -> torch.Tensor:
            return x.cumsum(1) / torch.arange(1, x.shape[1] + 1, device=x.device)[:, None]

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    trace: dict[str, torch.Tensor] | None = None, select: torch.Tensor | None = None) -> Any:
            x = self.emb(input_ids) + self.pos(torch.arange(input_ids.shape[1], device=input_ids.device))
            h = torch.tanh(self.hidden(self.mix(x)))
            logits = self.readout(h) * self.cfg.out_mult * self.mult()
            if trace is not None:
                trace["hidden.layer0"], trace["logits"] = h, logits
            return logits if select is None else logits[select]


    class SeqFirst(RunningMean):
        """Takes its input as (seq, batch): the running mean runs over dim 0, across the sequences of a batch."""

        def mix(self, x: torch.Tensor) -> torch.Tensor:
            return x.cumsum(0) / torch.arange(1, x.shape[0] + 1, device=x.device)[:, None, None]


    class FailsLater(RunningMean):
        """Keeps the contract when built and checked; its third training step prints, then raises."""

        def __init__(self, cfg: DoorConfig) -> None:
            super().__init__(cfg)
            self.steps = 0

        def forward(self, input_ids, attention_mask=None, trace=None, select=None):
            if self.training:
                self.steps += 1
                if self.steps == 3:
                    print(f"door plugin: training forward {self.steps}, about to fail")
                    raise IndexError("index 7 is out of bounds for dimension 0 with size 7")
            return super().forward(input_ids, attention_mask, trace, select)
'''

TRAIN = ["train", "--width", "16", "--steps", "5", "--eval-every", "5", "--seq-len", "16", "--max-tokens", "20000",
         "--batch-size", "4"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The installed plugin: package `door_plugin` (families doorseq, doorok, doorlate) of distribution door-plugin
    0.1."""
    path = tmp_path_factory.mktemp("door") / "site"
    (path / "door_plugin").mkdir(parents=True)
    _distribution(path, DIST, "door_plugin/__init__", PACKAGE, {
        "doorseq": "door_plugin:SEQFIRST", "doorok": "door_plugin:BATCHFIRST", "doorlate": "door_plugin:LATE"})
    (path / "door_plugin" / "model.py").write_text(textwrap.dedent(MODELS))
    return path


def _cli(site: Path, args: list[str], data: Path) -> subprocess.CompletedProcess:
    done = ptctl(args, data, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    assert "ptctl plugin" not in done.stderr, done.stderr  # the plugin loaded
    return done


def _spec(family: str, name: str) -> dict:
    """`tiny_tau` with the plugin's family and a tinier budget (the door stops it before it trains anyway)."""
    data = yaml.safe_load((REPO / "studies" / "catalog" / "tiny_tau.yaml").read_text())
    data.update(name=name, model={"family": family, "parametrization": "mup", "arch": {}})
    data["data"].update(max_tokens=20_000, vocab_size=500, seq_len=16, max_eval_sequences=16)
    data["train"].update(steps=10, eval_every=5, log_every=5, warmup_steps=1, batch_size=4)
    data["tune"].update(num_trials=2, max_concurrent=1)
    data["tune"]["asha"]["grace_steps"] = 5
    data["verify"].update(n_samples=2, steps=10)
    return data


def _error_lines(done: subprocess.CompletedProcess) -> list[str]:
    text = done.stdout + done.stderr
    assert "Traceback" not in text, text
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.mark.slow  # a fresh interpreter importing torch: ~10 s
def test_train_stops_a_model_that_mixes_the_batch_before_its_first_step(site, tmp_path):
    done = _cli(site, [*TRAIN[:1], "--model", "doorseq", *TRAIN[1:]], data_dir(tmp_path, "data"))
    assert done.returncode == 2, done.stdout + done.stderr
    [error] = _error_lines(done)
    assert error.startswith(f"error: model family 'doorseq' (plugin distribution {DIST} 0.1) mixes the sequences "
                            "of a batch: "), error
    assert "(seq, batch)" in error and "Fix: " in error, error
    assert not [line for line in done.stdout.splitlines() if line.startswith("step")], done.stdout  # no step ran


@pytest.mark.slow  # a fresh interpreter importing torch and MLflow: ~15 s
def test_a_study_of_that_model_fails_before_its_first_trial(site, tmp_path, migrated):
    data = migrated(data_dir(tmp_path, "data"))  # MLflow's store ready: its migrations are not what is tested
    spec = tmp_path / "door_seq.yaml"
    spec.write_text(yaml.safe_dump(_spec("doorseq", "door_seq"), sort_keys=False))
    done = _cli(site, ["study", "run", str(spec), "--study-id", "door-seq"], data)
    error = one_line_error(done)  # exit 1, one error line, the last, no traceback
    assert error.startswith("error: study door-seq failed: "), error
    assert f"model family 'doorseq' (plugin distribution {DIST} 0.1) mixes the sequences of a batch" in error, error
    state = json.loads((data / "studies" / "door-seq" / "state.json").read_text())
    assert state["status"] == "failed" and "mixes the sequences of a batch" in state["error"], state
    assert state["phases"] == {} and state["runs"] == {}, state  # no phase began, not even the study's run
    assert not list((data / "studies" / "door-seq").rglob("*trials*"))
    with sqlite3.connect(data / "mlflow.db") as db:
        assert db.execute("select count(*) from runs").fetchone() == (0,)  # no trial ran, none was recorded


@pytest.mark.slow  # a fresh interpreter importing torch, MLflow and the app: ~15 s
def test_the_api_refuses_that_model_with_a_422_and_stores_nothing_and_takes_its_twin(site, tmp_path, migrated):
    data = migrated(tmp_path / "api")
    broken, twin = _spec("doorseq", "door_seq"), _spec("doorok", "door_ok")
    out = _python(site, f"""
        import json
        from fastapi.testclient import TestClient

        from service.app import create_app
        from service.settings import Settings
        from tests.service.conftest import FakeExecutor

        settings = Settings(data_dir={str(data)!r}, families=None)
        with TestClient(create_app(settings, FakeExecutor()), raise_server_exceptions=False) as client:
            def post(body):
                answer = client.post("/studies", content=json.dumps(body),
                                     headers={{"Content-Type": "application/json"}})
                return answer.status_code, answer.json()

            refused = post({broken!r})
            listed = client.get("/studies").json()
            accepted = post({twin!r})
            after = client.get("/studies").json()
        print(json.dumps({{"refused": refused, "listed": listed, "accepted": accepted, "after": after}}))
    """)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    status, body = got["refused"]
    assert status == 422, body
    [violation] = body["detail"]
    assert violation["loc"] == ["body", "model"] and violation["type"] == "model_contract", violation
    assert violation["msg"].startswith(f"model family 'doorseq' (plugin distribution {DIST} 0.1) mixes the "
                                       "sequences of a batch"), violation
    assert got["listed"]["items"] == [] and got["listed"]["total"] == 0, got["listed"]  # nothing stored
    status, body = got["accepted"]
    assert status == 201, body
    assert [s["id"] for s in got["after"]["items"]] == [body["id"]], got["after"]


@pytest.mark.slow  # a fresh interpreter importing torch, then two training steps: ~15 s
def test_a_plugin_model_that_raises_while_training_ends_train_with_one_line(site, tmp_path):
    data = data_dir(tmp_path, "data")
    done = _cli(site, [*TRAIN[:1], "--model", "doorlate", *TRAIN[1:]], data)
    assert done.returncode == 2, done.stdout + done.stderr
    printed = "door plugin: training forward 3, about to fail"  # past the door, in its third step
    assert printed not in done.stdout + done.stderr  # the model's prints go to its log
    log = (data / "logs" / "train-doorlate.log").read_text()
    assert printed in log and "IndexError" in log, log
    [error] = _error_lines(done)
    assert error == (f"error: model family 'doorlate' (plugin distribution {DIST} 0.1) raised IndexError: index 7 "
                     "is out of bounds for dimension 0 with size 7 while training. Fix the model's code (the error "
                     "is the model's own, not ptctl's)"), error


# ----------------------------------------------------------------------------- whose error it is (in process)
@pytest.fixture
def solo(tmp_path, monkeypatch):
    """Family `solo` of a plugin distributed as one top-level module (as `_distribution` writes it): installed, it
    sits in site-packages beside torch and every other library, here beside `thirdparty`."""
    site = tmp_path / "site"
    site.mkdir()
    _distribution(site, "solo-plugin", "solo_plugin", """
        class Solo:
            pass


        def fail():
            raise IndexError("the plugin's own mistake")
    """, {"solo": "solo_plugin:FAMILY"})
    (site / "thirdparty.py").write_text("def boom():\n    raise RuntimeError('CUDA out of memory')\n")
    monkeypatch.syspath_prepend(str(site))
    before = dict(FAMILIES)
    register(dataclasses.replace(FAMILIES["tauformer"], name="solo", model="solo_plugin:Solo"))
    yield
    FAMILIES.clear()
    FAMILIES.update(before)
    for name in ("solo_plugin", "thirdparty"):
        sys.modules.pop(name, None)


def test_an_error_raised_beside_a_single_module_plugin_is_not_blamed_on_it(solo):
    import solo_plugin
    import thirdparty

    with pytest.raises(ContractError, match="model family 'solo' .* raised IndexError: the plugin's own mistake "
                                            "while training"), plugin_errors("solo", "training"):
        solo_plugin.fail()
    with pytest.raises(RuntimeError, match="CUDA out of memory"), plugin_errors("solo", "training"):
        thirdparty.boom()  # a library's error from ptctl's own code: its traceback kept, not the plugin's fault
