"""A tracker that records nothing: the driver's MLflow seam for studies and tests that need no MLflow.

It answers every call `workers.tracking.Tracker` answers for the driver and the runners, with run ids made of
the study id, phase and trial key (so a resumed study finds "its" runs), and writes nothing anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


class NullTracker:
    uri = "none"

    def study_run(self, study_id: str, tags: dict[str, str], instance: str | None = None) -> str:
        return study_id

    def phase_run(self, study_id: str, phase: str, parent: str, instance: str | None = None) -> str:
        return f"{study_id}/{phase}"

    def trial_run(self, study_id: str, phase: str, trial_key: str, parent: str, tags: dict[str, str],
                  instance: str | None = None, name: str | None = None) -> str:
        return f"{study_id}/{phase}/{trial_key}"

    def runs(self, study_id: str, kind: str, instance: str | None = None) -> list:
        return []

    def owns(self, run_id: str, study_id: str, instance: str | None) -> bool:
        return True

    def reopen(self, run_id: str) -> None:
        pass

    def close(self, run_id: str, status: str, tags: dict[str, Any]) -> None:
        pass

    def prune_trials(self, study_id: str, phase: str, keep: set[str], stage: str | None = None,
                     instance: str | None = None) -> list[str]:
        return []

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        pass

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        pass

    def log_metrics(self, run_id: str, rows: Iterable[dict[str, Any]]) -> None:
        pass

    def log_verdict(self, run_id: str, params: dict[str, Any], metrics: list[dict[str, Any]], tags: dict[str, Any],
                    description: str | None = None) -> None:
        pass

    def log_table(self, run_id: str, table: Any, artifact_file: str) -> None:
        pass

    def log_dataset(self, run_id: str, name: str, digest: str, source: str, source_type: str = "local",
                    context: str = "training") -> None:
        pass

    def log_artifacts(self, run_id: str, paths: Iterable[Path], artifact_path: str | None = None) -> None:
        pass

    def last_step(self, run_id: str, key: str) -> int:
        return 0

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        pass

    def save_view(self, columns: Iterable[str], name: str = "verdicts") -> None:
        pass

    def runs_link(self) -> str | None:
        return None

    def link(self, run_id: str) -> str:
        return run_id
