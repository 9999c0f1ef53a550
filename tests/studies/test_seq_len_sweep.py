"""The context sweep (`validate.seq_lens`, `studies/sweeps/seq_len.py`): its bounds, its plan (tokens per step or
steps held fixed), its judgement (the drift per doubling of context and the regret of carrying the base context's lr),
what every reader says of it, and a tiny study that trains each context."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from service.verdicts import study_verdicts
from studies import load_catalog
from studies.phases import StudyState, TuneResult, ValidateResult
from studies.phases.base import Context
from studies.phases.validate import PHASE, validate_trials
from studies.spec import StudySpec
from studies.sweeps import SWEEPS
from studies.sweeps.seq_len import seq_batch
from tests.studies.test_validate_phase import Folder


def _spec(**validate: object) -> StudySpec:
    data = load_catalog("tiny").as_dict()  # PT (any length) at seq_len 32, batch 16
    data.update(transfer=None, verify=None, validate={"widths": [16, 32], "lrs": [2.0**k for k in range(-11, -2)],
                                                      "parametrizations": ["mup"], "seeds": 2, "seq_lens": [16, 32, 64],
                                                      **validate})
    return StudySpec.model_validate(data)


SPEC = _spec()
CENTRE = {**SPEC.space.defaults(), "lr": 2.0**-7}


def test_seq_lens_are_two_to_four_increasing_lengths_and_fit_the_model():
    with pytest.raises(ValidationError, match=r"seq_lens \[32, 16\]: give 2–4 strictly increasing"):
        _spec(seq_lens=[32, 16])
    with pytest.raises(ValidationError, match="validate.seq_lens.0\n  Input should be greater than 0"):
        _spec(seq_lens=[0, 16])
    data = load_catalog("compare_cpu").as_dict()["compare"]["baselines"][0]["model"]  # BERT: learned positions
    bert = load_catalog("tiny").as_dict()
    bert.update(model={**data, "arch": {**data["arch"], "max_len": 64}}, space=None, transfer=None, verify=None,
                validate={"widths": [16, 32], "lrs": [0.001, 0.01, 0.1], "seq_lens": [32, 128]})
    with pytest.raises(ValidationError, match=r"validate.seq_lens\[1\]=128 exceeds model.arch.max_len 64"):
        StudySpec.model_validate(bert)
    alone = _spec(widths=[16])  # one width: a context sweep alone
    assert [s.name for s in alone.validate_.present()] == ["seq_len"]
    assert "seq_lens" not in _spec(seq_lens=None).as_dict()["validate"]  # dumped only when set: hashes stay


def test_each_context_trains_at_its_length_on_the_same_tokens_per_step():
    sweep = [t for t in validate_trials(SPEC, CENTRE) if t.sweep == "seq_len"]
    assert len(sweep) == 2 * 3 * 9 * 2 and "validate-mup-w16-c64-lr0.00391-s1" in {t.trial_key for t in sweep}
    configs = {t.at["seq_len"]: t.trial_config(SPEC) for t in sweep}
    assert {c: (cfg["data"]["seq_len"], cfg["batch_size"], cfg["steps"]) for c, cfg in configs.items()} == {
        16: (16, 32, 30), 32: (32, 16, 30), 64: (64, 8, 30)}  # 512 tokens a step at every context
    steps = _spec(seq_fixed="steps")
    assert {seq_batch(steps, c) for c in (16, 32, 64)} == {16}
    row = sweep[0].columns(SPEC)
    assert (row["sweep"], row["seq_len"], row["batch_size"]) == ("seq_len", 16, 32)


def _optimum(width: int, context: int) -> float:
    """log2 of the optimal lr: 2^-7 at context 32, 0.6 octave lower per doubling of the context, flat in width."""
    return -7.0 - 0.6 * np.log2(context / 32) + 0.0 * width


def _judged(tmp_path: Path) -> ValidateResult:
    rows = []
    for t in validate_trials(SPEC, CENTRE):
        context = (t.at or {}).get("seq_len", 32)
        shift = 0.05 * (-1) ** t.seed
        loss = 5.0 + 0.05 * (np.log2(t.hparams["lr"]) - _optimum(t.width, context) - shift) ** 2
        rows.append({**t.columns(SPEC), "status": "completed", "eval_loss": loss, "steps": t.steps(SPEC)})
    state = StudyState(study_id="c", spec_hash="x", phases={"tune": TuneResult(status="done", best_hparams=CENTRE)})
    result = PHASE.judge(Context(spec=SPEC, state=state, tables=lambda name: None), pd.DataFrame(rows),
                         Folder(tmp_path))
    assert isinstance(result, ValidateResult)
    return ValidateResult.model_validate(result.model_dump(mode="json"))  # as state.json keeps it


def test_the_drift_per_doubling_of_context_and_the_regret_of_the_base_contexts_lr(tmp_path):
    result = _judged(tmp_path)
    drifts, regrets = result.along("seq_len")
    assert [d.width for d in drifts] == [16, 32]
    for d in drifts:
        assert d.axis == "seq_len" and abs(d.mup_drift + 0.6) < 0.05 and not d.passed  # |−0.6| > 0.5
        assert d.drift_ci["mup"] is not None and d.drift_ci["mup"][0] < -0.6 < d.drift_ci["mup"][1]
        assert "per doubling of context length" in d.verdict
    # context 32's optimum carried to 16 and 64: 0.6 octave off each
    assert [(r.width, r.at) for r in regrets] == [(16, 16), (16, 64), (32, 16), (32, 64)]
    assert all(r.axis == "seq_len" and abs(r.regret - 0.05 * 0.6**2) < 5e-3 for r in regrets)
    assert abs(result.drift().mup_drift) < 0.05  # the width sweep beside it: flat
    assert (tmp_path / "seq_len.png").exists() and PHASE.figures(result)["validate (context)"] == "seq_len"


def test_every_reader_says_the_context_drift(tmp_path):
    result = _judged(tmp_path)
    verdict = PHASE.verdict(SPEC, result)
    metrics = verdict.metrics[0]
    assert abs(metrics["lr_seq_len_drift.mup.w16"] + 0.6) < 0.05 and "seq_len_regret.lr.mup.w32.c64" in metrics
    assert verdict.tags["lr_seq_len_drift_passed"] == "false"
    assert "lr context drift: mup's optimal lr at width 16 drifts -0.6" in verdict.sentence
    assert "Context regret in lr at width 16: context 16: mup +0.018 nats" in verdict.sentence
    state = StudyState(study_id="c", spec_hash="x", phases={"tune": TuneResult(status="done", best_hparams=CENTRE),
                                                            "validate": result.model_copy(update={"status": "done"})})
    api = study_verdicts(state).validate_
    assert api is not None and [d.axis for d in api.drifts] == ["width", "seq_len", "seq_len"]
    assert not api.passed and [r.seq_len for r in api.regret if r.seq_len] == [16, 64, 16, 64]
    section = PHASE.section(Context(spec=SPEC, state=state, tables=lambda name: None), result, {})
    assert any("drift (log2 lr per doubling of context)" in part for part in section)
    assert any(part.startswith("**Context regret in lr at width 32: context 16: mup") for part in section)
    # at fixed tokens per step the context moves with the batch: the fit's batch term carries it (+0.6 per doubling of
    # the batch is −0.6 per doubling of context), and the target's optimum comes out right
    f = result.forecast
    assert f is not None and f.coefficients["batch_size"] == pytest.approx(0.6, abs=0.05)
    assert "seq_len moves with a term before it" in f.note and f.log2_lr == pytest.approx(-7.0, abs=0.05)


def test_a_tiny_context_sweep_trains_each_length(tmp_path, monkeypatch):
    """tiny with lr swept at contexts 16 and 32 at width 16 through the driver: each trial trains on sequences of its
    own length at the same tokens per step, and the study reports the drift per doubling of context."""
    from tests.conftest import DEFAULT_DATA
    from workers.driver import run_study
    from workers.folder import StudyFolder
    from workers.runner import InProcessRunner
    from workers.tracker import NullTracker

    (DEFAULT_DATA / "corpora").mkdir(parents=True, exist_ok=True)
    (tmp_path / "corpora").symlink_to(DEFAULT_DATA / "corpora")
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    data = load_catalog("tiny").as_dict()
    data["tune"].update(num_trials=2)
    data.update(transfer=None, verify=None, validate={"widths": [16], "lrs": [0.004, 0.016, 0.064],
                                                      "parametrizations": ["mup"], "steps": 10, "seq_lens": [16, 32]})
    spec = StudySpec.model_validate(data)
    state = run_study(spec, "context-e2e", runner=InProcessRunner(), tracker=NullTracker())
    assert state.status == "succeeded", state.error
    artifacts = StudyFolder("context-e2e", tmp_path).artifacts
    table = pd.read_csv(artifacts / "trials.csv")
    sweep = table[(table["phase"] == "validate") & (table["sweep"] == "seq_len")]
    assert {int(c): int(b) for c, b in zip(sweep["seq_len"], sweep["batch_size"], strict=True)} == {16: 32, 32: 16}
    assert set(sweep["steps"]) == {10} and sweep["tokens"].nunique() == 1  # the same tokens at each length
    result = state.result("validate", ValidateResult)
    assert result is not None and [d.axis for d in result.drifts] == ["seq_len"]
    report = (artifacts / "report.md").read_text()
    assert "per doubling of context length" in report and (artifacts / "seq_len.png").exists()
    assert SWEEPS["seq_len"].flag(spec) is None  # tune trains at the target's context
