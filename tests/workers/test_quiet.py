"""Quiet builds (`workers.quiet`): what a trial's model prints and warns while it builds and trains goes to the trial's
log file, never the terminal; ptctl's own progress still reaches the terminal, and an error still propagates.

A throwaway family, defined here, prints "number of parameters: …" and warns when it is built (the example nanogpt
plugin and torch's `enable_nested_tensor` warning do so on every trial) and writes to stderr on its first forward.
"""

from __future__ import annotations

import sys
import threading
import warnings
from types import SimpleNamespace
from typing import ClassVar

import pyarrow.fs
import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from studies import load_catalog
from studies.arch import ModelSize
from studies.family import FAMILIES, Family, register
from studies.plan import PlannedTrial
from studies.space import Range, Space
from studies.spec import DataSpec, TrialConfig
from workers.models.contract import LanguageModel
from workers.quiet import quiet
from workers.runner import InProcessRunner, PhaseJob, trial_log
from workers.tracker import NullTracker
from workers.train import train_trial

CHATTER = ("number of parameters:", "UserWarning: chatty: enable_nested_tensor", "chatty forward")


class ChattyArch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def width_steps(self, base_width: int) -> dict[str, int]:
        return {}


class ChattyConfig(ChattyArch, ModelSize):
    pass


class ChattySpace(Space):
    HPARAMS: ClassVar[tuple[str, ...]] = ("lr",)
    lr: Range = Field(default_factory=lambda: Range(low=1e-4, high=1e-1, default=1e-2))
    frozen: list[str] = Field(default_factory=list)


class ChattyLM(LanguageModel):
    """Embeddings and a decoder, and the chatter of a model written for a notebook."""

    def __init__(self, cfg: ChattyConfig) -> None:
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab_size, cfg.width)
        self.decoder = nn.Linear(cfg.width, cfg.vocab_size)
        self.groups = {"hidden": [self.emb.weight, self.decoder.weight], "bias": [self.decoder.bias]}
        self.spoke = False
        print(f"number of parameters: {sum(p.numel() for p in self.parameters()) / 1e6:.2f}M")
        warnings.warn("chatty: enable_nested_tensor is True, but self.use_nested_tensor is False", UserWarning,
                      stacklevel=2)

    def lr_multipliers(self) -> dict[str, float]:
        return dict.fromkeys(self.groups, 1.0)

    def forward(self, input_ids, attention_mask=None, trace=None, select=None) -> torch.Tensor:
        if not self.spoke:
            sys.stderr.write("chatty forward\n")
            self.spoke = True
        x = torch.tanh(self.emb(input_ids))
        return self.decoder(x if select is None else x[select])


@pytest.fixture
def chatty():
    yield register(Family("chatty", ChattyArch, ChattyConfig, ChattySpace, ChattyLM, readout="logits"))
    del FAMILIES["chatty"]


def _config() -> TrialConfig:
    return TrialConfig(model="chatty", model_hp={"width": 16}, data=DataSpec(max_tokens=20_000, seq_len=16),
                       steps=4, eval_every=2, log_every=2, warmup_steps=1, batch_size=4, eval_batches=1, device="cpu")


def _terminal(capfd: pytest.CaptureFixture[str]) -> str:
    out, err = capfd.readouterr()
    return out + err


def test_a_models_prints_and_warnings_go_to_the_trials_log_and_progress_to_the_terminal(chatty, tmp_path, capfd):
    log = tmp_path / "logs" / "trial.log"
    streams = sys.stdout, sys.stderr
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        report = train_trial(_config(), progress=lambda row: print(f"progress: step {row['step']}"), log=log)
    assert report.status == "completed", report.message
    terminal = _terminal(capfd)
    assert not [c for c in CHATTER if c in terminal], terminal
    assert not [w for w in escaped if "chatty" in str(w.message)]
    assert "progress: step 2" in terminal and "progress: step 4" in terminal  # ptctl's own output, on the terminal
    text = log.read_text()
    assert all(c in text for c in CHATTER) and "progress:" not in text, text
    assert (sys.stdout, sys.stderr) == streams


@pytest.mark.filterwarnings("ignore:chatty")
def test_without_a_log_nothing_is_redirected(chatty, capfd):
    train_trial(_config())
    assert "number of parameters:" in _terminal(capfd)


