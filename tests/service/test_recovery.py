"""What an API killed mid-submit leaves behind, and how the next API process and a retried submit finish it.

`Control` over a real study store (SQLite and the throwaway PostgreSQL) with a fake executor; a "restart" is a
new `Control` over the same store and the same (fake) Ray, whose drivers outlive the API. The real-process
version (uvicorn, Ray): `test_sharing.py::test_a_driver_never_told_to_run_is_started_at_start_up`.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import text, update

from service.control import Control, ExecutionUnavailable
from service.progress import MlflowView
from service.store import Store, StudyRow
from studies import load_catalog
from tests.service.conftest import FakeExecutor

SPEC = load_catalog("tiny")
KEY = "retry-key-1"


class Driving(FakeExecutor):
    """A fake Ray whose drivers, once launched, begin as a real one does: they record it in the store."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.connect_fails = False

    def connect(self) -> None:
        if self.connect_fails:
            raise ConnectionError("Ray is not reachable")

    def alive(self, study_id: str) -> bool:
        self.connect()
        return super().alive(study_id)

    def launch(self, handle, spec, study_id: str, attempt: int) -> None:
        super().launch(handle, spec, study_id, attempt)
        assert self.store.begin(study_id, attempt)


class LaunchFails(Driving):
    def launch(self, handle, spec, study_id: str, attempt: int) -> None:
        raise TimeoutError("the driver did not begin within 120 s")


class StartFails(Driving):
    def start(self, study_id: str) -> str:
        raise ConnectionError("Ray is not reachable")


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    url = f"sqlite:///{tmp_path / 'ptctl.db'}" if request.param == "sqlite" else \
        request.getfixturevalue("postgres").fresh_database("recovery")
    s = Store(url)
    s.migrate()
    yield s
    s.engine.dispose()


@pytest.fixture()
def ray(store):
    return Driving(store)


def api(store: Store, executor, tmp_path) -> Control:
    """One API process's control plane (a new one is a restart)."""
    return Control(store, executor, MlflowView(f"sqlite:///{tmp_path / 'mlflow.db'}"), tmp_path)


def start_up(control: Control) -> None:
    """What the API's start-up does (`service.app`): a Ray that cannot be reached stops it before reconciling."""
    control.executor.connect()
    control.reconcile(startup=True)


def stored_then_killed(store: Store, ray: Driving, step: str, age_s: float = 0) -> str:
    """A submit with `KEY` that the API's kill cut short after `step`: `stored` (the row), `actor` (and the idle
    driver actor) or `running` (and the move to running); `age_s` back-dates it."""
    study, created = store.create("tiny-cut", SPEC.as_dict(), SPEC.content_hash(), KEY)
    assert created
    if step in ("actor", "running"):
        ray.start(study.id)
    if step == "running":
        store.transition(study.id, "running", expect=["pending"])
    if age_s:
        past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=age_s)
        with store.engine.begin() as conn:
            conn.execute(update(StudyRow).where(StudyRow.id == study.id).values(created_at=past, updated_at=past))
    return study.id


@pytest.mark.parametrize("step", ["stored", "actor", "running"])
@pytest.mark.parametrize("age_s", [0, 300])
def test_no_study_is_left_unstarted_after_a_restart(store, ray, tmp_path, step, age_s):
    """Whichever step the kill cut the submit after, the next API process starts the study: it runs, under one
    driver that began (before: a young `pending` study stayed pending, an old one became `failed`, a `running`
    one whose driver was idle became `interrupted`)."""
    study_id = stored_then_killed(store, ray, step, age_s)
    start_up(api(store, ray, tmp_path))
    study = store.get(study_id)
    assert study.status == "running", (study.status, study.error)
    assert ray.launched == [study_id] and ray.alive(study_id) and study.began == study.attempts


