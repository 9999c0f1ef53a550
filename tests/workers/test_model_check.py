"""The model contract at the door (`workers.model_check`): throwaway plugins of the project's own, one per way a
user's model breaks the contract, each stopped with one line that names the family, its package, what was expected,
what was seen and the fix; and the ones that keep it (every built-in, a hand-written-μP plugin, a mup model that
returns log-probabilities) pass."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any, ClassVar

import mup
import pytest
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from studies import load_catalog
from studies.arch import ModelSize
from studies.family import FAMILIES, Family, from_mup, register
from studies.space import Range, Space
from studies.spec import DataSpec, StudySpec, TrialConfig
from workers.coord_check import DEFAULT_DATA, _setup
from workers.errors import ConfigError
from workers.model_check import ContractError, check_model, check_study, plugin_errors
from workers.models import build_model
from workers.models.contract import LanguageModel
from workers.models.mup_model import traced
from workers.train import train_trial


class DoorArch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    block_size: int = 64
    n_heads: int = 1

    def width_steps(self, base_width: int) -> dict[str, int]:
        return {}


class DoorConfig(DoorArch, ModelSize):
    out_mult: float = 1.0


class DoorSpace(Space):
    HPARAMS: ClassVar[tuple[str, ...]] = ("lr", "out_mult")
    lr: Range = Field(default_factory=lambda: Range(low=1e-4, high=1e-1, default=1e-2))
    out_mult: Range = Field(default_factory=lambda: Range(low=0.1, high=10.0, default=1.0))
    frozen: list[str] = Field(default_factory=list)


class HandMup(LanguageModel):
    """A hand-written μP causal LM that keeps the contract: a running mean over the prefix (causal), one hidden
    layer, a readout multiplied by base_width/width under μP, and μP's Adam lrs in `lr_multipliers`."""

    def __init__(self, cfg: DoorConfig) -> None:
        super().__init__()
        if cfg.width % cfg.n_heads:  # an arch the model cannot build
            raise RuntimeError(f"width {cfg.width} is not divisible by n_heads {cfg.n_heads}")
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
        assert input_ids.shape[1] <= self.cfg.block_size, "Cannot forward, sequence longer than block size"
        x = self.emb(input_ids) + self.pos(torch.arange(input_ids.shape[1]))
        h = torch.tanh(self.hidden(self.mix(x)))
        logits = self.readout(h) * self.cfg.out_mult * self.mult()
        if trace is not None:
            trace["hidden.layer0"], trace["logits"] = h, logits
        return logits if select is None else logits[select]


class TupleOut(HandMup):
    def forward(self, input_ids, attention_mask=None, trace=None, select=None):  # type: ignore[no-untyped-def]
        return super().forward(input_ids, attention_mask, trace, select), None


class SeqFirst(HandMup):  # takes (seq, batch): its running mean runs over the batch
    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return x.cumsum(0) / torch.arange(1, x.shape[0] + 1)[:, None, None]


class ZeroReadout(HandMup):
    """μP's recommended init: the readout at zero, so every logit is 0 at initialisation."""

    def __init__(self, cfg: DoorConfig) -> None:
        super().__init__(cfg)
        nn.init.zeros_(self.readout.weight)


class ZeroSeqFirst(ZeroReadout, SeqFirst):  # microsoft/mup's example Transformer without its batch-first wrapper
    pass


class Deaf(HandMup):  # its logits do not depend on the tokens
    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


class Peeking(HandMup):  # a causal LM that averages the whole sequence
    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(1, keepdim=True).expand_as(x)


class ConstLr(HandMup):  # μP's readout multiplier, but every lr left as in the standard parametrization
    def lr_multipliers(self) -> dict[str, float]:
        return dict.fromkeys(self.groups, 1.0)


class NoSelect(HandMup):
    def forward(self, input_ids, attention_mask=None, trace=None, select=None):  # type: ignore[no-untyped-def]
        return super().forward(input_ids, attention_mask, trace)


class NoTrace(HandMup):
    def forward(self, input_ids, attention_mask=None, trace=None, select=None):  # type: ignore[no-untyped-def]
        return super().forward(input_ids, attention_mask, None, select)


class BadSignature(HandMup):
    def forward(self, input_ids):  # type: ignore[no-untyped-def,override]
        return super().forward(input_ids)


class Ungrouped(HandMup):
    def __init__(self, cfg: DoorConfig) -> None:
        super().__init__(cfg)
        del self.groups["bias"]

    def lr_multipliers(self) -> dict[str, float]:
        return {k: v for k, v in super().lr_multipliers().items() if k != "bias"}


class FailsLater(HandMup):  # breaks in its third training step
    calls = 0

    def forward(self, input_ids, attention_mask=None, trace=None, select=None):  # type: ignore[no-untyped-def]
        if self.training:
            FailsLater.calls += 1
            if FailsLater.calls == 3:
                raise IndexError("index 7 is out of bounds for dimension 0 with size 7")
        return super().forward(input_ids, attention_mask, trace, select)


