"""`RayExecutor`'s handling of a lost embedded head, with Ray's calls replaced (the real-process version:
test_sharing.py::test_losing_the_ray_head_interrupts_and_resume_finishes)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from service import execution
from service.control import Control, ExecutionUnavailable
from service.execution import RayExecutor
from service.progress import MlflowView
from service.settings import Settings
from service.store import Store
from studies import load_catalog
from tests.service.conftest import EVENT_S, wait_for


@pytest.fixture()
def dead_head(tmp_path, monkeypatch):
    """A connected executor whose embedded head has just died; `ray.shutdown` blocks until released."""
    released = threading.Event()
    state = {"initialized": True}

    def shutdown() -> None:
        released.wait(10)
        state["initialized"] = False

    monkeypatch.setattr(execution.actors, "connected", lambda: state["initialized"])
    monkeypatch.setattr(execution.actors, "shutdown", shutdown)
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


def _driver_process() -> subprocess.Popen:
    """A process titled as Ray titles a study's driver, returned once bash has taken that title."""
    proc = subprocess.Popen(["bash", "-c", "exec -a ray::StudyDriverActor sleep 60"])
    wait_for(lambda: execution.running_driver(proc.pid), EVENT_S, "bash to exec the titled process", interval=0.01)
    return proc


def test_stop_returns_once_the_killed_driver_process_is_gone(monkeypatch, tmp_path):
    """`ray.kill` only asks for the kill: the driver lives on for a moment and can still write to MLflow (its trial
    writer thread's queue), after a cancel has closed the study's runs. `stop` returns once the process is gone."""
    driver = _driver_process()
    killed = threading.Event()

    def kill_later(handle):  # as Ray does: the process dies after the call has returned
        threading.Timer(0.5, lambda: (killed.set(), driver.kill(), driver.wait())).start()

    monkeypatch.setattr(execution.actors, "kill", kill_later)
    executor = RayExecutor(Settings(data_dir=tmp_path))
    monkeypatch.setattr(executor, "connect", lambda: None)
    monkeypatch.setattr(executor, "_handle", lambda study_id: object())
    monkeypatch.setattr(executor, "_driver_pid", lambda handle: driver.pid)
    try:
        assert executor.stop("s-1") is True
        assert killed.is_set(), "stop returned while the driver process lived"
    finally:
        driver.kill()
        driver.wait()


def test_running_driver_is_a_live_process_titled_as_a_driver():
    driver = _driver_process()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert execution.running_driver(driver.pid)
        assert not execution.running_driver(other.pid)
        driver.kill()
        # a zombie until reaped: not running
        wait_for(lambda: not execution.running_driver(driver.pid), EVENT_S, "the killed driver to end", interval=0.01)
        driver.wait()
        assert not execution.running_driver(driver.pid)
    finally:
        for proc in (driver, other):
            proc.kill()
            proc.wait()

