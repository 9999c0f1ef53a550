"""What a study has done so far, read from its folder and from MLflow (never from Ray).

The study folder is written by `workers/driver.py` (`<data dir>/studies/<id>/`):
- `state.json`: finished phases with their results, and the MLflow run ids of the study and phases;
- `artifacts/<phase>_trials.csv`: a finished phase's trial table (authoritative once it exists);
- `ray/<phase>/<trial dir>/`: the running phase's Ray Tune trials: `params.json` (the config),
  `result.json` (one JSON line per report; the last has `done: true` when the trial ended, and a
  `status` unless ASHA stopped it early), `error.txt` if it raised.

Counting from these files keeps `GET /studies/{id}` to local file reads (no MLflow round trip,
which the latency target of the benchmark would not survive); MLflow is asked once per experiment
for its id, and by `trials` for the run id of each trial.
"""

from __future__ import annotations

import csv
import json
import math
import re
import threading
from pathlib import Path
from typing import Any

from service.schemas import MlflowInfo, PhaseProgress, finite

FINISHED = ("completed", "stopped", "diverged", "failed")


def redact_uri(uri: str) -> str:
    """`scheme://user:password@host/...` → `scheme://***@host/...`."""
    return re.sub(r"^([a-zA-Z][\w+.-]*://)[^/@]*@", r"\1***@", uri)


def read_state(folder: Path) -> dict[str, Any]:
    path = folder / "state.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # not started yet, or caught mid-write elsewhere
        return {}


def _last_line(path: Path) -> dict[str, Any] | None:
    try:
        lines = path.read_bytes().rstrip().rsplit(b"\n", 1)
        return json.loads(lines[-1]) if lines[-1] else None
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def trial_key(config: dict[str, Any], trial_id: str) -> str:
    """A Tune trial's key: the planned trial's (grid phases) or `tune-<id>` (the rule of ray_runner.planned_trial)."""
    planned = config.get("trial")
    return planned["trial_key"] if isinstance(planned, dict) else f"tune-{trial_id}"


def live_trials(folder: Path, phase: str) -> list[dict[str, Any]]:
    """The running phase's trials from its Tune folder: key, status, eval loss, steps, hparams."""
    rows = []
    for params in sorted((folder / "ray" / phase).glob("*/params.json")):
        trial_dir = params.parent
        try:
            config = json.loads(params.read_text())
        except json.JSONDecodeError:
            continue
        last = _last_line(trial_dir / "result.json") or {}
        trial_id = last.get("trial_id") or trial_dir.name.split("_")[2]
        if (trial_dir / "error.txt").exists():
            status = "failed"
        elif last.get("done"):
            status = last.get("status") or "stopped"
        else:
            status = "running"
        planned = config.get("trial") if isinstance(config.get("trial"), dict) else {}
        rows.append({"trial_id": trial_key(config, trial_id), "phase": phase, "status": status,
                     "width": planned.get("width"), "seed": planned.get("seed"),
                     "eval_loss": last.get("eval_loss") if status in ("completed", "stopped") else None,
                     "steps": last.get("step", 0), **(planned.get("hparams") or config)})
    return rows


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _count(statuses_losses: list[tuple[str, float | None]], status: str, planned: int | None) -> PhaseProgress:
    count = {s: sum(1 for st, _ in statuses_losses if st == s) for s in (*FINISHED, "running")}
    losses = [x for st, x in statuses_losses if st == "completed" and x is not None and math.isfinite(x)]
    return PhaseProgress(status=status, planned=planned, done=count["completed"] + count["stopped"],
                         running=count["running"], failed=count["failed"], diverged=count["diverged"],
                         best_eval_loss=min(losses) if losses else None)


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def phase_progress(folder: Path, phases: list[str], state: dict[str, Any], planned: dict[str, int],
                   current: str | None) -> dict[str, PhaseProgress]:
    """Per phase: finished ones from their CSV, the current one from its Tune folder."""
    out = {}
    for phase in phases:
        csv_path = folder / "artifacts" / f"{phase}_trials.csv"
        if state.get("phases", {}).get(phase, {}).get("status") == "done" and csv_path.exists():
            rows = [(r["status"], _float(r["eval_loss"])) for r in _csv_rows(csv_path)]
            out[phase] = _count(rows, "done", planned.get(phase, len(rows)))
        elif phase == current or (folder / "ray" / phase).is_dir():
            rows = [(r["status"], r["eval_loss"]) for r in live_trials(folder, phase)]
            out[phase] = _count(rows, "running", planned.get(phase))
        else:
            out[phase] = PhaseProgress(status="pending", planned=planned.get(phase))
    return out


def trial_table(folder: Path, phases: list[str], state: dict[str, Any]) -> list[dict[str, Any]]:
    """Finished phases' rows (their CSVs) and the running phase's live rows, NaN as None."""
    import pandas as pd  # only here: the trial table needs typed columns

    rows: list[dict[str, Any]] = []
    for phase in phases:
        csv_path = folder / "artifacts" / f"{phase}_trials.csv"
        if state.get("phases", {}).get(phase, {}).get("status") == "done" and csv_path.exists():
            rows += pd.read_csv(csv_path).to_dict(orient="records")
        elif (folder / "ray" / phase).is_dir():
            rows += live_trials(folder, phase)
    return [finite(r) for r in rows]


class MlflowView:
    """MLflow look-ups for the API, through `workers.tracking.Tracker` (one per experiment, cached)."""

    def __init__(self, default_uri: str) -> None:
        self.default_uri = default_uri
        self._trackers: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def uri(self, spec: dict[str, Any]) -> str:
        return spec["resources"]["tracking"]["tracking_uri"] or self.default_uri

    @staticmethod
    def experiment(spec: dict[str, Any]) -> str:
        return spec["resources"]["tracking"]["experiment"] or spec["name"]

    def tracker(self, spec: dict[str, Any]):
        """The study's Tracker; only call once the driver made the experiment (Tracker creates missing ones)."""
        from workers.tracking import Tracker

        key = (self.experiment(spec), self.uri(spec))
        with self._lock:
            if key not in self._trackers:
                self._trackers[key] = Tracker(*key)
            return self._trackers[key]

    def info(self, spec: dict[str, Any], state: dict[str, Any]) -> MlflowInfo:
        runs = state.get("runs") or {}
        info = MlflowInfo(tracking_uri=redact_uri(self.uri(spec)), experiment=self.experiment(spec), runs=runs)
        if "study" in runs:
            tracker = self.tracker(spec)
            info.experiment_id = tracker.experiment_id
            info.links = {k: redact_uri(tracker.link(v)) for k, v in runs.items()}
        return info

    def trial_runs(self, spec: dict[str, Any], study_id: str) -> dict[str, str]:
        """trial key → MLflow run id."""
        return {r.data.tags.get("trial_key"): r.info.run_id for r in self.tracker(spec).runs(study_id, "trial")}

    def mark_cancelled(self, spec: dict[str, Any], study_id: str) -> None:
        """Close the runs a killed driver left open: KILLED, trials tagged `status=cancelled`."""
        tracker = self.tracker(spec)
        for kind in ("trial", "phase", "study"):
            for run in tracker.runs(study_id, kind):
                if run.info.status != "RUNNING":
                    continue
                if kind != "phase":
                    tracker.set_tags(run.info.run_id, {"status": "cancelled"})
                tracker.finish(run.info.run_id, "KILLED")
