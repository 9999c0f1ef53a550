"""AdamW's weight decay λ as a transferable hparam: `space.weight_decay` (searched when set, fixed at
train.weight_decay when not), `validate.weight_decays` (λ*'s drift per doubling of width and its timescale),
`transfer.weight_decay` (the timescale rule), the fields' bounds, and specs without them keep their content hash."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from analysis import lr_drift
from analysis.weight_decay import decay_timescale, optimum_timescales, timescale_line, timescale_weight_decay
from service.limits import Limits, check
from studies.phases import StudyState, TuneResult, ValidateResult
from studies.phases.base import Context
from studies.phases.transfer import PHASE as TRANSFER
from studies.phases.transfer import carried_hparams, target_timescale_line, transfer_trials
from studies.phases.validate import PHASE as VALIDATE
from studies.phases.validate import validate_trials
from studies.plan import PlannedTrial
from studies.spec import CATALOG_DIR, StudySpec, TrialConfig
from studies.sweeps import with_sweep
from studies.sweeps.width import decay_timescales
from tests.studies._report import phase_report
from tests.studies.test_validate_phase import Folder

WD = StudySpec.from_yaml(CATALOG_DIR / "weight_decay_cpu.yaml")
TINY = StudySpec.from_yaml(CATALOG_DIR / "tiny.yaml")

# each catalog spec's content hash before weight decay became an hparam (computed from the code at HEAD, unchanged)
HASHES = {
    "compare_cpu.yaml": "b990cf626d01870cfea44f102c3e2f6e986b052a421fc251b4aada5a279e45ed",
    "compare_cpu_bpe.yaml": "47927ee3fb73421a7597a5953fbc07549a4b9e6ec4a46b267286ab4628d34494",
    "compare_paper.yaml": "fcd63c70a705d940779372a80f64e52aa4a80b6973fb66ea97e2108f3253f4af",
    "cpu_certify.yaml": "d2e6067c882effd986f2842f9f855f0253c5a3524ded0012090c874a75515e58",
    "cpu_demo.yaml": "e48352ede783facdc1e324124261902dcb3913ed98c6299a2d397066e60fb958",
    "depth_cpu.yaml": "33c67939603c3e3f8081093b1583163414e72b81697ff7fa3c391eec230f32d5",
    "horizon_cpu.yaml": "3a5d954715d090de51e9c4442a96fb492faebc187add761ae7bc577b0488d5a0",
    "nanogpt_mup.yaml": "e05a64af9fb2065aa6c373bda00fdd5911777346ba72c0cbd7cefb59969b5fef",
    "paper_pt_minipile.yaml": "967496074cac9db24b186a258ddf7dbca52d19e9cc269462326f007cbc1b3960",
    "pt_lr_alignment.yaml": "b64143c9a7f162e031bc8204835db4c389acb82908a3fc658c0254447b3419b4",
    "tau_cpu.yaml": "cd45b71694b8d6f5ad1ef2577230f95bb8d3e10c406801664970768034c2dd49",
    "tau_cpu_dot.yaml": "11dbfea46e06bcc046f28e10ccb7741b837c453106ef2b4a0b03dcf04d06a844",
    "taugpt_30m.yaml": "8bc111ab876d7eaa0d505b825f11a29ce932b4f3c34f5c2267902485bf5565f9",
    "tiny.yaml": "1a77d356e3a366eaa8fe40ebce02bbe681ede3afcff41fa4646bc374a640696d",
    "tiny_tau.yaml": "c4568282dc89a0502c044cd252648952fbaf0e4a67e524e2867541aaf2c9317f",
}
NEW_FIELDS = {("space", "weight_decay"), ("train", "weight_decay_form"), ("transfer", "weight_decay"),
              ("validate", "weight_decays")}


def _with(spec: StudySpec, **sections: dict) -> StudySpec:
    """`spec` with each section's keys changed (a section given as None is dropped)."""
    data = spec.as_dict()
    for name, changes in sections.items():
        data[name] = None if changes is None else {**(data.get(name) or {}), **changes}
    return StudySpec.model_validate(data)


