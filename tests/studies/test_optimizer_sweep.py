"""The optimizer sweep (`validate.optimizers`, `studies/sweeps/optimizer.py`): its bounds, its plan (each listed
optimizer's lr at every validate width under mup, Muon's knobs dropped beside AdamW), its judgement (the study's
optimizer, read from the width sweep's rows, against each, both carried from the narrowest width), what the report and
the summary say of it, and a tiny Muon study that trains both optimizers and reports the comparison."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from studies import load_catalog
from studies.phases import StudyState, TuneResult
from studies.phases.base import Context
from studies.phases.validate import PHASE, validate_trials
from studies.spec import StudySpec
from studies.sweeps import SWEEPS
from tests.studies.test_validate_phase import Folder

LRS = [2.0**k for k in range(-10, -3)]


def _spec(train: dict | None = None, **validate: object) -> StudySpec:
    data = load_catalog("tiny").as_dict()
    data["train"].update({"optimizer": "muon", "muon_momentum": 0.9, **(train or {})})
    data.update(transfer=None, verify=None, validate={"widths": [16, 32, 64], "lrs": LRS, "seeds": 2,
                                                      "optimizers": ["adamw"], **validate})
    return StudySpec.model_validate(data)


SPEC = _spec()
CENTRE = {**SPEC.space.defaults(), "lr": 2.0**-7}


def test_optimizers_are_listed_once_beside_train_optimizer_at_two_widths_or_more():
    with pytest.raises(ValidationError, match=r"optimizers \['adamw', 'adamw'\]: list each optimizer once"):
        _spec(optimizers=["adamw", "adamw"])
    with pytest.raises(ValidationError, match=r"validate.optimizers\[0\]='muon' is train.optimizer already: list the "
                                              r"optimizers to compare it with, e.g. \[adamw\]"):
        _spec(optimizers=["muon"])
    with pytest.raises(ValidationError, match="validate.widths=\\[16\\]: give 2–4 widths"):
        _spec(widths=[16])  # not a sweep alone: it reads the width sweep's rows
    with pytest.raises(ValidationError, match="validate.optimizers need 2–4 validate.widths"):
        _spec(widths=[16], steps=[10, 20])  # a horizon sweep alone beside it
    with pytest.raises(ValidationError, match="validate.optimizers.0\n  Input should be 'adamw' or 'muon'"):
        _spec(optimizers=["sgd"])
    assert "optimizers" not in _spec(optimizers=None).as_dict()["validate"]  # dumped only when set: hashes stay
    adamw = _spec(train={"optimizer": "adamw", "muon_momentum": 0.95}, optimizers=["muon"])
    assert [s.name for s in adamw.validate_.present()] == ["width", "optimizer"]


def test_each_listed_optimizer_sweeps_lr_at_every_width_under_mup_and_trains_with_its_own_knobs():
    sweep = [t for t in validate_trials(SPEC, CENTRE) if t.sweep == "optimizer"]
    assert len(sweep) == 3 * len(LRS) * 2 and {t.parametrization for t in sweep} == {"mup"}
    assert "validate-mup-w32-oadamw-lr0.00781-s1" in {t.trial_key for t in sweep}
    config = sweep[0].trial_config(SPEC)
    assert (config["optimizer"], config["muon_momentum"]) == ("adamw", 0.95)  # Muon's knob reset beside AdamW
    width = next(t for t in validate_trials(SPEC, CENTRE) if t.sweep == "width").trial_config(SPEC)
    assert (width["optimizer"], width["muon_momentum"], width["steps"]) == ("muon", 0.9, config["steps"])
    assert sweep[0].columns(SPEC)["optimizer"] == "adamw" and not SWEEPS["optimizer"].forecast
    from studies.members import member_key

    assert member_key(config) != member_key(width | {"lr": config["lr"]})  # never batched with Muon's trials


OPTIMA = {"muon": -6.0, "adamw": -8.0}


def _rows() -> pd.DataFrame:
    """Muon (the width sweep's mup and standard rows) 0.1 nats below AdamW at its optimum, curves straight in tokens."""
    rows = []
    for t in validate_trials(SPEC, CENTRE):
        opt = (t.at or {}).get("optimizer", "muon")
        loss = 4.0 + 0.1 * (opt == "adamw") + 0.05 * (math.log2(t.hparams["lr"]) - OPTIMA[opt]) ** 2 + 0.01 * t.seed
        curve = [[t_, 8.0 + (loss - 8.0) * t_ / 1000] for t_ in (250, 500, 750, 1000)]
        rows.append({**t.columns(SPEC), "status": "completed", "eval_loss": loss, "tokens": 1000,
                     "eval_curve": json.dumps(curve)})
    return pd.DataFrame(rows)


class Written(Folder):
    def write_artifact(self, name: str, data: object):
        (self.root / name).write_text(json.dumps(data))
        return self.root / name


def test_the_report_and_the_summary_say_what_muon_bought_after_both_were_transferred(tmp_path):
    state = StudyState(study_id="o", spec_hash="x", phases={"tune": TuneResult(status="done", best_hparams=CENTRE)})
    table = _rows()
    ctx = Context(spec=SPEC, state=state, tables=lambda name: table if name == "validate" else None)
    result = PHASE.judge(ctx, table, Written(tmp_path))
    assert result.forecast is not None and result.forecast.n_points == 3 * 2  # Muon's optima alone: 3 widths × 2 seeds
    assert result.forecast.log2_lr == pytest.approx(-6, abs=0.05)  # AdamW's (-8) left out
    written = json.loads((tmp_path / "optimizers.json").read_text())
    assert [(g["against"], g["target"], g["lr"]) for g in written] == [("adamw", 64, {"muon": 2**-6, "adamw": 2**-8})]
    line = ("Muon against adamw at width 64 (mup), each at its own lr carried from width 16 (muon 0.0156, adamw "
            "0.00391): eval loss 4.0050")
    section = PHASE.section(ctx, result, {"validate": table})
    assert any(part.startswith(f"**{line}") and "3 of" not in part and "2 of 2 seeds reach it" in part
               for part in section)
    printed = []

    class Out:
        def print(self, *parts, **kw):
            printed.append(" ".join(str(p) for p in parts))

    PHASE.summary(ctx, result, Out(), {})
    assert any(line in p and "-0.1000" in p for p in printed)


@pytest.mark.parametrize("drop", ["adamw", "width"])
def test_a_comparison_without_its_rows_names_them(drop):
    table = _rows()
    keep = table["sweep"] != ("optimizer" if drop == "adamw" else "width")
    rows = SWEEPS["optimizer"].rows(table[keep | (table["width"] != 64)])
    with pytest.raises(ValueError, match=f"optimizer {'adamw' if drop == 'adamw' else 'muon'!r} has no lr sweep"):
        SWEEPS["optimizer"].gains(SPEC, rows)


def test_a_tiny_muon_study_compares_adamw_after_both_were_transferred(tmp_path, monkeypatch):
    """tiny under Muon with AdamW listed, through the driver: both optimizers train at every validate width, their
    rows carry eval curves, and the report says what Muon bought at the widest width."""
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
    data["train"]["optimizer"] = "muon"
    data.update(transfer=None, verify=None, validate={"widths": [16, 32], "lrs": [0.004, 0.016, 0.064],
                                                      "parametrizations": ["mup"], "steps": 20,
                                                      "optimizers": ["adamw"]})
    state = run_study(StudySpec.model_validate(data), "optimizer-e2e", runner=InProcessRunner(), tracker=NullTracker())
    assert state.status == "succeeded", state.error
    artifacts = StudyFolder("optimizer-e2e", tmp_path).artifacts
    table = pd.read_csv(artifacts / "trials.csv")
    validate = table[table["phase"] == "validate"]
    assert validate.groupby(validate["optimizer"].fillna("muon")).size().to_dict() == {"adamw": 6, "muon": 6}
    curves = [json.loads(c) for c in validate["eval_curve"]]
    assert all([t for t, _ in c] == [5120, 10240] and np.isfinite([x for _, x in c]).all() for c in curves)
    assert "Muon against adamw at width 32 (mup), each at its own lr carried from width 16" in \
        (artifacts / "report.md").read_text()
