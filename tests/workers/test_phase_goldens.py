"""What every reader makes of a fixed finished study, byte for byte: the report, the CLI summary, the MLflow
columns, the progress and the plan, against goldens written before the phases owned them (PTCTL_GOLDEN=1 rewrites
them). The studies run through the driver with canned trial tables and the null tracker; the phases' wall times
are pinned."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from studies import load_catalog
from studies.cost import planned_runs
from studies.phases import PHASES, phases_of
from studies.plan import PlannedTrial
from studies.spec import StudySpec
from workers.driver import StudyDriver, run_study
from workers.folder import StudyFolder
from workers.report import TrialReport
from workers.runner import PhaseJob, trial_frame, trial_row
from workers.tracker import NullTracker
from workers.verdicts import study_verdict, verdict_columns

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    from tests.conftest import DEFAULT_DATA

    (DEFAULT_DATA / "corpora").mkdir(parents=True, exist_ok=True)
    (tmp_path / "corpora").symlink_to(DEFAULT_DATA / "corpora")
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    return tmp_path


def _loss(t: PlannedTrial) -> float:
    """Best at lr = 0.01 (standard: shrinking with width) and w_H = 1.4, away from tune's w_H: an uncertified
    centre."""
    lr = 0.01 * (16 / t.width if t.parametrization == "standard" else 1.0)
    return 4.0 + math.log(t.hparams["lr"] / lr) ** 2 + 0.1 * math.log(t.hparams.get("w_H", 1.4) / 1.4) ** 2


def _swept_loss(t: PlannedTrial) -> float:
    """`_loss` with its best lr moving along every sweep axis: down with the training steps, up with the batch size
    (√B), down with the context; the seed's own wobble gives the drifts' intervals."""
    at = t.at or {}
    steps = at.get("horizon") or 15
    moved = (steps / 15) ** -0.3 * (at.get("batch_size", 16) / 16) ** 0.5 * (1 + 0.05 * t.seed)
    lr = 0.01 * moved * (16 / t.width if t.parametrization == "standard" else (16 / t.width) ** 0.05)
    return 4.0 + math.log(t.hparams["lr"] / lr) ** 2 + 0.1 * math.log(t.hparams.get("w_H", 1.4) / 1.4) ** 2


class Canned:
    """Every planned trial `completed` at `loss` (tune: `num_trials` lrs around 0.01)."""

    def __init__(self, loss=_loss):
        self.loss = loss

    def run_phase(self, job: PhaseJob) -> pd.DataFrame:
        planned = job.planned
        if planned is None:
            planned = [PlannedTrial.for_tune(job.spec, f"{i:05d}", {"lr": 0.01 * 2.0 ** (i - 2)})
                       for i in range(job.spec.tune.num_trials)]
        return trial_frame([trial_row(job.spec, t, TrialReport(
            status="completed", eval_loss=self.loss(t), steps=(t.at or {}).get("horizon")
            or job.spec.steps_for(t.phase),
            tokens=100,
            wall_time_s=0.1 * (1 + i % 3), params=1000 * t.width)) for i, t in enumerate(planned)])


def _transfer() -> StudySpec:
    data = load_catalog("tiny").as_dict()
    data["tune"].update(steps=15, num_trials=5)
    data["validate"] = {"widths": [16, 32], "lrs": [0.0025, 0.005, 0.01, 0.02, 0.04], "hparams": {"w_H": [0.5, 1, 2]},
                        "steps": [15, 30]}
    return StudySpec.model_validate(data)


def _depth() -> StudySpec:
    data = load_catalog("depth_cpu").as_dict()
    data["tune"].update(num_trials=4)
    data["validate"].update(lrs=[0.0025, 0.005, 0.01, 0.02, 0.04], seeds=1)
    return StudySpec.model_validate(data)


def _compare() -> StudySpec:
    """compare_cpu shrunk as tests/workers/test_compare_study.py shrinks it."""
    data = load_catalog("compare_cpu").as_dict()
    data["data"].update(vocab_size=500, seq_len=32, max_tokens=60_000, max_eval_sequences=32)
    data["train"].update(batch_size=8, warmup_steps=2, eval_every=5, eval_batches=2, log_every=5)
    data["tune"].update(num_trials=2, asha={"enabled": False})
    data["compare"].update(budgets=[25_000, 55_000], proxy_budget=25_000, tokens=8 * 32 * 10, tune_tokens=8 * 32 * 5,
                           seeds=2)
    for baseline in data["compare"]["baselines"]:
        baseline["num_trials"] = 2
        baseline["model"]["arch"]["max_len"] = 32
    return StudySpec.model_validate(data)


def _sweeps() -> StudySpec:
    """Three widths under μP and standard, each lr swept at two horizons and two batch sizes, w_H beside lr: every
    reader of the width, horizon and batch sweeps and of the forecast (held out at width 64)."""
    data = load_catalog("tiny").as_dict()
    data["tune"].update(steps=15, num_trials=5, batch_size=8)
    data["transfer"].update(widths=[32, 64])
    data["validate"] = {"widths": [16, 32, 64], "lrs": [0.0025, 0.005, 0.01, 0.02, 0.04], "seeds": 2,
                        "hparams": {"w_H": [0.5, 1, 2]}, "steps": [15, 30], "batch_sizes": [8, 16]}
    return StudySpec.model_validate(data)


SPECS = {"transfer": _transfer, "depth": _depth, "compare": _compare, "sweeps": _sweeps}
LOSSES = {"sweeps": _swept_loss}


def _read(spec: StudySpec, data_dir: Path, loss=_loss, old: Path | None = None) -> dict:
    from service import summary
    from service.progress import phase_progress
    from service.verdicts import brief, study_verdicts, verdict_lines

    run_study(spec, "g1", runner=Canned(loss), tracker=NullTracker())
    if old is not None:  # the state and trial table an older ptctl wrote, read by this one
        shutil.copy(old / "state.json", StudyFolder("g1").state_path)
        shutil.copy(old / "validate_trials.csv", StudyFolder("g1").trials("validate"))
    driver = StudyDriver(spec, Canned(loss), NullTracker(), study_id="g1")
    for k, record in enumerate(driver.state.phases.values()):
        record.wall_s = 10.0 * (k + 1)
    report = driver.write_report().read_text()
    console = Console(record=True, width=200)
    folder = StudyFolder("g1")
    summary.print_summary(console, summary.StudyView(spec, driver.state, folder, {"transfer-w32-s0": "run-1"},
                                                     "http://ui/#/runs"))
    planned = {p: PHASES[p].count(spec) for p in phases_of(spec)}
    progress = phase_progress(folder, spec.as_dict(), driver.state, planned, [])
    verdict = study_verdict(spec, driver.state)
    api = study_verdicts(driver.state)
    said = brief(api)
    return {"report": report, "summary": console.export_text().replace(str(data_dir), "<data>"),
            "columns": verdict_columns(verdict), "sentence": verdict.sentence,
            "verdict": {"params": {k: str(v) for k, v in verdict.params.items()}, "tags": verdict.tags,
                        "metrics": [{k: round(v, 12) for k, v in row.items()} for row in verdict.metrics]},
            "progress": {p: v.model_dump(mode="json") for p, v in progress.items()},
            "phases": phases_of(spec), "steps": {p: spec.steps_for(p) for p in phases_of(spec)}, "planned": planned,
            "runs": {p: [list(r) for r in runs] for p, runs in planned_runs(spec).items()} if spec.compare is None
            else None,
            "api": api.model_dump(mode="json"), "brief": said.model_dump(mode="json") if said else None,
            "lines": verdict_lines(api)}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_finished_study_reads_as_it_did(name, data_dir):
    got = _read(SPECS[name](), data_dir, LOSSES.get(name, _loss))
    path = GOLDEN / f"{name}.json"
    if os.environ.get("PTCTL_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    want = json.loads(path.read_text())
    for key in want:
        assert _ordered(key, got[key]) == _ordered(key, want[key]), key


def _ordered(key: str, value):
    """The planned runs as a multiset: the order trials are planned in is no reader's output; round-off, which
    the machine's BLAS decides, left out (numbers to 10 digits, and below 1e-12 as 0)."""
    return {p: sorted(runs) for p, runs in value.items()} if key == "runs" and value else _round_off(value)


