"""What a study has done so far: finished phases from its folder, the running phase from MLflow.

- the study folder's `state.json` (`workers.folder.StudyFolder`, written by `workers/driver.py`): finished
  phases with their results, and the MLflow run ids of the study and of each phase;
- a finished phase's trial table (`StudyFolder.trials`), authoritative once it exists;
- the running phase: its MLflow trial runs (tags `phase`, `status` = running | completed | stopped |
  diverged | failed, `trial_key`; metric `eval_loss`), written live by the driver's Tune callback.
  Ray Tune's own result files are no use here: Tune stages them on the driver's node and copies them
  into the study folder only at its experiment checkpoints.

An MLflow search takes 30–50 ms, too slow for every `GET /studies/{id}`: `MlflowView.live` keeps each
study's trial runs in memory and refreshes them in the background once they are older than `ttl`
seconds (stale-while-revalidate), so a read waits for MLflow only the first time it sees a study.
"""

from __future__ import annotations

import csv
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import ValidationError

from analysis import STATUSES, TrialStatus
from service.schemas import MlflowInfo, PhaseProgress, finite
from studies.phases import PHASES, PhaseStatus, StudyState, phases_of
from studies.spec import StudySpec
from workers.folder import StudyFolder
from workers.paths import redact_uri as redact_uri  # re-exported: service.api and service.app use it

if TYPE_CHECKING:
    from mlflow.entities import Run

    from workers.mlflow_tracker import Tracker


def spec_phases(spec: dict[str, Any]) -> list[str]:
    """The phases a stored spec runs (`StudySpec.phases`); a spec stored under an older schema that no
    longer validates still shows: then every registered phase with a section in it."""
    try:
        return phases_of(StudySpec.model_validate(spec))
    except ValidationError:
        return [p for p in PHASES if spec.get(p) is not None]


def _done(state: StudyState | None, folder: StudyFolder, phase: str) -> Path | None:
    """The finished phase's trial table, if the phase is finished."""
    path = folder.trials(phase)
    return path if state is not None and state.done(phase) and path.exists() else None


