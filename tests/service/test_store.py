"""The study store on SQLite and on a throwaway PostgreSQL (`tests/service/postgres.py`: always run, never skipped
under CI)."""

from __future__ import annotations

import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from service.store import Base, IdempotencyConflict, IllegalTransition, NotFound, Store

SPEC = {"name": "tiny"}


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
    else:
        url = request.getfixturevalue("postgres").fresh_database("store")
    s = Store(url)
    s.migrate()
    return s


def test_migrations_build_the_models_schema_and_rerun_cleanly(store):
    store.migrate()  # a second upgrade is a no-op
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], f"service/store.py and service/migrations disagree: add a migration for {diff}"


def test_create_get_and_idempotency(store):
    study, created = store.create("s-1", SPEC, "h1", idempotency_key="key-1")
    assert created and study.status == "pending" and study.created_at.tzinfo is not None
    again, created = store.create("s-2", SPEC, "h1", idempotency_key="key-1")
    assert not created and again.id == "s-1"
    with pytest.raises(IdempotencyConflict, match="another spec"):
        store.create("s-3", SPEC, "h2", idempotency_key="key-1")
    with pytest.raises(NotFound):
        store.get("s-2")


def test_transitions_follow_the_state_machine(store):
    store.create("s", SPEC, "h")
    assert store.transition("s", "running").attempts == 1
    store.set_phase("s", "tune", 6)
    store.set_phase("s", "transfer", 1)
    assert store.get("s").planned == {"tune": 6, "transfer": 1} and store.get("s").phase == "transfer"
    store.transition("s", "interrupted", error="lost")
    with pytest.raises(IllegalTransition, match="is interrupted"):
        store.transition("s", "succeeded")
    resumed = store.transition("s", "running")
    assert resumed.attempts == 2 and resumed.error is None
    store.transition("s", "succeeded")
    for target in ("running", "cancelled", "failed", "interrupted"):
        with pytest.raises(IllegalTransition):
            store.transition("s", target)
    assert store.get("s").status == "succeeded"


def test_racing_writers_exactly_one_wins(store):
    """The API cancelling while the driver reports success: one transition, never both."""
    store.create("race", SPEC, "h")
    store.transition("race", "running")
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def attempt(target: str) -> None:
        barrier.wait()
        try:
            store.transition("race", target)
            outcomes.append(target)
        except IllegalTransition:
            pass

    threads = [threading.Thread(target=attempt, args=(t,)) for t in ("cancelled", "succeeded")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 1 and store.get("race").status == outcomes[0]


def test_list_filters_and_pages(store):
    for i in range(5):
        store.create(f"p{i}", SPEC, "h")
    for i in (1, 3):
        store.transition(f"p{i}", "running")
    page, total = store.list(limit=2, offset=0)
    assert total == 5 and len(page) == 2
    ids = [s.id for s in store.list(limit=10)[0]]
    assert ids == ["p4", "p3", "p2", "p1", "p0"]  # newest first
    running, total = store.list(status="running")
    assert total == 2 and {s.id for s in running} == {"p1", "p3"}
    assert set(store.ids_with_status("running")) == {"p1", "p3"}


def test_expect_narrows_the_sources_to_what_the_caller_saw(store):
    """A submit saw `pending`: once a cancel moved the study on, its move to running must fail."""
    store.create("x", SPEC, "h")
    store.transition("x", "cancelled", error="cancelled by request")
    with pytest.raises(IllegalTransition, match="is cancelled"):
        store.transition("x", "running", expect=["pending"])
    assert store.get("x").status == "cancelled" and store.get("x").attempts == 0


def test_a_driver_writes_only_under_its_own_attempt(store):
    store.create("a", SPEC, "h")
    first = store.transition("a", "running").attempts
    store.transition("a", "cancelled")
    assert store.transition("a", "running", expect=["cancelled"]).attempts == first + 1  # resumed: attempt 2
    assert not store.begin("a", first) and store.begin("a", first + 1)  # only the current attempt's driver begins
    with pytest.raises(IllegalTransition, match="attempt 2"):
        store.transition("a", "succeeded", attempt=first)  # the stale driver's last word is refused
    with pytest.raises(IllegalTransition):
        store.set_phase("a", "tune", 3, attempt=first)
    assert store.get("a").status == "running" and store.get("a").phase is None
