"""`Control`'s ordering under races, with a fake executor (the real-process versions: test_sharing.py)."""

from __future__ import annotations

import pytest

from service.control import Control, ExecutionUnavailable
from service.progress import MlflowView
from service.store import IllegalTransition, Store
from studies import load_catalog
from tests.service.conftest import FakeExecutor

SPEC = load_catalog("tiny")


@pytest.fixture()
def control(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'ptctl.db'}")
    store.migrate()
    return Control(store, FakeExecutor(), MlflowView(f"sqlite:///{tmp_path / 'mlflow.db'}"), tmp_path)


class CancelDuringStart(FakeExecutor):
    """A cancel request lands while the submit is still creating the driver actor."""

    def __init__(self) -> None:
        super().__init__()
        self.control: Control | None = None

    def start(self, study_id: str) -> str:
        self.control.cancel(study_id)
        return super().start(study_id)


def test_a_cancel_during_submit_wins_and_no_driver_is_left(control):
    executor = CancelDuringStart()
    executor.control, control.executor = control, executor
    study, created = control.submit(SPEC)
    assert created and study.status == "cancelled" and study.attempts == 0
    assert executor.launched == [] and not executor.alive(study.id)


class CancelledWhileCreating(FakeExecutor):
    """The cancel's `ray.kill` lands while Ray is still creating the driver actor, so the creation fails (seen
    in test_sharing.py's cancel race: `RaySystemError: System error: Actor creation cancelled.`)."""

    def __init__(self, control: Control) -> None:
        super().__init__()
        self.control = control

    def start(self, study_id: str) -> str:
        self.control.cancel(study_id)
        raise RuntimeError("System error: Actor creation cancelled.")


class CancelledWhileLaunching(CancelledWhileCreating):
    """The cancel lands after the driver was created and the study moved to running, before it began."""

    def start(self, study_id: str) -> str:
        return FakeExecutor.start(self, study_id)

    def launch(self, handle, spec, study_id: str, attempt: int) -> None:
        self.control.cancel(study_id)
        raise RuntimeError("the driver died before it began")


@pytest.mark.parametrize("executor", [CancelledWhileCreating, CancelledWhileLaunching])
def test_a_driver_start_failed_by_a_racing_cancel_answers_the_cancelled_study(control, executor):
    """The start failed because the study was cancelled meanwhile: the submit answers the study as it is now
    (cancelled), not that Ray could not start the driver and the study should be resumed."""
    control.executor = executor(control)
    study, created = control.submit(SPEC)
    assert created and study.status == "cancelled" and study.error == "cancelled by request"
    assert not control.executor.alive(study.id)


def test_resume_moves_only_from_the_status_it_saw(control):
    study, _ = control.submit(SPEC)
    control.cancel(study.id)
    resumed = control.resume(study.id)
    assert resumed.status == "running" and resumed.attempts == 2
    with pytest.raises(IllegalTransition):
        control.resume(study.id)
    assert control.executor.launched == [study.id, study.id]


class NeverBegins(FakeExecutor):
    """The driver actor starts but does not begin running within the launch wait."""

    def launch(self, handle, spec, study_id: str, attempt: int) -> None:
        raise TimeoutError("the driver did not begin within 120 s")


def test_a_driver_that_does_not_begin_leaves_the_study_interrupted_not_running(control):
    control.executor = NeverBegins()
    with pytest.raises(ExecutionUnavailable, match="did not begin.*resume"):
        control.submit(SPEC)
    (study,), _ = control.store.list()
    assert study.status == "interrupted" and "resume" in study.error
    assert not control.executor.alive(study.id)


def test_start_up_restarts_a_running_study_whose_driver_is_idle(control, tmp_path):
    """The API stopped between storing `running` and launching: the actor lives but never began. The next API
    process replaces it with a driver that runs (attempt 2); a driver that was launched is left alone."""
    launched, _ = control.submit(SPEC)
    idle, _ = control.store.create("idle-1", SPEC.as_dict(), "h")
    control.executor.start(idle.id)
    control.store.transition(idle.id, "running", expect=["pending"])
    assert control.reconcile() == []  # a submit of this process between its steps is left alone
    restarted = Control(control.store, control.executor, control.mlflow, tmp_path)
    assert restarted.reconcile(startup=True) == ["idle-1"]
    assert control.store.get("idle-1").status == "running" and control.store.get("idle-1").attempts == 2
    assert control.executor.launched == [launched.id, "idle-1"] and control.executor.alive("idle-1")
    assert control.store.get(launched.id).status == "running" and control.store.get(launched.id).attempts == 1


class LeftGroups(FakeExecutor):
    """Ray holds groups of dead drivers (`release` removes them), or cannot be asked (`release` raises)."""

    def __init__(self, answers: list) -> None:
        super().__init__()
        self.answers = answers

    def release(self) -> list[str]:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_each_pass_releases_what_dead_drivers_left_and_a_failure_to_ask_stops_nothing(control, tmp_path, caplog):
    left, _ = control.store.create("left-1", SPEC.as_dict(), "h")  # pending: an earlier API's submit
    executor = LeftGroups([ConnectionError("GCS busy"), ["a1", "b2"], []])
    restarted = Control(control.store, executor, control.mlflow, tmp_path)
    assert restarted.reconcile(startup=True) == ["left-1"]  # the left study starts though Ray could not be asked
    assert "could not look for placement groups" in caplog.text
    caplog.clear()
    restarted.reconcile()
    assert "removed 2 placement group(s) that dead drivers left holding CPUs: a1, b2" in caplog.text
    caplog.clear()
    restarted.reconcile()
    assert executor.answers == [] and "placement group" not in caplog.text
