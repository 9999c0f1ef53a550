"""The tracker protocol: every call the driver and the runners make to record a study's runs, and the tracker
that records nothing.

`workers.mlflow_tracker.Tracker` (MLflow) implements `RunTracker`, and mypy checks it against it. Each method's body
here is what a study without tracking does (`NullTracker`): run ids made of the study id, phase and trial key
(so a resumed study finds "its" runs), and nothing written anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol


class RunTracker(Protocol):
    uri: str

    def study_run(self, study_id: str, tags: dict[str, str], instance: str | None = None) -> str:
        """Find or create the study's run."""
        return study_id

    def phase_run(self, study_id: str, phase: str, parent: str, instance: str | None = None) -> str:
        """Find or create a phase's run under the study's."""
        return f"{study_id}/{phase}"

    def trial_run(self, study_id: str, phase: str, trial_key: str, parent: str, tags: dict[str, str],
                  instance: str | None = None, name: str | None = None) -> str:
        """Find or create a trial's run under its phase's (a resumed trial finds its run by its key)."""
        return f"{study_id}/{phase}/{trial_key}"

    def runs(self, study_id: str, kind: str, instance: str | None = None) -> list[Any]:
        """The study's runs of one kind (`study`, `phase`, `trial`)."""
        return []

    def owns(self, run_id: str, study_id: str, instance: str | None) -> bool:
        """The store holds this study instance's run."""
        return True

    def reopen(self, run_id: str) -> None:
        """Mark a run ended by an interruption running again."""

    def close(self, run_id: str, status: str, tags: dict[str, Any]) -> None:
        """End a run with `status` (FAILED, KILLED) and tags saying why."""

    def prune_trials(self, study_id: str, phase: str, keep: set[str], stage: str | None = None,
                     instance: str | None = None) -> list[str]:
        """Delete the phase's trial runs whose key is not in `keep` (abandoned attempts); their ids."""
        return []

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None: ...

    def log_params(self, run_id: str, params: dict[str, Any]) -> None: ...

    def log_metrics(self, run_id: str, rows: Iterable[dict[str, Any]]) -> None:
        """Rows of metrics, each with its `step`."""

    def log_verdict(self, run_id: str, params: dict[str, Any], metrics: list[dict[str, Any]], tags: dict[str, Any],
                    description: str | None = None) -> None: ...

    def log_table(self, run_id: str, table: Any, artifact_file: str) -> None: ...

    def log_dataset(self, run_id: str, name: str, digest: str, source: str, source_type: str = "local",
                    context: str = "training") -> None: ...

    def log_artifacts(self, run_id: str, paths: Iterable[Path], artifact_path: str | None = None) -> None: ...

    def last_step(self, run_id: str, key: str) -> int:
        """The last step the run holds of metric `key` (0: none): a restarted trial logs only later ones."""
        return 0

    def finish(self, run_id: str, status: str = "FINISHED") -> None: ...

    def save_view(self, columns: Iterable[str], name: str = "verdicts") -> None:
        """Save the runs-table view that shows the verdicts."""

    def runs_link(self) -> str | None:
        """Where a person opens the study's runs table."""
        return None

    def link(self, run_id: str) -> str:
        return run_id


class NullTracker(RunTracker):
    """Records nothing (module docstring): the driver's seam for studies and tests that need no MLflow."""

    uri = "none"


def mlflow_installed() -> bool:
    """Whether MLflow can be imported here (the local runner runs without it: `NullTracker`)."""
    import importlib.util

    try:
        return importlib.util.find_spec("mlflow") is not None
    except ImportError:  # a finder that refuses it
        return False