def test_an_error_propagates_with_its_traceback_in_the_log(tmp_path):
    log = tmp_path / "trial.log"
    streams, shown = (sys.stdout, sys.stderr), warnings.showwarning
    with pytest.raises(RuntimeError, match="boom"), quiet(log):
        print("before the error")
        raise RuntimeError("boom")
    assert (sys.stdout, sys.stderr) == streams and warnings.showwarning is shown
    text = log.read_text()
    assert "before the error" in text and "RuntimeError: boom" in text


def test_other_threads_and_callbacks_keep_the_terminal(tmp_path, capfd):
    """A live progress bar refreshes from a thread of its own: only the trial's thread is redirected."""
    log = tmp_path / "trial.log"
    with quiet(log) as found:
        other = threading.Thread(target=lambda: print("another thread"))
        other.start()
        other.join()
        print("the trial")
        found.aloud(print)("a callback")
    terminal = _terminal(capfd)
    assert "another thread" in terminal and "a callback" in terminal and "the trial" not in terminal
    assert log.read_text() == "the trial\n"


class _Tags(NullTracker):
    def __init__(self) -> None:
        self.tags: dict[str, str] = {}
        self.artifacts: list[str] = []

    def set_tags(self, run_id, tags) -> None:
        self.tags.update(tags)

    def log_artifacts(self, run_id, paths, artifact_path=None) -> None:
        self.artifacts.extend(str(p) for p in paths)


def test_the_in_process_runner_gives_each_trial_a_log_named_on_its_run(chatty, tmp_path, capfd):
    data = load_catalog("tiny").as_dict()
    data["model"] = {"family": "chatty", "parametrization": "standard", "arch": {}}
    data["space"] = {}
    data["train"].update(steps=4, eval_every=2, log_every=2, warmup_steps=1)
    data["tune"]["asha"]["enabled"] = False
    spec = type(load_catalog("tiny")).model_validate(data)
    tracker = _Tags()
    trial = PlannedTrial("transfer-w32-s0", "transfer", spec.tune.base_width, 0, spec.space.defaults())
    job = PhaseJob(spec, "transfer", [trial], "s1", None, "s1/transfer", tracker, tmp_path, "s1.transfer")
    table = InProcessRunner().run_phase(job)
    assert table.status.tolist() == ["completed"]
    log = trial_log(job, trial)
    assert log == tmp_path / "s1.transfer" / "logs" / "transfer-w32-s0.log"
    assert tracker.tags["log"] == str(log) and tracker.artifacts == [str(log)]
    assert all(c in log.read_text() for c in CHATTER)
    terminal = _terminal(capfd)
    assert not [c for c in CHATTER if c in terminal], terminal


def test_a_ray_trials_log_is_kept_beside_its_checkpoints(tmp_path):
    from workers.ray import trainable  # imports Ray

    local = SimpleNamespace(storage_filesystem=pyarrow.fs.LocalFileSystem(), trial_fs_path=str(tmp_path / "trial_0"),
                            trial_working_directory=str(tmp_path / "work"))
    log, kept = trainable.trial_log(local)
    assert log == tmp_path / "trial_0" / trainable.TRIAL_LOG and kept == str(log)
    remote_root = tmp_path / "bucket"
    remote_root.mkdir()
    remote = SimpleNamespace(storage_filesystem=pyarrow.fs.SubTreeFileSystem(str(remote_root),
                                                                             pyarrow.fs.LocalFileSystem()),
                             trial_fs_path="exp/trial_0", trial_working_directory=str(tmp_path / "work"))
    log, kept = trainable.trial_log(remote)
    assert log == tmp_path / "work" / trainable.TRIAL_LOG and kept == f"subtree://exp/trial_0/{trainable.TRIAL_LOG}"
    (remote_root / "exp" / "trial_0").mkdir(parents=True)
    log.parent.mkdir(parents=True)
    log.write_text("number of parameters: 0.01M\n")
    trainable.keep_log(remote, log)
    assert (remote_root / "exp" / "trial_0" / trainable.TRIAL_LOG).read_text() == "number of parameters: 0.01M\n"