# ----------------------------------------------------------------------------- mup-library models (from_mup)
class Tiny(nn.Module):
    def __init__(self, width: int, vocab_size: int, readout: type[mup.MuReadout] = mup.MuReadout,
                 log_probs: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, width)
        self.mid = nn.Linear(width, width)
        self.head = readout(width, vocab_size)
        self.log_probs = log_probs

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.head(torch.tanh(self.mid(self.emb(ids))))
        return F.log_softmax(logits, -1) if self.log_probs else logits


class StuckReadout(mup.MuReadout):  # a standard readout in μP's clothes
    def width_mult(self) -> float:
        return 1.0


ASKED: dict[str, Any] = {}


def make_tiny(width: int, vocab_size: int, out_mult: float, **arch: Any) -> Tiny:
    return Tiny(width, vocab_size)


def make_stuck(width: int, vocab_size: int, out_mult: float, **arch: Any) -> Tiny:
    return Tiny(width, vocab_size, readout=StuckReadout)


def make_logprobs(width: int, vocab_size: int, out_mult: float, **arch: Any) -> Tiny:
    return Tiny(width, vocab_size, log_probs=True)


def make_asking(width: int, vocab_size: int, out_mult: float, base_width: int, parametrization: str,
                **arch: Any) -> Tiny:
    ASKED.setdefault(width, (base_width, parametrization))  # the first build: the model ptctl trains
    return Tiny(width, vocab_size)


HAND = {"handmup": HandMup, "tupleout": TupleOut, "seqfirst": SeqFirst, "peeking": Peeking, "constlr": ConstLr,
        "noselect": NoSelect, "notrace": NoTrace, "badsig": BadSignature, "ungrouped": Ungrouped,
        "failslater": FailsLater, "zeroreadout": ZeroReadout, "zeroseqfirst": ZeroSeqFirst,
        "zeropeeking": type("ZeroPeeking", (ZeroReadout, Peeking), {}), "deaf": Deaf}
MUP = {"tiny": "make_tiny", "stuck": "make_stuck", "logprobs": "make_logprobs", "asking": "make_asking"}


@pytest.fixture(autouse=True)
def plugins() -> Iterator[None]:
    before = dict(FAMILIES)
    for name, model in HAND.items():
        register(Family(name, DoorArch, DoorConfig, DoorSpace, model, objective="clm", readout="logits"))
    for name, fn in MUP.items():
        register(from_mup(name, f"{__name__}:{fn}", DoorArch, DoorSpace))
    yield
    FAMILIES.clear()
    FAMILIES.update(before)


def hp(parametrization: str = "mup", **arch: Any) -> dict[str, Any]:
    return {"width": 16, "base_width": 8, "parametrization": parametrization, **arch}


def refused(name: str, seq_len: int = 16, **kw: Any) -> str:
    with pytest.raises(ContractError) as err:
        check_model(name, hp(**kw), seq_len)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"model family {name!r} (module {__name__})"), text
    return text


@pytest.mark.parametrize("name", ["handmup", "tiny", "logprobs", "asking", "zeroreadout"])
@pytest.mark.parametrize("parametrization", ["mup", "standard"])
def test_a_model_that_keeps_the_contract_passes(name, parametrization):
    check_model(name, hp(parametrization), 16)


@pytest.mark.parametrize("name", ["pt", "bert", "ut", "tauformer", "hf", "nanogpt"])
@pytest.mark.parametrize("parametrization", ["mup", "standard"])
def test_every_builtin_family_and_the_example_plugin_keep_the_contract(name, parametrization):
    door, _ = _setup(name, (32, 64), None, DEFAULT_DATA)
    found = check_model(name, {**door, "width": 32, "parametrization": parametrization}, DEFAULT_DATA.seq_len)
    assert not found.log_probs


@pytest.mark.parametrize(("name", "expected"), [
    ("tupleout", ["returns no tensor from its forward", "a tuple of (torch.float32 tensor of shape (3, 16, 61), "
                  "NoneType)", "return the logits alone"]),
    ("seqfirst", ["mixes the sequences of a batch", "changing sequence 0 changed the others' logits",
                  "(seq, batch)"]),
    ("peeking", ["sees the future", "changing tokens after position 8 changed the logits up to it",
                 "mask attention causally"]),
    # a zero readout makes every logit a constant at initialisation: the door draws it at random to compare
    ("zeroseqfirst", ["mixes the sequences of a batch", "(seq, batch)"]),
    ("zeropeeking", ["sees the future"]),
    ("deaf", ["ignores its input", "the same logits at every position of every sequence"]),
    ("constlr", ["keeps its learning rates as width grows", "base_width/width"]),
    ("noselect", ["ignores `select`", "return logits[select]"]),
    ("notrace", ["records no readout in its trace", "Family.readout='logits'"]),
    ("badsig", ["has a forward ptctl cannot call", "forward(input_ids, attention_mask, trace=None, select=None)"]),
    ("ungrouped", ["leaves parameters out of its groups", "['hidden.bias'] in none"]),
    ("stuck", ["has a readout that does not scale", "head.width_mult() to grow 2× from width 16 to 32", "1 and 1",
               "MuReadout"]),
])
def test_each_broken_contract_is_one_line_naming_what_was_expected_and_the_fix(name, expected):
    text = refused(name)
    for part in expected:
        assert part in text, text


