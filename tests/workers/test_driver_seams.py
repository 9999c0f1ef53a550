"""The driver's own logic without Ray or MLflow: phase order, reuse of finished phases, resume after an
interruption and the report, through a fake runner (canned trial tables) or the in-process runner (real
training of the tiny study at a few steps), with the null tracker."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import ClassVar

import pandas as pd
import pytest

from studies import load_catalog
from studies.phases import PHASES as REGISTERED
from studies.phases import PhaseResult, Verdict, phases_of
from studies.phases.base import Artifacts, Context, Phase
from studies.plan import PlannedTrial
from studies.spec import StudySpec
from studies.status import StudyStatus
from workers.driver import run_study
from workers.errors import InfrastructureLost, StudyFailed
from workers.folder import PhaseIndex, StudyFolder
from workers.report import TrialReport
from workers.runner import InProcessRunner, PhaseJob, trial_frame, trial_row
from workers.tracker import NullTracker
from workers.verdicts import study_verdict


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    """A fresh data directory per test, sharing the downloaded corpora."""
    from tests.conftest import DEFAULT_DATA

    (DEFAULT_DATA / "corpora").mkdir(parents=True, exist_ok=True)
    (tmp_path / "corpora").symlink_to(DEFAULT_DATA / "corpora")
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    return tmp_path


def _loss(hparams) -> float:
    """A made-up loss landscape: best at lr = 0.01 and w_H = 1."""
    return 4.0 + math.log(hparams["lr"] / 0.01) ** 2 + 0.1 * math.log(hparams["w_H"]) ** 2


class FakeRunner:
    """Canned trial tables: every planned trial (tune: `num_trials` lrs around 0.01) `completed` at `_loss`;
    raises `fail` when it reaches `fail_at`."""

    def __init__(self, fail_at: str | None = None, fail: BaseException | None = None) -> None:
        self.calls: list[str] = []
        self.fail_at, self.fail = fail_at, fail

    def run_phase(self, job: PhaseJob) -> pd.DataFrame:
        if job.phase == self.fail_at:
            raise self.fail
        self.calls.append(job.phase)
        planned = job.planned
        if planned is None:
            planned = [PlannedTrial.for_tune(job.spec, f"{i:05d}", {"lr": 0.01 * 2.0 ** (i - 2)})
                       for i in range(job.spec.tune.num_trials)]
        rows = []
        for t in planned:
            report = TrialReport(status="completed", eval_loss=_loss(t.hparams), steps=job.spec.steps_for(t.phase),
                                 tokens=100, wall_time_s=0.1, params=1000)
            rows.append(trial_row(job.spec, t, report))
            job.notify({"phase": job.phase, "trial_id": t.trial_key, "status": "completed"})
        return trial_frame(rows)


def _run(spec, runner, study_id="s1", events=None):
    on_event = (lambda kind, data: events.append((kind, data.get("phase")))) if events is not None else None
    return run_study(spec, study_id, on_event, runner=runner, tracker=NullTracker())


def test_every_phase_is_registered_under_its_name():
    assert all(phase.name == name for name, phase in REGISTERED.items())


class ProbeResult(PhaseResult):
    best_lr: float = 0.0


class Probe(Phase):
    """A throwaway phase: an lr sweep at the base width around the tune winner, judged to its best lr."""

    name: ClassVar[str] = "probe"
    result: ClassVar[type[PhaseResult]] = ProbeResult

    def present(self, spec: StudySpec) -> bool:
        return True

    def plan(self, ctx: Context) -> list[PlannedTrial]:
        centre = ctx.state.centre()
        return [PlannedTrial(f"probe-x{k}", "probe", ctx.spec.tune.base_width, 0, {**centre, "lr": centre["lr"] * k})
                for k in (0.5, 1, 2)]

    def count(self, spec: StudySpec) -> int:
        return 3

    def judge(self, ctx: Context, table: pd.DataFrame, out: Artifacts) -> ProbeResult:
        return ProbeResult(best_lr=float(table.loc[table.eval_loss.idxmin(), "lr"]))

    def figures(self, result: PhaseResult) -> dict[str, str]:
        return {}

    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        assert isinstance(result, ProbeResult)
        return Verdict(sentence=f"Probe: best lr {result.best_lr:g}.")


def test_a_phase_is_one_file_and_one_registration(monkeypatch):
    """A phase added by registering it alone: it plans from the state, runs after the others, is judged to its
    typed result (which state.json keeps and gives back typed) and states its verdict."""
    spec = StudySpec.model_validate({**load_catalog("tiny").as_dict(), "transfer": None, "verify": None})
    runner = FakeRunner()
    monkeypatch.setitem(REGISTERED, "probe", Probe())
    state = _run(spec, runner)
    assert runner.calls == ["tune", "probe"] and state.status == StudyStatus.SUCCEEDED
    assert state.phases["probe"] == StudyFolder("s1").read_state().phases["probe"]
    probe = StudyFolder("s1").read_state().result("probe", ProbeResult)
    assert probe is not None and probe.best_lr == pytest.approx(0.01) and probe.wall_s is not None
    assert "Probe: best lr 0.01." in study_verdict(spec, state).sentence


def test_phases_run_in_order_and_the_report_is_written():
    spec, runner, events = load_catalog("tiny"), FakeRunner(), []
    state = _run(spec, runner, events=events)
    assert runner.calls == phases_of(spec) == ["tune", "transfer", "verify"]
    assert [p for kind, p in events if kind == "phase_start"] == ["tune", "transfer", "verify"]
    assert state.status == "succeeded" and all(state.done(p) for p in phases_of(spec))
    assert state.phases["tune"].best_hparams["lr"] == pytest.approx(0.01)  # the landscape's minimum
    folder = StudyFolder("s1")
    assert folder.read_state().status == StudyStatus.SUCCEEDED
    trials = pd.read_csv(folder.all_trials)
    # tiny's verify centre seed 0 is the transfer run, copied in, not trained again
    assert trials.groupby("phase").size().to_dict() == {"tune": 6, "transfer": 1, "verify": 8}
    assert (trials.status == "completed").all()
    report = folder.report.read_text()
    assert "s1" in report and "centre" in report
    cert = json.loads(folder.certificate.read_text())
    assert cert["n_samples"] == spec.verify.n_samples
    assert json.loads(folder.cost.read_text())["metrics"] is not None
    for name in ("tune_history", "transfer", "verify"):
        assert folder.figure(name).stat().st_size > 0


def test_validate_sweeps_run_after_verify_and_reach_the_report():
    data = load_catalog("tiny").as_dict()
    data["validate"] = {"widths": [16, 32], "lrs": [0.003, 0.01, 0.03], "hparams": {"w_H": [0.5, 1, 2]}, "steps": 30}
    spec, runner = StudySpec.model_validate(data), FakeRunner()
    state = _run(spec, runner)
    assert runner.calls == ["tune", "transfer", "verify", "validate"]
    assert {d.hparam for d in state.phases["validate"].drifts if d.hparam != "lr"} == {"w_H"}
    folder = StudyFolder("s1")
    validate = pd.read_csv(folder.trials("validate"))
    assert len(validate) == REGISTERED["validate"].count(spec) and set(validate.swept) == {"lr", "w_H"}
    assert folder.figure("mutransfer").exists() and folder.figure("mutransfer_w_H").exists()
    assert "mutransfer_w_H.png" in folder.report.read_text()


def test_a_finished_phase_of_an_identical_study_is_reused():
    spec = load_catalog("tiny")
    _run(spec, FakeRunner(), "first")
    assert PhaseIndex().get(next(iter(json.loads(PhaseIndex().path.read_text())))) == "first"
    runner = FakeRunner()
    state = _run(spec, runner, "second")
    assert runner.calls == ["verify"]  # tune and transfer are copied from `first`
    assert state.phases["tune"].reused_from == "first" and state.phases["transfer"].reused_from == "first"
    assert StudyFolder("second").trials("tune").read_text() == StudyFolder("first").trials("tune").read_text()
    # a study whose tune differs reuses nothing
    other = StudySpec.model_validate({**spec.as_dict(), "tune": {**spec.as_dict()["tune"], "seed": 1}})
    runner = FakeRunner()
    _run(other, runner, "third")
    assert runner.calls == ["tune", "transfer", "verify"]


@pytest.mark.parametrize(("fail", "status"), [(RuntimeError("boom"), "failed"),
                                              (InfrastructureLost("ray went away"), "interrupted")])
def test_an_interrupted_study_resumes_at_the_phase_it_stopped_in(fail, status):
    spec = load_catalog("tiny")
    with pytest.raises((StudyFailed, InfrastructureLost)) as caught:
        _run(spec, FakeRunner(fail_at="verify", fail=fail))
    assert caught.value.phase == "verify" and caught.value.status == status
    state = StudyFolder("s1").read_state()
    assert state.status == status and "boom" in state.error or "ray went away" in state.error
    assert [p for p, s in state.phases.items() if s.done] == ["tune", "transfer"]
    runner, events = FakeRunner(), []
    resumed = _run(spec, runner, events=events)
    assert runner.calls == ["verify"] and resumed.status == "succeeded" and resumed.error is None
    assert [p for kind, p in events if kind == "phase_skipped"] == ["tune", "transfer"]
    assert resumed.instance == state.instance  # the same study instance, not a new one


def test_another_spec_under_the_same_study_id_is_refused():
    spec = load_catalog("tiny")
    _run(spec, FakeRunner())
    other = StudySpec.model_validate({**spec.as_dict(), "description": "changed"})
    with pytest.raises(ValueError, match="started with another spec"):
        _run(other, FakeRunner())


def test_the_driver_imports_neither_ray_nor_mlflow():
    code = ("import sys, workers.driver, workers.runner, workers.tracker; "
            "print(sorted(m for m in ('ray', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------------------- in process
def _tiny_fast() -> StudySpec:
    """tiny at 2 steps of 4 short sequences: 3 tune trials, the transfer width, the verify centre and 2 samples."""
    data = load_catalog("tiny").as_dict()
    data["train"].update(steps=2, batch_size=4, warmup_steps=1, eval_every=2, log_every=2, eval_batches=1)
    data["data"].update(seq_len=16, max_tokens=20000, max_eval_sequences=8)
    data["tune"].update(num_trials=3, asha={"enabled": False})
    data["verify"].update(n_samples=2, steps=2)
    return StudySpec.model_validate(data)


class Counting:
    """`workers.train.train`, counting its calls; raises KeyboardInterrupt (Ctrl-C) at call number `stop_at`."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.calls, self.stop_at = 0, stop_at

    def __call__(self, cfgs):
        from workers.train import train

        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        return train(cfgs)


