"""`RayExecutor`'s handling of a lost embedded head, with Ray's calls replaced (the real-process version:
test_sharing.py::test_losing_the_ray_head_interrupts_and_resume_finishes)."""

from __future__ import annotations

import threading

import pytest

from service import execution
from service.control import Control, ExecutionUnavailable
from service.execution import RayExecutor
from service.progress import MlflowView
from service.settings import Settings
from service.store import Store
from studies import load_catalog


@pytest.fixture()
def dead_head(tmp_path, monkeypatch):
    """A connected executor whose embedded head has just died; `ray.shutdown` blocks until released."""
    released = threading.Event()
    state = {"initialized": True}

    def shutdown() -> None:
        released.wait(10)
        state["initialized"] = False

    monkeypatch.setattr(execution.ray, "is_initialized", lambda: state["initialized"])
    monkeypatch.setattr(execution.ray, "shutdown", shutdown)
    monkeypatch.setattr(execution.ray_head, "running", lambda data_dir: None)
    executor = RayExecutor(Settings(data_dir=tmp_path))
    yield executor
    released.set()


def test_a_loss_noticed_by_connect_is_reported_once_by_lost(dead_head):
    with pytest.raises(ExecutionUnavailable, match="Ray head stopped"):
        dead_head.connect()  # a request noticed first
    with pytest.raises(ExecutionUnavailable, match="being dropped"):
        dead_head.connect()  # while ray.shutdown() waits out Ray's GCS timeout
    assert dead_head.lost() == "the embedded Ray head stopped"
    assert dead_head.lost() is None


def test_reconcile_interrupts_running_studies_when_the_head_is_lost(dead_head, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'ptctl.db'}")
    store.migrate()
    study, _ = store.create("s-1", load_catalog("tiny").as_dict(), "h")
    store.transition(study.id, "running")
    control = Control(store, dead_head, MlflowView(f"sqlite:///{tmp_path / 'mlflow.db'}"), tmp_path)
    assert control.reconcile() == ["s-1"]
    interrupted = store.get("s-1")
    assert interrupted.status == "interrupted" and "Ray head stopped" in interrupted.error
    assert "resume" in interrupted.error