# the catalog study on the grid the synthetic tables below are drawn for
WD = _with(WD, validate={"lrs": [0.004, 0.016, 0.064], "weight_decays": [0.01, 0.03, 0.1, 0.3, 1.0]})


def _error(spec: StudySpec, **sections: dict) -> str:
    with pytest.raises(ValidationError) as err:
        _with(spec, **sections)
    return str(err.value)


# ----------------------------------------------------------------------------- the content hash
@pytest.mark.parametrize("file", sorted(HASHES))
def test_every_catalog_study_keeps_its_content_hash(file):
    assert StudySpec.from_yaml(CATALOG_DIR / file).content_hash() == HASHES[file]


@pytest.mark.parametrize("file", sorted(HASHES))
def test_catalog_studies_that_set_no_weight_decay_field_dump_none(file):
    spec = StudySpec.from_yaml(CATALOG_DIR / file)
    data = spec.as_dict()
    assert not [(s, f) for s, f in NEW_FIELDS if isinstance(data.get(s), dict) and f in data[s]]
    if spec.compare is None:
        trial = spec.trial_config(spec.tune.base_width, {}, 0)
        assert "weight_decay_form" not in trial and trial["weight_decay"] == spec.train.weight_decay


@pytest.mark.parametrize(("section", "changes"), [
    ("space", {"weight_decay": {"low": 0.01, "high": 1.0}}), ("train", {"weight_decay_form": "independent"}),
    ("transfer", {"weight_decay": "timescale"}),
    ("validate", {"widths": [16, 32], "lrs": [1e-3, 1e-2, 1e-1], "weight_decays": [0.01, 0.1, 1.0]})])
def test_each_new_field_set_changes_the_hash_and_round_trips(section, changes):
    spec = _with(TINY, **{section: changes})
    assert spec.content_hash() != HASHES["tiny.yaml"]
    assert StudySpec.from_yaml(spec.to_yaml()) == spec


# ----------------------------------------------------------------------------- bounds and errors
@pytest.mark.parametrize(("section", "changes", "needle"), [
    ("space", {"weight_decay": {"low": 0.01, "high": 20.0}}, "space.weight_decay [0.01, 20] must lie in [0, 10]"),
    ("space", {"weight_decay": {"low": -0.1, "high": 1.0, "log": False}}, "must lie in [0, 10]"),
    ("space", {"weight_decay": {"low": 0.0, "high": 1.0}}, "must be > 0 for a log range"),
    ("space", {"weight_decays": {"low": 0.1, "high": 1.0}}, "did you mean"),
    ("train", {"weight_decay_form": "decoupled"}, "train.weight_decay_form"),
    ("transfer", {"weight_decay": "sqrt"}, "transfer.weight_decay"),
    ("validate", {"widths": [16, 32], "lrs": [1, 2, 3], "weight_decays": [0.1, 1.0]}, "3–16 distinct values"),
    ("validate", {"widths": [16, 32], "lrs": [1, 2, 3], "weight_decays": [0.1, 0.1, 1.0]}, "3–16 distinct values"),
    ("validate", {"widths": [16, 32], "lrs": [1, 2, 3], "weight_decays": [0, 0.1, 1.0]}, "in (0, 10]"),
    ("validate", {"widths": [16, 32], "lrs": [1, 2, 3], "weight_decays": [0.1, 1.0, 11.0]}, "in (0, 10]"),
    ("validate", {"widths": [16], "lrs": [1, 2, 3], "steps": [50, 100], "weight_decays": [0.01, 0.1, 1.0]},
     "validate.weight_decays need 2–4 validate.widths"),
    ("validate", {"widths": [16, 32], "lrs": [1, 2, 3], "hparams": {"weight_decay": [0.01, 0.1, 1.0]}},
     "sweep AdamW's λ with validate.weight_decays"),
])
def test_the_fields_are_bounded_and_the_error_names_the_field_and_the_fix(section, changes, needle):
    message = _error(TINY, **{section: changes})
    assert section in message and needle in message


