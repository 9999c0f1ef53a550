"""A study's folder: the one place that knows its layout (torch-free; the service reads folders through it).

    <data dir>/studies/
        phase_index.json    phase key → the study that ran it (`PhaseIndex`; shared by every driver)
        <study id>/
            state.json      finished phases and their results, MLflow run ids (`studies.phases.StudyState`)
            ray/            one Ray Tune experiment (or in-process journal) per phase, with each trial's log
            artifacts/      spec.yaml, <phase>_trials.csv, trials.csv, figures, certificate.json, cost.json, report.md

Shared files are written whole, then moved into place (`os.replace`), so a reader or a crash never sees half;
`phase_index.json`'s read-modify-write holds an exclusive lock, as drivers that finish together race on it.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from workers.paths import data_dir

if TYPE_CHECKING:
    from studies.phases import StudyState

STATE = "state.json"
INDEX = "phase_index.json"


def studies_dir(data: Path | None = None) -> Path:
    """`<data dir>/studies`: every study's folder (`data` None: `workers.paths.data_dir()`)."""
    return (data if data is not None else data_dir()) / "studies"


def write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON atomically (a temporary file per writer, then `os.replace`)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file's content; {} when it does not exist (yet)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except FileNotFoundError:
        return {}


class StudyFolder:
    """`<data dir>/studies/<study_id>/` and the paths inside it."""

    def __init__(self, study_id: str, data: Path | None = None) -> None:
        self.study_id = study_id
        self.path = studies_dir(data) / study_id

    def __repr__(self) -> str:
        return f"StudyFolder({str(self.path)!r})"

    @staticmethod
    def known(data: Path | None = None) -> list[str]:
        """The ids of the studies that have a folder."""
        root = studies_dir(data)
        return sorted(p.name for p in root.glob("*") if p.is_dir()) if root.exists() else []

    def create(self) -> StudyFolder:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        return self

    # ---------------------------------------------------------------- the layout
    @property
    def state_path(self) -> Path:
        return self.path / STATE

    @property
    def ray(self) -> Path:
        """Where the phases' experiments are stored (Ray Tune's, or the in-process runner's journals)."""
        return self.path / "ray"

    @property
    def artifacts(self) -> Path:
        return self.path / "artifacts"

    def artifact(self, name: str) -> Path:
        return self.artifacts / name

    def trials(self, phase: str) -> Path:
        """A finished phase's trial table (`compare_tune_<stage>` for one compare stage's tune)."""
        return self.artifact(f"{phase}_trials.csv")

    def figure(self, name: str) -> Path:
        return self.artifact(f"{name}.png")

    @property
    def all_trials(self) -> Path:
        return self.artifact("trials.csv")

    @property
    def spec(self) -> Path:
        return self.artifact("spec.yaml")

    @property
    def report(self) -> Path:
        return self.artifact("report.md")

    @property
    def certificate(self) -> Path:
        return self.artifact("certificate.json")

    @property
    def cost(self) -> Path:
        return self.artifact("cost.json")

    # ---------------------------------------------------------------- reading and writing
    def read_state(self) -> StudyState | None:
        """`state.json`, typed; None before the driver wrote it (or if caught mid-write by another writer)."""
        from studies.phases import StudyState  # only here: `ptctl report` reads a folder without pandas or scipy

        try:
            return StudyState.model_validate_json(self.state_path.read_text())
        except (FileNotFoundError, ValidationError):
            return None

    def write_artifact(self, name: str, data: Any) -> Path:
        """A JSON artifact (certificate, cost), written atomically."""
        path = self.artifact(name)
        write_json(path, data)
        return path

    def phase_done(self, phase: str) -> bool:
        """The phase is recorded done in `state.json` and its trial table exists."""
        state = self.read_state()
        return state is not None and state.done(phase) and self.trials(phase).exists()


class PhaseIndex:
    """`studies/phase_index.json`: which study ran a reusable phase (by its `phase_key`)."""

    def __init__(self, data: Path | None = None) -> None:
        self.path = studies_dir(data) / INDEX

    def get(self, key: str) -> str | None:
        return read_json(self.path).get(key)

    def record(self, key: str, study_id: str) -> None:
        """`index[key] = study_id`, read-modify-written under an exclusive lock: drivers of studies finishing
        together (the service runs several) must not drop each other's entries."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            write_json(self.path, {**read_json(self.path), key: study_id})
