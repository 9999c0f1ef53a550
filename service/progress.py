"""What a study has done so far: finished phases from its folder, the running phase from MLflow.

- the study folder's `state.json` (`workers.folder.StudyFolder`, written by `workers/driver.py`): finished
  phases with their results, and the MLflow run ids of the study and of each phase;
- a finished phase's trial table (`StudyFolder.trials`), authoritative once it exists;
- the running phase: its MLflow trial runs (tags `phase`, `status` = running | completed | stopped |
  diverged | failed, `trial_key`; metric `eval_loss`), written live by the driver's Tune callback.
  Ray Tune's own result files are no use here: Tune stages them on the driver's node and copies them
  into the study folder only at its experiment checkpoints.

An MLflow search takes 30–50 ms, too slow for every `GET /studies/{id}`: `MlflowView.observe` keeps each
study's trial runs in memory and refreshes them in the background once they are older than `ttl`
seconds (stale-while-revalidate), so a read waits for MLflow only the first time it sees a study, and then at most
`WAIT_S`: a server that is down or slow never holds a read (it answers from the store and `state.json`, and says
that live progress is unavailable), and for `DOWN_S` after such a look-up reads do not wait for it at all.
"""

from __future__ import annotations

import csv
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
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


WAIT_S = 2.0  # how long a read waits for MLflow
DOWN_S = 15.0  # after a look-up that failed or was slow, how long reads do not wait for that tracking server


@dataclass(frozen=True)
class _Seen:
    """A study's last MLflow look-up: when, its trial rows, its experiment id and its runs' links."""

    at: float
    rows: list[dict[str, Any]]
    experiment_id: str
    links: dict[str, str]


class MlflowView:
    """MLflow look-ups for the API through `workers.mlflow_tracker.Tracker` (one per experiment, cached), never
    waited for longer than `wait_s` (module docstring)."""

    def __init__(self, default_uri: str, ttl: float = 2.0, wait_s: float = WAIT_S) -> None:
        self.default_uri, self.ttl, self.wait_s = default_uri, ttl, wait_s
        self._trackers: dict[tuple[str, str, float | None], Tracker] = {}
        self._seen: dict[str, _Seen] = {}  # study id → its last look-up
        self._pending: dict[str, Future[_Seen]] = {}  # study id → its look-up under way
        self._down_until: dict[str, float] = {}  # tracking URI → until when reads do not wait for it
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ptctl-mlflow")

    def uri(self, spec: dict[str, Any]) -> str:
        return spec["resources"]["tracking"]["tracking_uri"] or self.default_uri

    @staticmethod
    def experiment(spec: dict[str, Any]) -> str:
        return cast(str, spec["resources"]["tracking"]["experiment"] or spec["name"])

    def tracker(self, spec: dict[str, Any], retry_s: float | None = None) -> Tracker:
        """The study's Tracker; only once the driver made the experiment (a Tracker creates a missing one).
        `retry_s`: how long its calls wait out an unreachable server (None: PTCTL_MLFLOW_RETRY_S)."""
        from workers.mlflow_tracker import Tracker

        key = (self.experiment(spec), self.uri(spec), retry_s)
        with self._lock:
            found = self._trackers.get(key)
        if found is None:  # made outside the lock: it asks MLflow for the experiment
            made = Tracker(key[0], key[1], retry_s=retry_s)
            with self._lock:
                found = self._trackers.setdefault(key, made)
        return found

    def observe(self, spec: dict[str, Any], study_id: str, state: StudyState | None,
                fresh: bool = False) -> tuple[list[dict[str, Any]], MlflowInfo]:
        """The study's MLflow trial runs as rows (at most about `ttl` s old, or asked now if `fresh`; [] before the
        driver logged anything) and its MLflow ids and links. Waits for MLflow at most `wait_s`, and not at all
        for `DOWN_S` after it failed or was slow: then the rows last seen and `detail` saying why live progress
        is unavailable."""
        runs = state.runs if state else {}
        info = MlflowInfo(tracking_uri=redact_uri(self.uri(spec)), experiment=self.experiment(spec), runs=runs)
        if state is None or "study" not in runs:
            return [], info
        uri, now = self.uri(spec), time.monotonic()
        with self._lock:
            seen = self._seen.get(study_id)
            current = seen is not None and now - seen.at <= self.ttl
            future = self._pending.get(study_id)
            if future is None and not (current and not fresh):
                future = self._pending[study_id] = self._pool.submit(self._look, spec, study_id, state)
            down = now < self._down_until.get(uri, 0.0)
        if seen is not None and not fresh and not down:  # stale-while-revalidate: refreshed in the background
            return seen.rows, info.model_copy(update={"experiment_id": seen.experiment_id, "links": seen.links})
        assert future is not None
        try:
            seen = future.result(timeout=0 if down else self.wait_s)
        except Exception as exc:  # a read does not wait for MLflow: it says so
            with self._lock:
                self._down_until[uri] = max(self._down_until.get(uri, 0.0), time.monotonic() + DOWN_S)
                last = self._seen.get(study_id)
            why = (f"unreachable ({type(exc).__name__})" if not isinstance(exc, TimeoutError)
                   else "was not answering" if down else f"did not answer within {self.wait_s:g} s")
            detail = f"MLflow {why}: live progress unavailable (what is shown comes from the study's own record)"
            return (last.rows if last else []), info.model_copy(update={"detail": detail})
        return seen.rows, info.model_copy(update={"experiment_id": seen.experiment_id, "links": seen.links})

    def _look(self, spec: dict[str, Any], study_id: str, state: StudyState) -> _Seen:
        """Ask MLflow for the study's trial runs and its links (on the pool; one at a time per study)."""
        try:
            tracker = self.tracker(spec, retry_s=0)  # a read fails fast: the next one asks again
            rows = [_row(r) for r in tracker.runs(study_id, "trial", state.instance)]
            links = {k: redact_uri(tracker.link(v)) for k, v in state.runs.items()}
            seen = _Seen(time.monotonic(), rows, tracker.experiment_id, links)
            with self._lock:
                self._seen[study_id] = seen
                self._down_until.pop(self.uri(spec), None)
            return seen
        except Exception:
            with self._lock:
                self._down_until[self.uri(spec)] = time.monotonic() + DOWN_S
            raise
        finally:
            with self._lock:
                self._pending.pop(study_id, None)

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
            self._seen.pop(study_id, None)
