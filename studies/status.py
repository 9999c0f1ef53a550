"""A study's life cycle: its statuses and the legal changes between them, defined once.

The study store (`service/store.py`) applies every change as one conditional UPDATE whose WHERE clause
is `TRANSITIONS[target]` (intersected with what the caller saw), the driver writes its outcome under the
same rule, and the API schema's `Status` is derived from `StudyStatus`:

    pending ──▶ running ──▶ succeeded | failed | cancelled
       │           └──────▶ interrupted          (driver lost: Ray head or cluster gone, actor died)
       └──▶ failed | cancelled                   (could not start / cancelled before start)
    interrupted | failed | cancelled ──▶ running (resume)      interrupted ──▶ cancelled

A driver runs only for the attempt it was launched for (`attempts`, raised on every move to `running`):
a driver whose study has moved on (cancelled, or resumed under a newer attempt) exits without training.
"""

from __future__ import annotations

from enum import StrEnum


class PhaseStatus(StrEnum):
    """A phase's status in the study's state (`studies.phases.PhaseResult`) and its progress."""

    PENDING = "pending"  # not started (no record in the state)
    RUNNING = "running"  # started; a phase with stages (compare) keeps what its finished stages found
    DONE = "done"


class StudyStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


S = StudyStatus
TERMINAL: frozenset[StudyStatus] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
RESUMABLE: frozenset[StudyStatus] = frozenset({S.INTERRUPTED, S.FAILED, S.CANCELLED})
TRANSITIONS: dict[StudyStatus, frozenset[StudyStatus]] = {  # target → the statuses it may come from
    S.RUNNING: frozenset({S.PENDING, *RESUMABLE}),
    S.SUCCEEDED: frozenset({S.RUNNING}),
    S.FAILED: frozenset({S.PENDING, S.RUNNING}),
    S.CANCELLED: frozenset({S.PENDING, S.RUNNING, S.INTERRUPTED}),
    S.INTERRUPTED: frozenset({S.RUNNING}),
}
