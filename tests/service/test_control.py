"""`Control`'s ordering under races, with a fake executor (the real-process versions: test_sharing.py)."""

from __future__ import annotations

import pytest

from service.control import Control
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


def test_resume_moves_only_from_the_status_it_saw(control):
    study, _ = control.submit(SPEC)
    control.cancel(study.id)
    resumed = control.resume(study.id)
    assert resumed.status == "running" and resumed.attempts == 2
    with pytest.raises(IllegalTransition):
        control.resume(study.id)
    assert control.executor.launched == [study.id, study.id]
