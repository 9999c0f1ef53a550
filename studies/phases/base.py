"""The phase protocol: what every phase file implements, and the typed pieces the driver moves between them.

A phase (`studies.phases.PHASES`) says whether a spec runs it, plans its trials from
the spec and the study's state, judges its trial table into a typed result (a `PhaseResult`: what `state.json`
keeps and every reader reads back), writes its own figures and tables through an `Artifacts` folder, states its
verdict (params, metrics, tags and one sentence for its MLflow run) and which of it the runs table shows, and
tells its result: its report section and its lines of the CLI summary. The driver (`workers/driver.py`) owns the
loop, persistence and tracking: nothing here trains, logs or imports torch.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import pandas as pd
from pydantic import BaseModel, ConfigDict

from studies.plan import PlannedTrial
from studies.spec import StudySpec
from studies.status import PhaseStatus

R = TypeVar("R", bound="PhaseResult")
S = TypeVar("S")


class PhaseResult(BaseModel):
    """A phase's record in `state.json`: its status, its elapsed wall time and (each phase's subclass) its result."""

    model_config = ConfigDict(extra="forbid")

    status: PhaseStatus = PhaseStatus.RUNNING
    wall_s: float | None = None  # the phase's elapsed time (the cost account's)

    @property
    def done(self) -> bool:
        return self.status == PhaseStatus.DONE


@dataclass
class Verdict:
    """What a phase's MLflow run says at a glance (`workers.verdicts`): params, metrics (rows with a `step`),
    tags and a sentence."""

    params: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    tags: dict[str, Any] = field(default_factory=dict)
    sentence: str = ""
    columns: list[tuple[int, str]] = field(default_factory=list)  # `Phase.columns`, kept by `workers.verdicts`

    def merge(self, other: Verdict) -> Verdict:
        return Verdict({**self.params, **other.params}, [*self.metrics, *other.metrics], {**self.tags, **other.tags},
                       " ".join(s for s in (self.sentence, other.sentence) if s), [*self.columns, *other.columns])

    def shown(self, place: int, group: str, pattern: str) -> list[tuple[int, str]]:
        """Its keys of `group` ("tags", "metrics", "params") that fully match `pattern`, in the order they were
        logged, as runs-table columns (`metrics.`upper_bound``) at `place`."""
        keys = {"tags": self.tags, "params": self.params, "metrics": {k: 0 for row in self.metrics for k in row}}
        return [(place, f"{group}.`{k}`") for k in keys[group] if k != "step" and re.fullmatch(pattern, k)]


# The runs table's places (`workers.verdicts.verdict_columns`), in its order: the pass/fail tags, the certificate's
# counts, the losses, the drifts, the trials' length, then the params: the winner and the widths
PASS, COUNTS, LOSSES, DRIFTS, LENGTH, SETUP = range(6)


class Artifacts(Protocol):
    """Where a phase writes its files (`workers.folder.StudyFolder`)."""

    def artifact(self, name: str) -> Path: ...

    def figure(self, name: str) -> Path: ...

    def write_artifact(self, name: str, data: Any) -> Path: ...


class Out(Protocol):
    """Where a phase prints its lines of the CLI summary (a rich `Console`)."""

    def print(self, *objects: Any, soft_wrap: bool | None = None) -> None: ...


class State(Protocol):
    """The study's state as a phase reads it (`studies.phases.StudyState`)."""

    phases: dict[str, PhaseResult]

    def done(self, phase: str) -> bool: ...

    def result(self, phase: str, kind: type[R]) -> R | None: ...

    def centre(self) -> dict[str, float]: ...


@dataclass
class Context:
    """What a phase plans and judges from: the spec, the study's state, the finished phases' trial tables, and
    (loaded only when asked) the data's vocabulary size."""

    spec: StudySpec
    state: State
    tables: Callable[[str], pd.DataFrame | None]  # a finished phase's (or stage's) trial table, None if none
    vocab_size: Callable[[], int] = lambda: 0


@dataclass(frozen=True)
class Stage:
    """One tune search a phase runs before its own trials (compare: each family at each budget), as its own
    restorable experiment and trial table (`table`), its runs tagged `tags`."""

    name: str
    spec: StudySpec  # the tune-only study it searches
    table: str  # its trial table's name (`StudyFolder.trials(table)`)
    tags: Mapping[str, Any]


