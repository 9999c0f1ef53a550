"""A phase is its file and one registration: a throwaway phase registered alone (nothing else told about it) is in
the plan, the progress, the CLI summary, the report and the MLflow runs table's columns."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import pandas as pd
import pytest
from rich.console import Console

from studies import load_catalog
from studies.phases import PHASES, PhaseResult, Verdict, phases_of
from studies.phases.base import Artifacts, Context, Phase
from studies.plan import PlannedTrial
from studies.spec import StudySpec
from workers.report import TrialReport
from workers.runner import PhaseJob, trial_frame, trial_row
from workers.tracker import NullTracker


class ProbeResult(PhaseResult):
    loss: float = math.nan


class Probe(Phase):
    """One trial at the base width with the tune winner; its verdict: that trial's loss."""

    name: ClassVar[str] = "probe"
    result: ClassVar[type[PhaseResult]] = ProbeResult

    def present(self, spec: StudySpec) -> bool:
        return spec.compare is None

    def plan(self, ctx: Context) -> list[PlannedTrial]:
        return [PlannedTrial("probe-s0", "probe", ctx.spec.tune.base_width, 0, ctx.state.centre())]

    def planned(self, spec: StudySpec) -> list[PlannedTrial]:
        return [PlannedTrial("probe-s0", "probe", spec.tune.base_width, 0, spec.space.defaults())]

    def judge(self, ctx: Context, table: pd.DataFrame, out: Artifacts) -> ProbeResult:
        out.figure("probe").write_bytes(b"png")
        return ProbeResult(loss=float(table.eval_loss.min()))

    def figures(self, result: PhaseResult) -> dict[str, str]:
        return {"probe": "probe"}

    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        assert isinstance(result, ProbeResult)
        return Verdict(metrics=[{"step": 0, "probe_loss": result.loss}], sentence=f"Probe: {result.loss:.2f}.")

    def section(self, ctx: Context, result: PhaseResult, tables: Mapping[str, pd.DataFrame]) -> list[str]:
        assert isinstance(result, ProbeResult)
        return [f"the probe's loss: {result.loss:.2f}"]

    def summary(self, ctx: Context, result: PhaseResult | None, out: Console, runs: Mapping[str, str]) -> None:
        if isinstance(result, ProbeResult):
            out.print(f"probe loss {result.loss:.2f}")


class Canned:
    """Every planned trial `completed` at a loss of 4 + |log(lr / 0.01)| (tune: `num_trials` lrs around 0.01)."""

    def run_phase(self, job: PhaseJob) -> pd.DataFrame:
        planned = job.planned or [PlannedTrial.for_tune(job.spec, f"{i:05d}", {"lr": 0.01 * 2.0 ** (i - 2)})
                                  for i in range(job.spec.tune.num_trials)]
        return trial_frame([trial_row(job.spec, t, TrialReport(
            status="completed", eval_loss=4 + abs(math.log(t.hparams["lr"] / 0.01)), steps=job.spec.steps_for(t.phase),
            tokens=100, wall_time_s=0.1, params=1000)) for t in planned])


class Recording(NullTracker):
    """The null tracker, keeping the saved view's columns and each verdict's sentence."""

    def __init__(self) -> None:
        self.columns: list[str] = []
        self.sentences: list[str] = []

    def save_view(self, columns: Iterable[str], name: str = "verdicts") -> None:
        self.columns = list(columns)

    def log_verdict(self, run_id: str, params: dict[str, Any], metrics: list[dict[str, Any]], tags: dict[str, Any],
                    sentence: str) -> None:
        self.sentences.append(sentence)


@pytest.fixture
def probe(monkeypatch, tmp_path):
    """The probe registered after the others (the registry is restored after the test); a fresh data directory."""
    from tests.conftest import DEFAULT_DATA

    (DEFAULT_DATA / "corpora").mkdir(parents=True, exist_ok=True)
    (tmp_path / "corpora").symlink_to(DEFAULT_DATA / "corpora")
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    monkeypatch.setitem(PHASES, "probe", Probe())
    data = load_catalog("tiny").as_dict()
    data.update(transfer=None, verify=None)
    return StudySpec.model_validate(data)


def test_a_registered_phase_is_planned_run_told_and_shown(probe, tmp_path):
    from service.progress import phase_progress, spec_phases
    from service.summary import StudyView, print_summary
    from studies.cost import plan_cost, planned_runs, planned_trials
    from workers.driver import run_study
    from workers.folder import StudyFolder
    from workers.verdicts import study_verdict

    spec = probe
    assert phases_of(spec) == spec_phases(spec.as_dict()) == ["tune", "probe"]
    assert spec.steps_for("probe") == spec.train.steps
    # the plan
    assert [t.trial_key for t in planned_trials(spec)["probe"]] == ["probe-s0"]
    assert planned_runs(spec)["probe"] == [(spec.tune.base_width, spec.train.steps)]
    assert [(p.phase, p.trials) for p in plan_cost(spec).phases] == [("tune", 6), ("probe", 1)]
    # the run, its verdict and the runs table's columns
    tracker = Recording()
    state = run_study(spec, "p1", runner=Canned(), tracker=tracker)
    assert state.done("probe") and state.phases["probe"].loss == pytest.approx(4.0)
    assert "metrics.`probe_loss`" in tracker.columns and "Probe: 4.00." in study_verdict(spec, state).sentence
    # the progress
    folder = StudyFolder("p1")
    progress = phase_progress(folder, spec.as_dict(), state, {p: PHASES[p].count(spec) for p in phases_of(spec)}, [])
    assert progress["probe"].status == "done" and progress["probe"].planned == progress["probe"].done == 1
    # the report
    report = folder.report.read_text()
    assert "## probe\n\nthe probe's loss: 4.00\n\n![probe](probe.png)" in report
    assert report.index("## tune") < report.index("## probe") < report.index("## cost")
    # the summary
    console = Console(record=True, width=200)
    print_summary(console, StudyView(spec, state, folder, {}, None))
    text = console.export_text()
    assert "probe loss 4.00" in text and str(folder.figure("probe")) in text
