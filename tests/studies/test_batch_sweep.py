"""The batch sweep (`validate.batch_sizes`) and the tune batch (`tune.batch_size`): the spec's bounds and messages,
the content hashes it leaves alone, the planned trials (keys, steps at a fixed token budget or fixed steps, batch
sizes), their cost, the judged drift, regret, verdict and report on a hand-written grid, the flag, and the API's
bound."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from service.limits import Limits, check
from studies import load_catalog
from studies.cost import plan_cost, planned_runs, sequence_flops
from studies.estimate import planned_jobs
from studies.members import batches
from studies.phases import StudyState, TuneResult, ValidateResult
from studies.phases.base import Context
from studies.phases.validate import PHASE, validate_trials
from studies.plan import PLANNED_COLUMNS, PlannedTrial
from studies.spec import CATALOG_DIR, StudySpec
from studies.sweeps import SWEEPS
from studies.sweeps.batch import batch_steps
from tests.studies._dicts import with_changes
from tests.studies._report import phase_report
from tests.studies.test_spec import error_of
from tests.studies.test_validate_phase import Folder

SPEC = load_catalog("batch_cpu")
CENTRE = {**SPEC.space.defaults(), "lr": 0.008}  # tuned at batch 8: 2^-6.97
MINIMAL = {"name": "demo", "train": {"batch_size": 16}, "tune": {"base_width": 16, "asha": {"grace_steps": 10}},
           "transfer": {"widths": [32, 64]}}


def spec_dict(**changes: object) -> dict:
    return with_changes(MINIMAL, **changes)


# ------------------------------------------------------------------------------------ the spec


@pytest.mark.parametrize(
    ("sizes", "needle"),
    [
        ([16], "2–4 strictly increasing batch sizes, e.g. [8, 16, 32]"),
        ([8, 16, 32, 64, 128], "2–4 strictly increasing batch sizes"),
        ([32, 16], "2–4 strictly increasing batch sizes"),
        ([16, 16], "2–4 strictly increasing batch sizes"),
        ([0, 16], "validate.batch_sizes.0\n  Input should be greater than 0"),
    ],
)
def test_invalid_batch_sizes_name_the_field_and_the_fix(sizes, needle):
    message = error_of(spec_dict(validate={"widths": [16, 32], "lrs": [1, 2, 3], "batch_sizes": sizes}))
    assert "validate.batch_sizes" in message and needle in message


def test_batch_fixed_and_tune_batch_size_are_bounded():
    message = error_of(spec_dict(validate={"widths": [16, 32], "lrs": [1, 2, 3], "batch_fixed": "flops"}))
    assert "validate.batch_fixed" in message and "'tokens' or 'steps'" in message
    assert "tune.batch_size\n  Input should be greater than 0" in error_of(spec_dict(**{"tune.batch_size": 0}))


def test_one_validate_width_is_a_batch_sweep_alone():
    alone = StudySpec.model_validate(spec_dict(validate={"widths": [32], "lrs": [1, 2, 3], "batch_sizes": [8, 16]}))
    assert alone.validate_.batch_sizes == [8, 16] and not SWEEPS["width"].present(alone.validate_)
    message = error_of(spec_dict(validate={"widths": [32], "lrs": [1, 2, 3]}))
    assert "validate.batch_sizes or validate.seq_lens (a horizon, depth, batch size or context sweep alone)" in message


def test_the_largest_batch_must_outlast_the_warmup_at_a_fixed_token_budget():
    data = spec_dict(**{"train.steps": 40, "train.warmup_steps": 10},
                     validate={"widths": [32], "lrs": [1, 2, 3], "batch_sizes": [16, 64]})
    message = error_of(data)  # 40 steps × 16 / 64 = 10 steps at batch 64
    assert ("train.warmup_steps=10 must be < the 10 steps the batch sweep trains at validate.batch_sizes[1]=64"
            in message)
    assert "lower warmup_steps, raise validate.steps, drop the largest batch size or set validate.batch_fixed: steps" \
        in message
    fixed = with_changes(data, **{"validate.batch_fixed": "steps"})
    assert batch_steps(StudySpec.model_validate(fixed), 64) == 40


def test_a_compare_study_has_no_tune_batch():
    data = load_catalog("compare_cpu").as_dict()
    data["tune"]["batch_size"] = 8
    assert "tune.batch_size is unused in a compare study" in error_of(data)


def test_existing_catalog_specs_keep_their_hashes_and_dumps():
    """The new fields are left out of the dump at their defaults: the catalog's studies keep their ids (hashes
    recorded before the fields existed)."""
    recorded = {"cpu_demo": "e48352ede783", "pt_lr_alignment": "b64143c9a7f1", "horizon_cpu": "3a5d954715d0",
                "depth_cpu": "33c67939603c", "tiny": "1a77d356e3a3", "compare_cpu": "b990cf626d01",
                "paper_pt_minipile": "967496074cac"}
    for name, prefix in recorded.items():
        spec = StudySpec.from_yaml(CATALOG_DIR / f"{name}.yaml")
        assert spec.content_hash().startswith(prefix), name
        dumped = spec.as_dict()
        assert "batch_size" not in dumped["tune"]
        assert dumped.get("validate") is None or not {"batch_sizes", "batch_fixed"} & set(dumped["validate"])


def test_explicit_defaults_hash_like_omitted_ones_and_set_values_do_not():
    base = spec_dict(validate={"widths": [16, 32], "lrs": [1, 2, 3]})
    plain = StudySpec.model_validate(base).content_hash()
    explicit = with_changes(base, **{"tune.batch_size": None, "validate.batch_sizes": None,
                                     "validate.batch_fixed": "tokens"})
    assert StudySpec.model_validate(explicit).content_hash() == plain
    for change in ({"tune.batch_size": 8}, {"validate.batch_sizes": [8, 16]}, {"validate.batch_fixed": "steps"}):
        assert StudySpec.model_validate(with_changes(base, **change)).content_hash() != plain, change
    assert StudySpec.from_yaml(SPEC.to_yaml()) == SPEC  # the catalog study round-trips with its fields


# ------------------------------------------------------------------------------------ planning


def test_batch_cpu_plans_lr_at_each_batch_on_the_same_tokens():
    trials = validate_trials(SPEC, CENTRE)
    assert len(trials) == 3 * 6 * 2 and all((t.at or {}).get("batch_size") in (8, 16, 32) for t in trials)
    assert trials[0].trial_key == "validate-mup-w64-b8-lr0.002-s0"
    assert {t.trial_key for t in trials} >= {"validate-mup-w64-b16-lr0.016-s1", "validate-mup-w64-b32-lr0.064-s0"}
    assert len({t.trial_key for t in trials}) == len(trials)
    steps = {(t.at or {}).get("batch_size"): t.steps(SPEC) for t in trials}
    assert steps == {8: 400, 16: 200, 32: 100}  # 400 × 8 / B: each trial sees 400 × 8 sequences
    config = next(t for t in trials if (t.at or {}).get("batch_size") == 32).trial_config(SPEC)
    assert config["batch_size"] == 32 and config["steps"] == 100 and config["lr"] == 0.002
    row = trials[0].columns(SPEC)
    assert row["batch_size"] == 8 and "horizon" not in row and row["sweep"] == "batch" and "sweep" in PLANNED_COLUMNS
    assert PlannedTrial.from_dict(trials[0].as_dict()) == trials[0]


def test_fixed_steps_keep_the_horizon_and_fixed_tokens_round_to_at_least_one_step():
    data = SPEC.as_dict()
    data["validate"]["batch_fixed"] = "steps"
    fixed = StudySpec.model_validate(data)
    assert {t.steps(fixed) for t in validate_trials(fixed, CENTRE)} == {400}
    odd = StudySpec.model_validate(spec_dict(**{"train.warmup_steps": 0, "train.steps": 3, "tune.asha.enabled": False},
                                             validate={"widths": [32], "lrs": [1, 2, 3], "batch_sizes": [16, 24, 256]}))
    assert [batch_steps(odd, b) for b in (16, 24, 256)] == [3, 2, 1]  # round(3 × 16/24) = 2; 3 × 16/256 → 1


def test_the_base_batch_is_tunes_and_tune_trials_train_at_it():
    assert SPEC.base_batch() == 8 and SPEC.batch_for("tune") == 8 and SPEC.batch_for("validate") == 32
    tune = PlannedTrial.for_tune(SPEC, "00001", {"lr": 0.01})
    assert tune.trial_config(SPEC)["batch_size"] == 8 and tune.trial_config(SPEC)["steps"] == 400
    plain = StudySpec.model_validate(spec_dict())
    assert plain.base_batch() == 16 and PlannedTrial.for_tune(plain, "0", {"lr": 0.01}).trial_config(plain)[
        "batch_size"] == 16


def test_no_batched_process_mixes_batch_sizes():
    for group in batches(SPEC, validate_trials(SPEC, CENTRE), 64):
        assert len({(t.at or {}).get("batch_size") for t in group}) == 1


def test_the_cost_scales_with_each_trials_batch_and_steps():
    per_seq = sequence_flops(SPEC, 64)
    validate = next(p for p in plan_cost(SPEC).phases if p.phase == "validate")
    assert validate.steps == 2 * 6 * (400 + 200 + 100)
    assert validate.flops == pytest.approx(36 * 400 * 8 * per_seq)  # the same tokens at every batch size
    tune = next(p for p in plan_cost(SPEC).phases if p.phase == "tune")
    assert tune.max_flops == pytest.approx(10 * 400 * 8 * per_seq)  # at tune.batch_size, not train.batch_size
    assert sorted({s for _, s in planned_runs(SPEC)["validate"]}) == [100, 200, 400]
    jobs = planned_jobs(SPEC, cpus=2)
    assert {(j.shape.batch_size, j.steps) for j in jobs["validate"]} == {(8, 400), (16, 200), (32, 100)}
    assert {j.shape.batch_size for j in jobs["tune"]} == {8}
    assert {j.shape.label() for j in jobs["validate"]} == {"w64 batch 8", "w64 batch 16", "w64"}


# ------------------------------------------------------------------------------------ judging


def _optimum(batch: int) -> float:
    """log2 of the optimal lr: 2^-7 at batch 8, 0.9 octave higher per doubling of the batch (near the linear rule)."""
    return -7.0 + 0.9 * np.log2(batch / 8)


def _table() -> pd.DataFrame:
    rows = []
    for trial in validate_trials(SPEC, CENTRE):
        x, batch = np.log2(trial.hparams["lr"]), (trial.at or {}).get("batch_size") or 0
        shift = 0.05 * (-1) ** trial.seed  # each seed's optimum a little apart: the interval has a width
        loss = 5.0 + 0.05 * (x - _optimum(batch) - shift) ** 2
        rows.append({**trial.columns(SPEC), "status": "completed", "eval_loss": loss, "steps": trial.steps(SPEC)})
    return pd.DataFrame(rows)


def _judged(tmp_path: Path) -> ValidateResult:
    state = StudyState(study_id="b", spec_hash="x", phases={"tune": TuneResult(status="done", best_hparams=CENTRE)})
    result = PHASE.judge(Context(spec=SPEC, state=state, tables=lambda name: None), _table(), Folder(tmp_path))
    assert isinstance(result, ValidateResult)
    return ValidateResult.model_validate(result.model_dump(mode="json"))  # as state.json keeps it


def test_a_batch_sweep_is_judged_along_the_batch_size(tmp_path):
    result = _judged(tmp_path)
    assert result.drift() is None and result.along("width")[1] == [] and result.along("horizon")[0] == []
    [drift] = result.along("batch")[0]
    assert drift.axis == "batch" and abs(drift.mup_drift - 0.9) < 0.05 and not drift.passed  # |0.9| > 0.5
    assert drift.drift_ci["mup"] is not None and drift.drift_ci["mup"][0] < 0.9 < drift.drift_ci["mup"][1]
    assert (tmp_path / "batch.png").exists() and PHASE.figures(result) == {"validate (batch size)": "batch"}
    assert result.drifts == [drift]
    # batch 8's optimum (2^-7) carried to batch 16 (0.9 octave off) and 32 (1.8 octaves off)
    assert [(r.at, r.width) for r in result.along("batch")[1]] == [(16, 64), (32, 64)]
    for r, octaves in zip(result.along("batch")[1], (0.9, 1.8), strict=True):
        assert r.regret is not None and abs(r.regret - 0.05 * octaves**2) < 5e-3 and r.ci is not None
        assert r.regret_pct == pytest.approx(100 * r.regret / r.optimum_loss)


def test_the_verdict_report_and_summary_of_a_batch_sweep(tmp_path):
    result = _judged(tmp_path)
    [drift] = result.along("batch")[0]
    verdict = PHASE.verdict(SPEC, result)
    metrics = verdict.metrics[0]
    assert metrics["lr_batch_drift.mup.w64"] == pytest.approx(drift.mup_drift)
    assert {"batch_regret.lr.mup.w64.b16", "batch_regret_pct.lr.mup.w64.b32"} <= set(metrics)
    assert verdict.tags == {"lr_batch_drift_passed": "false"}
    assert "per doubling of batch size" in verdict.sentence and "nearest the linear rule (+1.0" in verdict.sentence
    assert "Batch regret in lr at width 64: batch 16: mup" in verdict.sentence
    assert "Batch: tune trains at batch size 8, the target at 32" in verdict.sentence
    assert not any("lr_batch" in column for _, column in PHASE.columns(SPEC, verdict))  # the run page keeps them

    flag = SWEEPS["batch"].flag(SPEC, result.along("batch")[0])
    assert flag is not None and flag.startswith("tune trains at batch size 8, the target at 32 (train.batch_size; "
                                                "2 doublings larger): mup's optimal lr at width 64 moves")
    assert f"lies ≈ {2 * drift.mup_drift:+.2f} log2(lr) from the optimum at the batch size 8 tune trained at" in flag
    report = phase_report(SPEC, {"tune": {"best_hparams": CENTRE}, "validate": result.model_dump()},
                          {"name": SPEC.name}, plots={"validate (batch size)": "batch.png"})
    assert f"**batch: {flag}**" in report.split("## tune")[1].split("## validate")[0]
    validate = report.split("## validate")[1]
    assert "drift (log2 lr per doubling of batch size)" in validate and "| batch_size |" in validate
    assert "Batch sweep (a fixed token budget: 400 steps at the base batch size 8" in validate
    assert "**Batch size: mup's optimal lr at width 64 moves" in validate and "| batch size |" in validate
    assert "![validate (batch size)](batch.png)" in validate

    buffer = io.StringIO()
    state = StudyState(study_id="b", spec_hash="x", phases={"tune": TuneResult(status="done", best_hparams=CENTRE),
                                                            "validate": {**result.model_dump(), "status": "done"}})
    PHASE.summary(Context(SPEC, state, lambda name: None), result, Console(file=buffer, width=250), {})
    out = buffer.getvalue()
    assert "lr sweep (validate) at width 64: optimal lr per batch size" in out
    assert "Batch size: mup's optimal lr at width 64 moves" in out and "Batch regret in lr at width 64" in out
    assert "batch: tune trains at batch size 8, the target at 32" in out


def test_the_flag_before_a_sweep_and_when_there_is_nothing_to_flag():
    assert "the validate batch sweep (validate.batch_sizes) will measure" in (SWEEPS["batch"].flag(SPEC) or "")
    data = SPEC.as_dict()
    data["validate"] = None
    unswept = StudySpec.model_validate(data)
    assert (SWEEPS["batch"].flag(unswept) or "").endswith("measure it with validate.batch_sizes: [8, ..., 32]")
    data["tune"]["batch_size"] = 64
    larger = StudySpec.model_validate(data)
    assert (SWEEPS["batch"].flag(larger) or "").startswith(
        "tune trains at batch size 64, the target at 32 (train.batch_size; "
                                                 "1 doublings smaller)")
    data["tune"]["batch_size"] = 32
    assert SWEEPS["batch"].flag(StudySpec.model_validate(data)) is None  # tune trains at the target's batch
    batch_flag = SWEEPS["batch"].flag
    assert batch_flag(load_catalog("cpu_demo")) is None and batch_flag(load_catalog("compare_cpu")) is None


def test_ptctl_study_plan_prints_the_batch_flag():
    from tests.service.test_cli_plan import CATALOG, _ptctl

    [(rc, out, heavy), (rc_demo, demo, _)] = _ptctl([["study", "plan", "--no-probe", str(CATALOG / "batch_cpu.yaml")],
                                                      ["study", "plan", "--no-probe", str(CATALOG / "cpu_demo.yaml")]])
    assert rc == 0 and heavy == [], out
    assert "batch: tune trains at batch size 8, the target at 32 (train.batch_size; 2 doublings larger)" in out
    assert re.search(r"validate\s*│\s*36\s*│\s*64\s*│\s*8,400", out), out  # 6 lrs × 2 seeds × (400+200+100)
    assert rc_demo == 0 and "batch:" not in demo.replace("batch_members", "")


# ------------------------------------------------------------------------------------ the API's bounds


def test_each_batch_size_of_a_sweep_is_bounded_like_train_batch_size():
    limits = Limits(batch=64)
    [error] = check({"validate": {"widths": [64], "batch_sizes": [8, 16, 128]}}, limits)
    assert error["loc"] == ["body", "validate", "batch_sizes", 2] and "PTCTL_MAX_BATCH" in error["msg"]
    [error] = check({"tune": {"base_width": 64, "batch_size": 128}}, limits)
    assert error["loc"] == ["body", "tune", "batch_size"] and "PTCTL_MAX_BATCH" in error["msg"]
    assert check(json.loads(json.dumps(SPEC.as_dict())), Limits()) == []


# ------------------------------------------------------------------------------------ end to end, in process


@pytest.mark.slow
def test_a_tiny_batch_sweep_trains_each_batch_on_the_same_tokens(tmp_path, monkeypatch):
    """tiny, tuned at batch 8, lr swept at batch 8 and 16 at width 16 through the driver: each trial trains at its
    own batch size, the batch-16 trials half the steps on the same tokens, and the study reads its batch sweep."""
    from tests.conftest import DEFAULT_DATA
    from workers.driver import run_study
    from workers.folder import StudyFolder
    from workers.runner import InProcessRunner
    from workers.tracker import NullTracker

    (DEFAULT_DATA / "corpora").mkdir(parents=True, exist_ok=True)
    (tmp_path / "corpora").symlink_to(DEFAULT_DATA / "corpora")
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    data = load_catalog("tiny").as_dict()
    data["tune"].update(num_trials=2, batch_size=8)
    data.update(transfer=None, verify=None, validate={"widths": [16], "lrs": [0.004, 0.016, 0.064],
                                                      "parametrizations": ["mup"], "steps": 20,
                                                      "batch_sizes": [8, 16]})
    spec = StudySpec.model_validate(data)
    state = run_study(spec, "batch-e2e", runner=InProcessRunner(), tracker=NullTracker())
    assert state.status == "succeeded", state.error
    artifacts = StudyFolder("batch-e2e", tmp_path).artifacts
    table = pd.read_csv(artifacts / "trials.csv")
    sweep = table[table["phase"] == "validate"]
    assert sorted(sweep["batch_size"].unique()) == [8, 16]
    assert {int(b): int(s) for b, s in zip(sweep["batch_size"], sweep["steps"], strict=True)} == {8: 20, 16: 10}
    assert sweep["tokens"].nunique() == 1  # a fixed token budget
    tune = table[(table["phase"] == "tune") & (table["steps"] == 30)]
    assert not tune.empty and set(tune["tokens"]) == {30 * 8 * int(sweep["tokens"].iloc[0]) // (20 * 8)}
    result = state.result("validate", ValidateResult)
    assert result is not None and len(result.along("batch")[0]) == 1 and result.along("batch")[0][0].axis == "batch"
    assert (artifacts / "batch.png").exists()
    report = (artifacts / "report.md").read_text()
    assert "Batch size: mup's optimal lr at width 16 moves" in report
    assert "**batch: tune trains at batch size 8" in report