class Phase(ABC):
    """One phase of a study (module docstring): a subclass names itself and its result type and implements the
    abstract methods; the others are the defaults of a phase without stages, never reused, that tells its verdict."""

    name: ClassVar[str]
    result: ClassVar[type[PhaseResult]]
    reusable: ClassVar[tuple[str, ...]] = ()  # the spec sections its result depends on: () = never reused
    how_to_add: ClassVar[str] = "add its section"  # `required`'s fix for a spec without its section
    told: ClassVar[int] = 9  # where the CLI summary tells its lines, smallest first
    pictured: ClassVar[int] = 9  # where the CLI summary lists its figures, smallest first
    # a figure's label → (title, caption, the line left in its section): the figure heads the report
    headline: ClassVar[Mapping[str, tuple[str, str, str]]] = {}

    @abstractmethod
    def present(self, spec: StudySpec) -> bool:
        """Whether `spec` runs the phase (`studies.phases.phases_of`)."""

    @abstractmethod
    def plan(self, ctx: Context) -> list[PlannedTrial] | None:
        """The phase's trials (None: the tune search of `ctx.spec`)."""

    def planned(self, spec: StudySpec) -> list[PlannedTrial] | None:
        """Its trials around the space's defaults, as `ptctl study plan` shows them; None: not a grid (a search)."""
        return None

    def count(self, spec: StudySpec) -> int:
        """How many trials the phase trains (the progress bar's total)."""
        return len(self.planned(spec) or [])

    @abstractmethod
    def judge(self, ctx: Context, table: pd.DataFrame, out: Artifacts) -> PhaseResult:
        """The typed result of the phase's trial table, writing its figures and tables to `out`; raises
        `PhaseFailed` when the table answers nothing."""

    @abstractmethod
    def figures(self, result: PhaseResult) -> dict[str, str]:
        """The figures `judge` wrote: the report's label → the figure's name (`Artifacts.figure`)."""

    @abstractmethod
    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        """What the phase's MLflow run says at a glance."""

    def columns(self, spec: StudySpec, verdict: Verdict) -> list[tuple[int, str]]:
        """The runs-table columns of its verdict's keys, each at its place (`PASS`...): by default every key."""
        return [*verdict.shown(PASS, "tags", ".+"), *verdict.shown(DRIFTS, "metrics", ".+"),
                *verdict.shown(SETUP, "params", ".+")]

    def about(self, spec: StudySpec, result: PhaseResult | None) -> dict[str, Any]:
        """What it adds to the report's spec summary (`analysis.report.SUMMARY_KEYS`)."""
        return {}

    def section(self, ctx: Context, result: PhaseResult, tables: Mapping[str, pd.DataFrame]) -> list[str]:
        """The Markdown paragraphs of its finished result's report section; `tables`: the phases' trial tables."""
        return []

    def summary(self, ctx: Context, result: PhaseResult | None, out: Out, runs: Mapping[str, str]) -> None:
        """Print its lines of the CLI summary (`result` None: not finished; `runs`: trial key → MLflow run id)."""
        return None

    def stages(self, ctx: Context) -> list[Stage]:
        """Tune searches to run before the phase's own trials (compare's); `stage_done` keeps each one's best."""
        return []

    def stage_done(self, ctx: Context, stage: Stage, table: pd.DataFrame) -> None:
        """Record a finished stage in the phase's running record (`ctx.state.phases[name]`)."""
        raise NotImplementedError(f"the {self.name} phase has no stages")

    def completed(self, ctx: Context, table: pd.DataFrame) -> pd.DataFrame:
        """The phase's trial table once its trials ran (verify adds the centre runs it reused from transfer)."""
        return table


class PhaseFailed(ValueError):
    """A phase's trials answer nothing (no tune trial completed): the message names the fix."""


def required(section: S | None, phase: type[Phase]) -> S:
    """`phase`'s section of the spec (`spec.verify`, ...); a `ValueError` naming the fix when the study has none."""
    if section is None:
        raise ValueError(f"this study has no {phase.name} section: {phase.how_to_add} to the spec")
    return section