def test_a_mup_family_refuses_the_independent_form_at_the_spec():
    nanogpt = StudySpec.from_yaml(CATALOG_DIR / "nanogpt_mup.yaml")
    assert "already decays every group by lr × λ" in _error(nanogpt, train={"weight_decay_form": "independent"})


def test_the_api_bounds_a_weight_decay_sweep_like_every_list():
    body = {"validate": {"widths": [16, 32], "lrs": [1, 2, 3], "weight_decays": [0.01] * 65}}
    [error] = check(body, Limits())
    assert error["loc"] == ["body", "validate", "weight_decays"] and "PTCTL_MAX_LIST" in error["msg"]


# ----------------------------------------------------------------------------- tune: searched or fixed
def test_weight_decay_is_searched_when_set_and_fixed_at_train_weight_decay_otherwise():
    assert "weight_decay" not in TINY.search_space() and "weight_decay" not in TINY.space.defaults()
    assert TINY.trial_config(16, {}, 0)["weight_decay"] == TINY.train.weight_decay
    assert WD.search_space()["weight_decay"] == (0.01, 1.0, True)
    assert list(WD.space.searched())[-1] == "weight_decay" and WD.space.defaults()["weight_decay"] == pytest.approx(0.1)
    trial = PlannedTrial.for_tune(WD, "00000", {"lr": 0.01, "weight_decay": 0.25})
    assert trial.columns(WD)["weight_decay"] == 0.25  # a column of the trial table
    assert TrialConfig.model_validate(trial.trial_config(WD)).weight_decay == 0.25
    frozen = _with(WD, space={"frozen": ["w_topic", "w_topic_z", "weight_decay"]})
    assert "weight_decay" not in frozen.search_space() and frozen.space.fixed()["weight_decay"] == pytest.approx(0.1)


def test_a_swept_or_carried_weight_decay_overrides_train_weight_decay_without_being_searched():
    spec = _with(TINY, train={"weight_decay": 0.2})
    assert spec.trial_config(16, {"weight_decay": 0.05}, 0)["weight_decay"] == 0.05
    with pytest.raises(ValueError, match="unknown hparam"):
        spec.trial_config(16, {"weight_decays": 0.05}, 0)


# ----------------------------------------------------------------------------- transfer: the timescale rule
def test_the_timescale_rule_divides_lambda_by_four_for_a_target_with_four_times_the_steps():
    spec = _with(WD, tune={"steps": 50}, train={"steps": 200})
    centre = {**spec.space.defaults(), "lr": 0.01, "weight_decay": 0.2}
    assert carried_hparams(spec, centre)["weight_decay"] == pytest.approx(0.05)
    [trial] = transfer_trials(spec, centre)
    assert TrialConfig.model_validate(trial.trial_config(spec)).weight_decay == pytest.approx(0.05)
    constant = _with(spec, transfer={"weight_decay": "constant"})
    assert carried_hparams(constant, centre) == centre
    # τ/T is the same at the proxy and the target: 1/(0.01·0.2)/50 = 1/(0.01·0.05)/200
    proxy, target = decay_timescale(0.01, 0.2, 50), decay_timescale(0.01, 0.05, 200)
    assert proxy is not None and target is not None and proxy.fraction == pytest.approx(target.fraction) == 10.0
    # a λ that is not searched is train.weight_decay, carried the same way
    fixed = _with(TINY, tune={"steps": 25}, train={"weight_decay": 0.4}, transfer={"weight_decay": "timescale"})
    assert carried_hparams(fixed, fixed.space.defaults())["weight_decay"] == pytest.approx(0.4 * 25 / 30)


