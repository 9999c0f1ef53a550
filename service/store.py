"""The study store: one row per study, SQLAlchemy 2 over SQLite (default) or PostgreSQL.

The schema is owned by Alembic (`service/migrations/`); `Store.migrate()` upgrades to head and is
called at API start-up. Every write is one transaction. A status change is a conditional UPDATE
(`... WHERE status IN (allowed sources)`, the rules of `studies/status.py`), so two writers racing (the
API cancelling while the driver actor reports success) cannot both win, on either database. A caller
may narrow the sources to the status it saw (`expect`), and a driver fences its writes with its
attempt number (`attempt`): a driver of an earlier attempt can no longer write.

Both the API process and the driver actors (which report `succeeded`/`failed` and the current phase)
write here; SQLite runs in WAL mode with a busy timeout so they can.
"""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sqlalchemy import JSON, DateTime, Integer, String, Text, create_engine, event, func, select, text, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import ConnectionPoolEntry

from studies.status import TRANSITIONS, StudyStatus


class Base(DeclarativeBase):
    pass


class StudyRow(Base):
    __tablename__ = "studies"

    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    spec_hash: Mapped[str] = mapped_column(String(64), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    phase: Mapped[str | None] = mapped_column(String(16))
    planned: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)  # phase → trials, told by the driver
    error: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), unique=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # driver starts (1 + resumes)
    began: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # the last attempt whose driver began
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))


@dataclass(frozen=True)
class Study:
    """A detached snapshot of one row (safe to use after its session closed)."""

    id: str
    name: str
    spec: dict[str, Any]
    spec_hash: str
    status: str
    phase: str | None
    planned: dict[str, int]
    error: str | None
    idempotency_key: str | None
    attempts: int
    began: int  # the last attempt whose driver began running (0: no driver of this study ever began)
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def of(cls, row: StudyRow) -> Study:
        values = {f: getattr(row, f) for f in cls.__dataclass_fields__}
        for f in ("created_at", "updated_at"):  # SQLite returns naive datetimes; they are UTC
            values[f] = values[f].replace(tzinfo=values[f].tzinfo or dt.UTC)
        return cls(**values)


class NotFound(LookupError):
    """No study with that id."""


class IllegalTransition(Exception):
    """The study's status does not allow the requested change (HTTP 409)."""

    def __init__(self, study_id: str, current: str, target: str, allowed: Iterable[str] | None = None) -> None:
        allowed = sorted(TRANSITIONS[StudyStatus(target)] if allowed is None else allowed)
        super().__init__(f"study {study_id} is {current}; only a study that is {' or '.join(allowed) or '—'} "
                         f"can become {target}")
        self.current = current