@pytest.mark.parametrize("step", ["stored", "actor", "running"])
def test_a_retried_submit_starts_a_study_whose_driver_never_began(store, ray, tmp_path, step):
    """The restarted API could not reach Ray at start-up: the retried submit (same key) starts the study
    (before: it answered the study as it was, `interrupted` "the API stopped before its driver began", or
    `pending`)."""
    study_id = stored_then_killed(store, ray, step)
    ray.connect_fails = True
    restarted = api(store, ray, tmp_path)
    with pytest.raises(ConnectionError):
        start_up(restarted)
    ray.connect_fails = False
    study, created = restarted.submit(SPEC, KEY)
    assert not created and study.id == study_id
    assert study.status == "running" and ray.launched == [study_id] and study.began == study.attempts


@pytest.mark.parametrize("failure", [LaunchFails, StartFails])
def test_a_submit_answered_503_is_started_by_its_retry(store, tmp_path, failure):
    """Ray could not start the driver (503): the client's retry with the same key starts it (before: 200 with the
    study `interrupted` or `failed`)."""
    with pytest.raises(ExecutionUnavailable):
        api(store, failure(store), tmp_path).submit(SPEC, KEY)
    ray = Driving(store)
    study, created = api(store, ray, tmp_path).submit(SPEC, KEY)
    assert not created and study.status == "running" and ray.launched == [study.id]


def test_a_retried_submit_leaves_a_study_that_ran_as_it_is(store, ray, tmp_path):
    """A retry must not run a study twice, nor revive one that began and was later lost, failed or cancelled."""
    control = api(store, ray, tmp_path)
    study, _ = control.submit(SPEC, KEY)
    assert study.status == "running" and study.began == 1
    assert control.submit(SPEC, KEY)[0].status == "running" and ray.launched == [study.id]
    ray.live.clear()  # its driver died
    control.reconcile()
    again, created = control.submit(SPEC, KEY)
    assert not created and again.status == "interrupted" and ray.launched == [study.id]
    control.cancel(study.id)
    assert control.submit(SPEC, KEY)[0].status == "cancelled" and ray.launched == [study.id]


def test_a_study_cancelled_before_its_driver_began_stays_cancelled_on_retry(store, ray, tmp_path):
    study_id = stored_then_killed(store, ray, "stored")
    control = api(store, ray, tmp_path)
    control.cancel(study_id)
    assert control.submit(SPEC, KEY)[0].status == "cancelled" and ray.launched == []


def test_a_late_start_up_pass_leaves_this_process_own_submits_alone(store, ray, tmp_path):
    """Ray came back after start-up: the periodic pass finishes the start-up work for studies an earlier API left,
    and never touches a submit of this process that is still between its steps."""
    left = stored_then_killed(store, ray, "stored")
    ray.connect_fails = True
    control = api(store, ray, tmp_path)
    with pytest.raises(ConnectionError):
        start_up(control)
    ray.connect_fails = False
    own, _ = store.create("tiny-own", SPEC.as_dict(), SPEC.content_hash())  # this process is submitting it
    control.reconcile()
    assert store.get(left).status == "running" and store.get(own.id).status == "pending"
    assert ray.launched == [left]
    control.reconcile()  # the start-up work is done once
    assert ray.launched == [left]


def test_studies_stored_before_the_began_column_count_as_begun(request, tmp_path):
    """Upgrading a store: its studies take every attempt as begun, so no retried submit runs one of them again."""
    from alembic import command
    from alembic.config import Config

    for url in (f"sqlite:///{tmp_path / 'old.db'}", request.getfixturevalue("postgres").fresh_database("upgrade")):
        store = Store(url)
        cfg = Config()
        cfg.set_main_option("script_location", "service/migrations")
        with store.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0001")
            for study_id, status, attempts in (("old-1", "interrupted", 1), ("old-2", "pending", 0)):
                conn.execute(text("INSERT INTO studies (id, name, spec, spec_hash, status, planned, attempts, "
                                  "created_at, updated_at) VALUES (:id, 'tiny', '{}', 'h', :status, '{}', :attempts, "
                                  ":now, :now)"),
                             {"id": study_id, "status": status, "attempts": attempts, "now": dt.datetime.now(dt.UTC)})
        store.migrate()
        assert (store.get("old-1").began, store.get("old-2").began) == (1, 0)
        store.engine.dispose()
