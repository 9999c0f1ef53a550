"""docs/plugins.md's two complete plugins, run as written: each python block marked `<!-- example: NAME -->` is
written to a module file named by its first line (`# module.py  (entry point: family = "module:FAMILY")`),
loaded through an entry point as an installed plugin would be (`studies.family._load`: its load-time checks, the
name rule), then checked at the door (`workers.model_check.check_model`, under μP and the standard
parametrization) and trained for 3 steps. The hand-written example, which declares its hparams batchable, also
trains two members as one batched model with the losses of their solo trials. A doc example that breaks the
contract fails here."""

from __future__ import annotations

import importlib
import math
import re
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from studies import family as registry
from studies.family import ENTRY_POINT_GROUP, Family
from studies.spec import DataSpec, TrialConfig
from tests.conftest import float64_default
from workers.model_check import check_model
from workers.train import train, train_trial

DOC = Path(__file__).parents[2] / "docs" / "plugins.md"
BLOCK = re.compile(r"^<!-- example: (\S+) -->\n```python\n(.*?)^```$", re.M | re.S)
HEADER = re.compile(r'# (\w+)\.py +\(entry point: ([\w.-]+) = "(\w+):(\w+)"\)')
DATA = DataSpec(max_tokens=20_000, seq_len=16, vocab_size=200, objective="clm")
EXAMPLES = ("from_mup", "handwritten")


def examples() -> dict[str, str]:
    return dict(BLOCK.findall(DOC.read_text(encoding="utf-8")))


def test_the_doc_marks_both_examples_with_their_module_and_entry_point():
    found = examples()
    assert sorted(found) == sorted(EXAMPLES), sorted(found)
    for name, source in found.items():
        header = HEADER.match(source.splitlines()[0])
        assert header, f"example {name!r} starts with {source.splitlines()[0]!r}"
        module, _, ep_module, _ = header.groups()
        assert ep_module == module, f"example {name!r}: its entry point names module {ep_module!r}, not {module!r}"


@pytest.fixture
def plugin(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Family]:
    """The example `request.param` as an installed plugin would load: its family registered for the test."""
    source = examples()[request.param]
    header = HEADER.match(source.splitlines()[0])
    assert header, source.splitlines()[0]
    module, ep_name, ep_module, attr = header.groups()
    (tmp_path / f"{module}.py").write_text(source, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = {name: dict(getattr(registry, name)) for name in ("FAMILIES", "PLUGINS", "BROKEN")}
    try:
        problem = registry._load(EntryPoint(ep_name, f"{ep_module}:{attr}", ENTRY_POINT_GROUP))
        assert problem is None, problem
        yield registry.FAMILIES[ep_name]
    finally:
        for name, before in saved.items():
            getattr(registry, name).clear()
            getattr(registry, name).update(before)
        sys.modules.pop(module, None)
        importlib.invalidate_caches()


def _hp(parametrization: str = "mup") -> dict[str, object]:
    return {"width": 16, "base_width": 8, "parametrization": parametrization}


def _trial(family: Family, **update: object) -> TrialConfig:
    cfg = TrialConfig(model=family.name, model_hp=_hp(), lr=1e-2, steps=3, eval_every=3, log_every=3,
                      warmup_steps=1, eval_batches=2, batch_size=8, data=DATA, device="cpu")
    return cfg.model_copy(update=update)


@pytest.mark.parametrize("plugin", EXAMPLES, indirect=True)
@pytest.mark.parametrize("parametrization", ["mup", "standard"])
def test_each_example_keeps_the_contract_at_the_door(plugin, parametrization):
    check_model(plugin.name, _hp(parametrization), DATA.seq_len)


@pytest.mark.parametrize("plugin", EXAMPLES, indirect=True)
def test_each_example_trains_with_mus_hidden_learning_rate(plugin):
    report = train_trial(_trial(plugin))
    assert report.status == "completed", report.message
    assert math.isfinite(report.eval_loss)
    assert 0.5 in report.lr_multipliers.values(), report.lr_multipliers  # a hidden group's lr × base_width/width
    if plugin.name == "handlm":
        assert "handlm.readout_rms" in report.rows[-1]  # its eval_metrics hook


@pytest.mark.parametrize("plugin", ["handwritten"], indirect=True)
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # vmap's attention fallback on CPU
def test_the_batchable_example_trains_as_one_batched_model_like_its_solo_trials(plugin):
    assert plugin.batchable is not None
    with float64_default():
        a = _trial(plugin)
        b = _trial(plugin, lr=2e-2, model_hp={**a.model_hp, "output_mult": 2.0})
        batched = train([a, b])
        for cfg, got in zip((a, b), batched, strict=True):
            alone = train_trial(cfg)
            assert got.status == alone.status == "completed", (got.message, alone.message)
            assert got.eval_loss == pytest.approx(alone.eval_loss, rel=1e-8)
        assert batched[0].eval_loss != pytest.approx(batched[1].eval_loss, rel=1e-6)