class IdempotencyConflict(Exception):
    """An Idempotency-Key was reused with a different spec (HTTP 409)."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Store:
    """Transactional access to the `studies` table at `url`."""

    def __init__(self, url: str) -> None:
        self.url = url
        sqlite = url.startswith("sqlite")
        if sqlite and ":memory:" not in url:
            Path(url.split("///", 1)[1]).parent.mkdir(parents=True, exist_ok=True)
        self.engine = create_engine(url, connect_args={"timeout": 30} if sqlite else {}, pool_pre_ping=not sqlite)
        if sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)

    def migrate(self) -> None:
        """Upgrade the schema to the newest Alembic revision (idempotent)."""
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    # ------------------------------------------------------------------ reads
    def get(self, study_id: str) -> Study:
        with Session(self.engine) as s:
            row = s.get(StudyRow, study_id)
            if row is None:
                raise NotFound(study_id)
            return Study.of(row)

    def list(self, status: str | None = None, limit: int = 50, offset: int = 0) -> tuple[list[Study], int]:
        """Newest first; returns one page and the total count under the filter."""
        query = select(StudyRow)
        count = select(func.count()).select_from(StudyRow)
        if status is not None:
            query, count = query.where(StudyRow.status == status), count.where(StudyRow.status == status)
        query = query.order_by(StudyRow.created_at.desc(), StudyRow.id).limit(limit).offset(offset)
        with Session(self.engine) as s:
            return [Study.of(r) for r in s.scalars(query)], s.scalar(count) or 0

    def ids_with_status(self, status: str) -> builtins.list[str]:  # (`list` here is the method above)
        with Session(self.engine) as s:
            return list(s.scalars(select(StudyRow.id).where(StudyRow.status == status)))

    # ------------------------------------------------------------------ writes
    def create(self, study_id: str, spec: dict[str, Any], spec_hash: str,
               idempotency_key: str | None = None) -> tuple[Study, bool]:
        """Insert a `pending` study; with a known `idempotency_key`, return that study instead.

        Returns (study, created). The same key with another spec raises `IdempotencyConflict`.
        """
        if idempotency_key is not None:
            existing = self._by_key(idempotency_key)
            if existing is not None:
                return self._replay(existing, spec_hash), False
        now = _now()
        row = StudyRow(id=study_id, name=spec["name"], spec=spec, spec_hash=spec_hash, status=str(StudyStatus.PENDING),
                       phase=None, planned={}, error=None, idempotency_key=idempotency_key, attempts=0,
                       began=0, created_at=now, updated_at=now)
        try:
            with Session(self.engine) as s, s.begin():
                s.add(row)
                s.flush()
                created = Study.of(row)
        except IntegrityError:  # a concurrent request with the same key won the insert
            existing = self._by_key(idempotency_key) if idempotency_key else None
            if existing is None:
                raise
            return self._replay(existing, spec_hash), False
        return created, True

    def _by_key(self, key: str) -> Study | None:
        with Session(self.engine) as s:
            row = s.scalar(select(StudyRow).where(StudyRow.idempotency_key == key))
            return Study.of(row) if row else None

    @staticmethod
    def _replay(existing: Study, spec_hash: str) -> Study:
        if existing.spec_hash != spec_hash:
            raise IdempotencyConflict(f"Idempotency-Key already used for study {existing.id} with another spec: "
                                      "send a new key for a new study")
        return existing

    def transition(self, study_id: str, target: StudyStatus, error: str | None = None, *,
                   expect: Iterable[str] | None = None, attempt: int | None = None) -> Study:
        """Move to `target` if the current status allows it (atomically); else `IllegalTransition`.

        `expect` narrows the allowed sources to the statuses the caller saw (a resume of a cancelled study
        must not revive it after someone else moved it on); `attempt` fences a driver's writes to its own
        attempt (a driver of an earlier attempt cannot write).
        """
        allowed = TRANSITIONS[StudyStatus(target)]
        if expect is not None:
            allowed = allowed & frozenset(StudyStatus(e) for e in expect)
        values: dict[str, Any] = {"status": str(target), "updated_at": _now(), "error": error}
        if target == StudyStatus.RUNNING:
            values["attempts"] = StudyRow.attempts + 1
        if target == StudyStatus.SUCCEEDED:
            values["phase"] = None
        stmt = update(StudyRow).where(StudyRow.id == study_id, StudyRow.status.in_([str(a) for a in allowed]))
        if attempt is not None:
            stmt = stmt.where(StudyRow.attempts == attempt)
        with Session(self.engine) as s, s.begin():
            # an UPDATE's result is a CursorResult (rowcount); `Session.execute` is typed as returning a Result
            changed = cast("CursorResult[Any]", s.execute(stmt.values(**values))).rowcount
        study = self.get(study_id)
        if not changed:
            if attempt is not None and study.attempts != attempt:
                raise IllegalTransition(study_id, f"{study.status} under attempt {study.attempts} (not {attempt})",
                                        target, allowed)
            raise IllegalTransition(study_id, study.status, target, allowed)
        return study

    def begin(self, study_id: str, attempt: int) -> bool:
        """A driver of `attempt` begins: records it (`began`) if the study is still `running` under `attempt`, and
        says whether it is (else the driver must exit without training). A study whose `began` is 0 never had a
        driver begin: its submit never completed, and a retried submit or the next API process starts it."""
        stmt = update(StudyRow).where(StudyRow.id == study_id, StudyRow.status == str(StudyStatus.RUNNING),
                                      StudyRow.attempts == attempt).values(began=attempt)
        with Session(self.engine) as s, s.begin():
            return cast("CursorResult[Any]", s.execute(stmt)).rowcount == 1

    def set_phase(self, study_id: str, phase: str, trials: int, attempt: int | None = None) -> None:
        """The driver (of `attempt`, when given) started `phase` with `trials` planned trials."""
        with Session(self.engine) as s, s.begin():
            row = s.get(StudyRow, study_id)
            if row is None:
                raise NotFound(study_id)
            if attempt is not None and row.attempts != attempt:
                raise IllegalTransition(study_id, f"{row.status} under attempt {row.attempts} (not {attempt})",
                                        "running", [])
            row.phase, row.planned, row.updated_at = phase, {**row.planned, phase: trials}, _now()


def _sqlite_pragmas(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers never block the one writer
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()