def _float(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _count(rows: list[dict[str, Any]], status: str, planned: int | None) -> PhaseProgress:
    count = {s: sum(1 for r in rows if r["status"] == s) for s in (*STATUSES, TrialStatus.RUNNING)}
    losses = [x for r in rows if r["status"] == TrialStatus.COMPLETED and (x := _float(r.get("eval_loss"))) is not None]
    S = TrialStatus
    return PhaseProgress(status=status, planned=planned, done=count[S.COMPLETED] + count[S.STOPPED],
                         running=count[S.RUNNING], failed=count[S.FAILED], diverged=count[S.DIVERGED],
                         best_eval_loss=min(losses) if losses else None)


def phase_progress(folder: StudyFolder, spec: dict[str, Any], state: StudyState | None, planned: dict[str, int],
                   live: list[dict[str, Any]]) -> dict[str, PhaseProgress]:
    """Per phase: finished ones from their CSV, the others from their live MLflow trial runs."""
    out = {}
    for phase in spec_phases(spec):
        if table := _done(state, folder, phase):
            with open(table, newline="") as f:
                rows = list(csv.DictReader(f))
            out[phase] = _count(rows, PhaseStatus.DONE, planned.get(phase, len(rows)))
        else:
            rows = [r for r in live if r["phase"] == phase]
            out[phase] = _count(rows, PhaseStatus.RUNNING if rows or phase in planned else PhaseStatus.PENDING,
                                 planned.get(phase))
    return out


def trial_table(folder: StudyFolder, spec: dict[str, Any], state: StudyState | None,
                live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Finished phases' rows (their CSVs) and the other phases' live rows, each with its MLflow run id."""
    import pandas as pd  # only here: the trial table needs typed columns

    runs = {r["trial_id"]: r["mlflow_run_id"] for r in live}
    rows: list[dict[str, Any]] = []
    for phase in spec_phases(spec):
        if table := _done(state, folder, phase):
            rows += [{**r, "mlflow_run_id": runs.get(r["trial_id"])}
                     for r in pd.read_csv(table).to_dict(orient="records")]
        else:
            rows += [r for r in live if r["phase"] == phase]
    return [finite(r) for r in rows]


def _row(run: Run) -> dict[str, Any]:
    """One MLflow trial run as a trial-table row."""
    tags, metrics = run.data.tags, run.data.metrics
    def as_int(v: str | None) -> int | None:
        return int(v) if isinstance(v, str) and v.lstrip("-").isdigit() else None
    return {"trial_id": tags.get("trial_key"), "phase": tags.get("phase"),
            "status": tags.get("status", TrialStatus.RUNNING.value),
            "width": as_int(tags.get("width")), "seed": as_int(tags.get("seed")),
            "eval_loss": metrics.get("eval_loss"), "lr": _float(run.data.params.get("lr")),
            "mlflow_run_id": run.info.run_id}


class MlflowView:
    """MLflow look-ups for the API through `workers.mlflow_tracker.Tracker` (one per experiment, cached)."""

    def __init__(self, default_uri: str, ttl: float = 2.0) -> None:
        self.default_uri, self.ttl = default_uri, ttl
        self._trackers: dict[tuple[str, str], Tracker] = {}
        self._live: dict[str, tuple[float, list[dict[str, Any]]]] = {}  # study id → (fetched at, rows)
        self._refreshing: set[str] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ptctl-mlflow")

    def uri(self, spec: dict[str, Any]) -> str:
        return spec["resources"]["tracking"]["tracking_uri"] or self.default_uri

    @staticmethod
    def experiment(spec: dict[str, Any]) -> str:
        return cast(str, spec["resources"]["tracking"]["experiment"] or spec["name"])

    def tracker(self, spec: dict[str, Any]) -> Tracker:
        """The study's Tracker; only once the driver made the experiment (a Tracker creates a missing one)."""
        from workers.mlflow_tracker import Tracker

        key = (self.experiment(spec), self.uri(spec))
        with self._lock:
            if key not in self._trackers:
                self._trackers[key] = Tracker(*key)
            return self._trackers[key]

    def info(self, spec: dict[str, Any], state: StudyState | None) -> MlflowInfo:
        runs = state.runs if state else {}
        info = MlflowInfo(tracking_uri=redact_uri(self.uri(spec)), experiment=self.experiment(spec), runs=runs)
        if "study" in runs:
            tracker = self.tracker(spec)
            info.experiment_id = tracker.experiment_id
            info.links = {k: redact_uri(tracker.link(v)) for k, v in runs.items()}
        return info

    def _fetch(self, spec: dict[str, Any], study_id: str, instance: str | None = None) -> list[dict[str, Any]]:
        rows = [_row(r) for r in self.tracker(spec).runs(study_id, "trial", instance)]
        with self._lock:
            self._live[study_id] = (time.monotonic(), rows)
            self._refreshing.discard(study_id)
        return rows

    def _refresh(self, spec: dict[str, Any], study_id: str, instance: str | None = None) -> None:
        try:
            self._fetch(spec, study_id, instance)
        except Exception:  # MLflow briefly unreachable: keep the old rows, try again on a later read
            with self._lock:
                self._refreshing.discard(study_id)

    def live(self, spec: dict[str, Any], study_id: str, state: StudyState | None,
             fresh: bool = False) -> list[dict[str, Any]]:
        """The study's MLflow trial runs as rows, at most about `ttl` s old, or asked now if `fresh`
        ([] before the driver logged anything)."""
        if state is None or "study" not in state.runs:
            return []
        instance = state.instance  # only the runs this study instance made (workers/driver.py)
        if fresh:
            return self._fetch(spec, study_id, instance)
        with self._lock:
            cached = self._live.get(study_id)
            stale = cached is not None and time.monotonic() - cached[0] > self.ttl
            if stale and study_id not in self._refreshing:
                self._refreshing.add(study_id)
                self._pool.submit(self._refresh, spec, study_id, instance)
        return cached[1] if cached is not None else self._fetch(spec, study_id, instance)

    def mark_cancelled(self, spec: dict[str, Any], study_id: str, instance: str | None = None) -> None:
        """Close the runs a killed driver (of study `instance`) left open: KILLED, trials and the study tagged
        `status=cancelled`."""
        tracker = self.tracker(spec)
        for kind in ("trial", "phase", "study"):
            for run in tracker.runs(study_id, kind, instance=instance):
                if run.info.status != "RUNNING":
                    continue
                if kind != "phase":
                    tracker.set_tags(run.info.run_id, {"status": "cancelled"})
                tracker.finish(run.info.run_id, "KILLED")
        with self._lock:
            self._live.pop(study_id, None)
