"""The validate phase judged on a planned grid whose losses are written by hand (no training): a horizon sweep's
drift per doubling of steps, its figure, the transfer regret at the main horizon, the verdict and the report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from studies import load_catalog
from studies.phases import StudyState, TuneResult, ValidateResult
from studies.phases.base import Context
from studies.phases.validate import PHASE, validate_trials
from studies.sweeps import SWEEPS
from tests.studies._report import phase_report

SPEC = load_catalog("horizon_cpu")
CENTRE = {**SPEC.space.defaults(), "lr": 0.016}  # the proxy's lr (tuned at 150 steps): 2^-5.97


class Folder:
    def __init__(self, root: Path) -> None:
        self.root = root

    def artifact(self, name: str) -> Path:
        return self.root / name

    def figure(self, name: str) -> Path:
        return self.root / f"{name}.png"

    def write_artifact(self, name: str, data: object) -> Path:
        return self.root / name


def _optimum(steps: int) -> float:
    """log2 of the optimal lr: 2^-6 at 150 steps, 0.4 octave lower per doubling of steps."""
    return -6.0 - 0.4 * np.log2(steps / 150)


def _table() -> pd.DataFrame:
    rows = []
    for trial in validate_trials(SPEC, CENTRE):
        x, steps = np.log2(trial.hparams["lr"]), (trial.at or {}).get("horizon") or 0
        loss = 5.0 - 0.1 * np.log2(steps) + 0.05 * (x - _optimum(steps)) ** 2 + 0.002 * trial.seed
        rows.append({**trial.columns(SPEC), "status": "completed", "eval_loss": loss, "steps": steps})
    return pd.DataFrame(rows)


def test_a_horizon_sweep_is_judged_along_the_steps(tmp_path):
    state = StudyState(study_id="h", spec_hash="x", phases={"tune": TuneResult(status="done", best_hparams=CENTRE)})
    ctx = Context(spec=SPEC, state=state, tables=lambda name: None)
    result = PHASE.judge(ctx, _table(), Folder(tmp_path))
    assert isinstance(result, ValidateResult) and result.drift() is None  # one width: no drift along width
    [drift] = result.along("horizon")[0]
    assert drift.axis == "horizon" and abs(drift.mup_drift + 0.4) < 0.02
    assert (tmp_path / "horizon.png").exists() and PHASE.figures(result) == {"validate (horizon)": "horizon"}
    # the regret at 600 steps (the target's length): the lr tuned at 150 steps is 0.83 octave too large there
    [regret] = result.along("width")[1]
    assert regret.width == 64 and regret.source == "the tuned centre"
    assert regret.regret is not None and abs(regret.regret - 0.05 * (np.log2(0.016) + 6.8) ** 2) < 2e-3
    verdict = PHASE.verdict(SPEC, ValidateResult.model_validate(result.model_dump(mode="json")))
    assert "lr_horizon_drift.mup.w64" in verdict.metrics[0] and "regret.lr.mup.w64" in verdict.metrics[0]
    assert verdict.tags == {"lr_horizon_drift_passed": "true"}
    assert "per doubling of training steps" in verdict.sentence
    assert "Transfer regret in lr at width 64" in verdict.sentence
    flag = SWEEPS["horizon"].flag(SPEC, result.along("horizon")[0])
    assert flag is not None and "tune trains 150 steps, the target 600" in flag
    assert f"drifts {drift.mup_drift:+.2f}" in flag
    assert f"at 600 steps lies ≈ {2 * drift.mup_drift:+.2f} log2(lr) from the optimum at the 150 steps" in flag
    report = phase_report(SPEC, {"tune": {"best_hparams": CENTRE}, "validate": result.model_dump()},
                          {"name": SPEC.name})
    assert f"**horizon: {flag}**" in report.split("## tune")[1]
    validate = report.split("## validate")[1]
    assert "Transfer regret in lr at width 64" in validate and "drift (log2 lr per doubling of steps)" in validate
    assert "| horizon |" in validate or "| horizon" in validate


DEEP = load_catalog("depth_cpu")
DEEP_CENTRE = {**DEEP.space.defaults(), "lr": 0.02}


def _depth_losses() -> pd.DataFrame:
    """depth_cpu's planned grid: completep's optimum stays at 2^-5.5 over depth, none's falls 0.7 octave per doubling
    of depth (the seeds add a constant)."""
    rows = []
    for trial in validate_trials(DEEP, DEEP_CENTRE):
        x, depth = np.log2(trial.hparams["lr"]), trial.depth or 0
        optimum = -5.5 - (0.7 * np.log2(depth / 2) if (trial.at or {}).get("depth_parametrization") == "none" else 0.0)
        loss = 5.5 - 0.1 * np.log2(depth) + 0.05 * (x - optimum) ** 2 + 0.002 * trial.seed
        rows.append({**trial.columns(DEEP), "status": "completed", "eval_loss": loss, "steps": 100})
    return pd.DataFrame(rows)


def test_a_depth_sweep_is_judged_along_depth(tmp_path):
    state = StudyState(study_id="d", spec_hash="x", phases={"tune": TuneResult(status="done",
                                                                              best_hparams=DEEP_CENTRE)})
    ctx = Context(spec=DEEP, state=state, tables=lambda name: None)
    result = PHASE.judge(ctx, _depth_losses(), Folder(tmp_path))
    assert isinstance(result, ValidateResult) and result.drift() is None and result.along("width")[1] == []
    drift = result.drift("depth")
    assert drift is not None and drift.axis == "depth" and abs(drift.drift["completep"]) < 0.02
    assert abs(drift.drift["none"] + 0.7) < 0.05 and drift.passed
    assert {o.at for o in drift.optima} == {2, 4, 8} and {o.width for o in drift.optima} == {32}
    assert (tmp_path / "depth.png").exists() and PHASE.figures(result) == {"validate (depth)": "depth"}
    assert result.drifts == [drift]
    verdict = PHASE.verdict(DEEP, ValidateResult.model_validate(result.model_dump(mode="json")))
    assert set(verdict.metrics[0]) == {"step", "lr_depth_drift.completep", "lr_depth_drift.none"}
    assert verdict.tags == {"lr_depth_drift_passed": "true"}
    assert "lr depth drift: completep's optimal lr at width 32 drifts" in verdict.sentence
    assert "per doubling of depth" in verdict.sentence and "; none drifts -0.7" in verdict.sentence
    report = phase_report(DEEP, {"validate": result.model_dump()}, {"name": DEEP.name},
                          plots={"validate (depth)": "depth.png"})
    validate = report.split("## validate")[1]
    assert "drift (log2 lr per doubling of depth)" in validate and "| depth |" in validate
    assert "![validate (depth)](depth.png)" in validate and "| horizon" not in validate