def test_the_timescale_rule_and_line():
    assert timescale_weight_decay(0.1, 100, 400) == pytest.approx(0.025)
    assert decay_timescale(0.01, 0.0, 100) is None and timescale_line("x", None) is None
    line = timescale_line("the target", decay_timescale(0.02, 0.1, 1000))
    assert line is not None and "≈ 500 iterations" in line and "τ/T = 0.5 of its T = 1000 steps" in line
    with pytest.raises(ValueError, match="steps must be >= 1"):
        timescale_weight_decay(0.1, 0, 10)


def test_the_transfer_report_and_summary_state_the_targets_timescale():
    centre = {**WD.space.defaults(), "lr": 0.02, "weight_decay": 0.1}
    line = target_timescale_line(WD, centre)
    # λ at the target: 0.1 × 100/200 = 0.05; τ = 1/(0.02 × 0.05) = 1000 iterations, 5 of the 200-step run
    assert line is not None and "≈ 1,000 iterations" in line and "τ/T = 5 of its T = 200 steps" in line
    assert "transfer.weight_decay: timescale" in line
    report = phase_report(WD, {"tune": {"best_hparams": centre}, "transfer": {"widths": []}}, {"name": WD.name})
    assert line in report.split("## transfer")[1]
    assert "AdamW timescale of tune's winner at width 32" in report.split("## tune")[1]
    printed: list[str] = []
    state = StudyState(study_id="s", spec_hash="h", phases={"tune": TuneResult(status="done", best_hparams=centre)})
    TRANSFER.summary(Context(WD, state, lambda name: None), None, _Out(printed), {})
    assert any("≈ 1,000 iterations" in p for p in printed)


class _Out:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def print(self, *objects: object, soft_wrap: bool | None = None) -> None:
        self.lines += [str(o) for o in objects]


# ----------------------------------------------------------------------------- validate: λ*'s drift
CENTRE = {**WD.space.defaults(), "lr": 0.016, "weight_decay": 0.1}


def _log2_best(hparam: str, width: int, slope: float) -> float:
    """The synthetic optimum: lr* at 2^-6 at every width, λ* at 2^-3.3 at width 32 moving `slope` per doubling."""
    return -6.0 if hparam == "lr" else -3.3 + slope * np.log2(width / 32)


def _table(slope: float) -> pd.DataFrame:
    rows = []
    for trial in validate_trials(WD, CENTRE):
        h = trial.swept or "lr"
        x = np.log2(trial.hparams[h])
        wobble = 0.1 * (trial.seed - 0.5) * (trial.width == 64)  # the seeds' optima differ a little at width 64
        loss = 5.0 + 0.05 * (x - _log2_best(h, trial.width, slope) - wobble) ** 2 + 0.003 * trial.seed
        rows.append({**trial.columns(WD), "status": "completed", "eval_loss": loss, "steps": 200})
    return pd.DataFrame(rows)


@pytest.mark.parametrize(("slope", "passed"), [(1.0, False), (0.0, True)])
def test_lambda_stars_drift_per_doubling_of_width_is_judged_on_a_synthetic_table(slope, passed):
    drift = lr_drift(_table(slope), threshold=0.5, hparam="weight_decay")
    assert drift.hparam == "weight_decay" and drift.mup_drift == pytest.approx(slope, abs=0.05)
    assert drift.passed is passed and drift.drift_ci["mup"] is not None  # 3 widths × 2 seeds: an interval
    low, high = drift.drift_ci["mup"]
    assert low < drift.mup_drift < high and high - low < 1.0