def test_a_context_shorter_than_the_data_is_named_with_both_lengths():
    text = refused("handmup", seq_len=32, block_size=16)
    assert "does not fit the data" in text and "data.seq_len=32" in text and "block_size" in text, text


@pytest.mark.parametrize("name", ["bert", "nanogpt"])
def test_a_declared_context_shorter_than_the_data_is_refused_before_the_forward_runs(name):
    """A built-in's forward raises its own ValueError on too long a sequence (`ptctl train --seq-len 1024` once
    ended in that traceback): the declared context says it first, naming both fields."""
    door, _ = _setup(name, (32, 64), None, DEFAULT_DATA)
    expected = (r"^data.seq_len 48 exceeds model.arch.max_len 32, the longest sequence the model takes: set "
                r"model.arch.max_len to at least 48, or lower data.seq_len$")
    with pytest.raises(ConfigError, match=expected):
        check_model(name, {**door, "max_len": 32, "width": 32, "parametrization": "mup"}, 48)


def test_an_arch_the_model_cannot_build_names_the_models_own_error():
    text = refused("handmup", n_heads=3)
    assert "could not be built" in text and "width 16 is not divisible by n_heads 3" in text, text


def test_log_probabilities_are_detected_and_the_coordinate_check_judges_the_readout():
    """log-probs sit near −log V whatever the readout does: the trace's `logits` is MuReadout's own output."""
    assert check_model("logprobs", hp(), 16).log_probs
    assert not check_model("tiny", hp(), 16).log_probs
    model = build_model("logprobs", vocab_size=61, **hp())
    ids = torch.randint(61, (2, 8))
    trace: dict[str, torch.Tensor] = {}
    out = traced(model.net, ids, trace)
    assert torch.allclose(out.logsumexp(-1), torch.zeros(2, 8), atol=1e-5)
    assert torch.equal(trace["logits"], model.net.head(torch.tanh(model.net.mid(model.net.emb(ids)))))


def test_from_mup_passes_base_width_and_parametrization_to_a_factory_that_asks():
    ASKED.clear()
    build_model("asking", vocab_size=61, width=32, base_width=8, parametrization="standard")
    assert ASKED[32] == (8, "standard")
    ASKED.clear()
    build_model("asking", vocab_size=61, width=32, base_width=8, parametrization="mup")
    assert ASKED[32] == (8, "mup") and ASKED[8] == (8, "mup")  # and the base shapes' model


def test_a_plugins_error_while_training_is_one_line_naming_the_family():
    FailsLater.calls = 0
    cfg = TrialConfig(model="failslater", model_hp=hp(), lr=1e-2, steps=5, eval_every=5, log_every=5,
                      warmup_steps=1, data=DataSpec(max_tokens=20_000, seq_len=16, vocab_size=200, objective="clm"))
    with pytest.raises(ContractError) as err:
        train_trial(cfg)
    text = str(err.value)
    assert text.startswith(f"model family 'failslater' (module {__name__})") and "IndexError: index 7 is out of " \
        "bounds" in text and "while training" in text, text


def test_ptctls_own_families_keep_their_tracebacks():
    with pytest.raises(ZeroDivisionError), plugin_errors("pt", "training"):
        raise ZeroDivisionError


def test_a_study_checks_each_parametrization_it_trains_before_its_first_trial():
    data = load_catalog("tiny_tau").as_dict()
    data["model"] = {"family": "constlr", "parametrization": "standard", "arch": {}}
    data.pop("space")
    spec = StudySpec.model_validate(data)
    check_study(spec)  # standard alone: nothing to judge about μP
    data["validate"] = {"widths": [16, 32], "lrs": [1e-3, 1e-2, 1e-1], "parametrizations": ["mup", "standard"]}
    with pytest.raises(ContractError, match="keeps its learning rates as width grows"):
        check_study(StudySpec.model_validate(data))


def test_without_mup_a_family_that_needs_it_says_how_to_install_it():
    script = ("import sys; sys.modules['mup'] = None\n"
              "from workers.models import build_model\n"
              "build_model('nanogpt', vocab_size=61, width=16, base_width=8, parametrization='mup')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "ConfigError: model family 'nanogpt' needs the package mup, which is not installed: pip install " \
        "--no-deps mup==1.0.0" in done.stderr, done.stderr