def test_the_in_process_runner_runs_a_study_and_resumes_without_training_twice():
    spec = _tiny_fast()
    stopped = Counting(stop_at=3)  # the third tune trial
    with pytest.raises(KeyboardInterrupt):
        _run(spec, InProcessRunner(stopped))
    assert StudyFolder("s1").read_state().status == StudyStatus.INTERRUPTED
    resumed = Counting()
    state = _run(spec, InProcessRunner(resumed))
    assert state.status == "succeeded"
    # 3 tune + 1 transfer + 1 verify centre (seed 1; seed 0 is the transfer run) + 2 samples, 2 of them before
    assert resumed.calls == 3 + 1 + 1 + 2 - 2
    tune = pd.read_csv(StudyFolder("s1").trials("tune"))
    assert len(tune) == 3 and set(tune.status) <= {"completed", "diverged"}
    defaults = spec.space.defaults()
    assert tune.loc[tune.trial_id == "tune-00000", "lr"].item() == pytest.approx(defaults["lr"])  # TPE starts there
    assert len(set(tune.lr)) == 3  # and then suggests new ones (replayed identically after the resume)
    trials = pd.read_csv(StudyFolder("s1").all_trials)
    assert trials.groupby("phase").size().to_dict() == {"tune": 3, "transfer": 1, "verify": 4}


def test_an_in_process_trial_that_raises_is_failed_and_the_phase_goes_on():
    spec = _tiny_fast()

    def broken(cfgs):
        raise ValueError("data.path: no such file")

    runner = InProcessRunner(broken)
    planned = [PlannedTrial("transfer-w32-s0", "transfer", 32, 0, spec.space.defaults())]
    from workers.folder import StudyFolder as Folder

    job = PhaseJob(spec=spec, phase="transfer", planned=planned, study_id="s1", instance=None, phase_run="p",
                   tracker=NullTracker(), storage=Folder("s1").ray, experiment="s1.transfer")
    table = runner.run_phase(job)
    assert table.status.tolist() == ["failed"] and "ValueError: data.path" in table.message.item()
    assert math.isnan(table.eval_loss.item())