ROUND_OFF = re.compile(r"[+-]?\d+(?:\.\d+)?e-(?:1[2-9]|[2-9]\d)")


def _round_off(value):
    if isinstance(value, str):
        return ROUND_OFF.sub("0", value)
    if isinstance(value, float):
        return 0.0 if abs(value) < 1e-12 else float(f"{value:.10g}")
    if isinstance(value, list):
        return [_round_off(v) for v in value]
    if isinstance(value, dict):
        return {k: _round_off(v) for k, v in value.items()}
    return value


def test_a_study_recorded_before_the_sweeps_reads_as_it_did(data_dir):
    """state.json and the validate trial table of the `sweeps` study as ptctl wrote them before the sweeps were one
    file each (per-axis result fields, no `sweep` column) render every reader's output unchanged."""
    got = _read(_sweeps(), data_dir, _swept_loss, old=GOLDEN / "sweeps_v1")
    want = json.loads((GOLDEN / "sweeps_v1" / "readers.json").read_text())  # `sweeps.json` as that ptctl read it
    for key in ("report", "summary", "columns", "sentence", "verdict", "api", "brief", "lines"):
        assert _round_off(_sweeps_only(got[key])) == _round_off(_sweeps_only(want[key])), key


def _sweeps_only(value):
    """`value` without what the forecast says: its words have grown since that record (the leave-out scoring)."""
    if isinstance(value, str):
        return "\n".join(line for line in value.splitlines() if "orecast" not in line)
    if isinstance(value, list):
        return [_sweeps_only(v) for v in value if not (isinstance(v, str) and "orecast" in v)]
    if isinstance(value, dict):  # and without the context sweep's field, null before it existed
        return {k: _sweeps_only(v) for k, v in value.items() if "forecast" not in k and (k, v) != ("seq_len", None)}
    return value