def test_the_validate_phase_sweeps_lambda_and_reports_its_drift_and_timescale(tmp_path):
    trials = validate_trials(WD, CENTRE)
    swept = [t for t in trials if t.swept == "weight_decay"]
    assert len(swept) == 5 * 3 * 2 and {t.hparams["weight_decay"] for t in swept} == {0.01, 0.03, 0.1, 0.3, 1.0}
    assert all(TrialConfig.model_validate(t.trial_config(WD)).weight_decay == t.hparams["weight_decay"]
               for t in swept)
    table = _table(1.0)
    state = StudyState(study_id="v", spec_hash="x", phases={"tune": TuneResult(status="done", best_hparams=CENTRE)})
    ctx = Context(spec=WD, state=state, tables=lambda name: table if name == "validate" else None)
    result = VALIDATE.judge(ctx, table, Folder(tmp_path))
    assert isinstance(result, ValidateResult)
    assert {d.hparam for d in result.drifts if d.hparam != "lr"} == {"weight_decay"}
    assert result.drift(hparam="weight_decay").mup_drift == pytest.approx(1.0, abs=0.05)
    assert (tmp_path / "mutransfer_weight_decay.png").exists()
    assert VALIDATE.figures(result)["validate (weight_decay)"] == "mutransfer_weight_decay"
    verdict = VALIDATE.verdict(WD, result)
    assert verdict.tags["weight_decay_drift_passed"] == "false" and "weight_decay_drift.mup" in verdict.metrics[0]
    assert "Transfer regret in weight_decay at width 32" in verdict.sentence
    frame = decay_timescales(WD, result.drifts, with_sweep(WD, table))
    assert frame is not None and list(frame["width"]) == [32, 64, 128]
    # λ* doubles per doubling of width at η = 0.016: τ*/T halves, 1/(0.016 · 2^-3.3 · 200) at width 32
    assert frame["τ*/T"].iloc[0] == pytest.approx(1 / (0.016 * 2**-3.3 * 200), rel=0.05)
    assert frame["τ*/T"].iloc[2] == pytest.approx(frame["τ*/T"].iloc[0] / 4, rel=0.1)
    assert frame["τ*/T at η*"].iloc[0] == pytest.approx(1 / (2**-6 * 2**-3.3 * 200), rel=0.05)
    report = phase_report(WD, {"tune": {"best_hparams": CENTRE}, "validate": result.model_dump()},
                          {"name": WD.name}, tables={"validate": table})
    validate = report.split("## validate")[1]
    assert "drift (log2 weight_decay per doubling)" in validate and "τ*/T" in validate
    assert "train.weight_decay_form: coupled" in validate
    printed: list[str] = []
    VALIDATE.summary(ctx, result, _RichOut(printed), {})
    assert any("AdamW timescale at λ*" in p for p in printed)


class _RichOut:
    """A rich console's print, captured as text (tables rendered)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def print(self, *objects: object, soft_wrap: bool | None = None) -> None:
        from rich.console import Console

        console = Console(width=200, record=True)
        console.print(*objects)
        self.lines.append(console.export_text())


def test_optimum_timescales_reads_only_a_weight_decay_sweep():
    table = _table(0.0)
    with pytest.raises(ValueError, match="reads a weight_decay sweep"):
        optimum_timescales(table, lr_drift(table), 200)
    frame = optimum_timescales(table, lr_drift(table, hparam="weight_decay"), 200)
    assert "η*" not in frame and all(math.isclose(v, 0.016) for v in frame["η (swept at)"])


def test_the_verify_phase_certifies_the_carried_centre():
    from studies.phases.verify import PHASE as VERIFY

    spec = _with(WD, tune={"steps": 50}, train={"steps": 200},
                 verify={"width": 64, "n_samples": 6, "centre_seeds": 2, "delta": 0.5})
    centre = {**spec.space.defaults(), "lr": 0.01, "weight_decay": 0.2}
    state = StudyState(study_id="s", spec_hash="h", phases={"tune": TuneResult(status="done", best_hparams=centre)})
    trials = VERIFY.plan(Context(spec, state, lambda name: None))
    assert [t.hparams["weight_decay"] for t in trials if t.is_centre] == pytest.approx([0.05, 0.05])
    samples = [t.hparams["weight_decay"] for t in trials if not t.is_centre]
    assert len(samples) == 6 and all(0.025 <= x <= 0.075 for x in samples)  # drawn around λ carried to 200 steps
