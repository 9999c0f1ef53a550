"""MLflow: the one module that imports it.

Hierarchy (design.md): one experiment per study name; a study run (tag kind=study), a child run per
phase (kind=phase), a grandchild per trial (kind=trial), nested with `mlflow.parentRunId`.
Every run is found-or-created by its tags, so a resumed study never makes a second run for the
same study, phase or trial. The key tags include `study_instance`, a random id the driver mints when
it creates a study's `state.json`: the study id (name + spec hash on the CLI) is the same for the same
spec run from two data directories against one tracking server, the instance is not, so a study
finds, reuses and prunes only the runs it created. Only the study driver's process writes (SQLite
allows one writer).
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from workers.paths import data_dir

log = logging.getLogger(__name__)
PARENT = "mlflow.parentRunId"
INSTANCE = "study_instance"  # tag: the study instance (state.json's `instance`) that created the run
MAX_PARAM = 6000  # MLflow's limit on a param value


def default_tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI` if set, else SQLite in the data directory (MLflow ≥3.13 refuses ./mlruns)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{data_dir() / 'mlflow.db'}"


def redact_uri(uri: str) -> str:
    """`scheme://user:password@host/...` → `scheme://***@host/...` (for messages and state.json)."""
    return re.sub(r"^([a-zA-Z][\w+.-]*://)[^/@]*@", r"\1***@", uri)


def _key(study_id: str, kind: str, instance: str | None, **more: str) -> dict[str, str]:
    """The tags that identify a run; `instance` None: any instance (studies from before instance ids)."""
    return {"study_id": study_id, "kind": kind, **({INSTANCE: instance} if instance else {}), **more}


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config → dotted MLflow params (`model_hp.width` = "64")."""
    out: dict[str, str] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = str(value)[:MAX_PARAM]
    return out


class Tracker:
    """Find-or-create runs of one study's experiment and log to them."""

    def __init__(self, experiment: str, tracking_uri: str | None = None) -> None:
        self.uri = tracking_uri or default_tracking_uri()
        self.client = MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)

    # ---------------------------------------------------------------- runs
    def _find(self, tags: dict[str, str]) -> str | None:
        query = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=2)
        if len(runs) > 1:
            log.warning("more than one MLflow run matches %s; using the first", tags)
        return runs[0].info.run_id if runs else None

    def run(self, name: str, key_tags: dict[str, str], parent: str | None = None,
            tags: dict[str, str] | None = None) -> str:
        """The run with `key_tags`, created (nested under `parent`) if it does not exist yet."""
        run_id = self._find(key_tags)
        if run_id is None:
            all_tags = {**key_tags, **(tags or {}), **({PARENT: parent} if parent else {})}
            run_id = self.client.create_run(self.experiment_id, tags=all_tags, run_name=name).info.run_id
        elif tags:
            self.set_tags(run_id, tags)
        return run_id

    def study_run(self, study_id: str, tags: dict[str, str], instance: str | None = None) -> str:
        return self.run(study_id, _key(study_id, "study", instance), tags=tags)

    def phase_run(self, study_id: str, phase: str, parent: str, instance: str | None = None) -> str:
        return self.run(phase, _key(study_id, "phase", instance, phase=phase), parent)

    def trial_run(self, study_id: str, phase: str, trial_key: str, parent: str, tags: dict[str, str],
                  instance: str | None = None) -> str:
        return self.run(trial_key, _key(study_id, "trial", instance, trial_key=trial_key), parent,
                        {"phase": phase, **tags})

    def runs(self, study_id: str, kind: str, instance: str | None = None) -> list:
        """The study's live runs of `kind` (`instance` given: only those that instance created)."""
        query = " and ".join(f"tags.{k} = '{v}'" for k, v in _key(study_id, kind, instance).items())
        return list(self.client.search_runs([self.experiment_id], filter_string=query, max_results=5000))

    def owns(self, run_id: str, study_id: str, instance: str | None) -> bool:
        """True if this store holds `run_id`, live, as a run of this study instance."""
        try:
            run = self.client.get_run(run_id)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST" or "not found" in str(exc).lower():
                return False
            raise
        tags = run.data.tags
        return (run.info.lifecycle_stage == "active" and tags.get("study_id") == study_id
                and (instance is None or tags.get(INSTANCE) == instance))

    def close(self, run_id: str, status: str, tags: dict[str, Any]) -> None:
        """Tag a run (e.g. `status`, `error`) and end it with MLflow `status` (FAILED, KILLED) if still open."""
        self.set_tags(run_id, tags)
        if self.client.get_run(run_id).info.status in ("RUNNING", "SCHEDULED"):
            self.finish(run_id, status)

    def prune_trials(self, study_id: str, phase: str, keep: set[str], stage: str | None = None,
                     instance: str | None = None) -> list[str]:
        """Close and soft-delete this instance's trial runs of `phase` (and `stage` tag) whose trial is not in
        `keep` (its trial table).

        A driver killed mid-phase leaves runs of trials that Tune had started but not yet
        checkpointed; the restored experiment runs them again under new trial ids. Their runs are
        tagged `status=abandoned`, ended KILLED and deleted (MLflow keeps them in its deleted view).
        Runs of another instance of the same study id are never touched.
        """
        pruned = []
        for run in self.runs(study_id, "trial", instance):
            tags = run.data.tags
            if tags.get("phase") == phase and tags.get("stage") == stage and tags.get("trial_key") not in keep:
                self.set_tags(run.info.run_id, {"status": "abandoned"})
                if run.info.status in ("RUNNING", "SCHEDULED"):
                    self.finish(run.info.run_id, "KILLED")
                self.client.delete_run(run.info.run_id)
                pruned.append(tags.get("trial_key"))
        if pruned:
            log.info("%s/%s: deleted %d abandoned trial runs %s", study_id, phase, len(pruned), pruned)
        return pruned

    # ---------------------------------------------------------------- logging
    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        """Log params once: a resumed run keeps the values it has (MLflow params are immutable)."""
        have = self.client.get_run(run_id).data.params
        new = [Param(k, v) for k, v in flatten(params).items() if k not in have]
        for i in range(0, len(new), 100):
            self.client.log_batch(run_id, params=new[i:i + 100])

    def log_metrics(self, run_id: str, rows: Iterable[dict[str, Any]]) -> None:
        """Rows with a `step` and numeric values; non-finite values are skipped (tags say why)."""
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, int(row["step"])) for row in rows for k, v in row.items()
                   if k != "step" and isinstance(v, int | float) and math.isfinite(float(v))]
        for i in range(0, len(metrics), 500):
            self.client.log_batch(run_id, metrics=metrics[i:i + 500])

    def log_artifacts(self, run_id: str, paths: Iterable[Path], artifact_path: str | None = None) -> None:
        for path in paths:
            self.client.log_artifact(run_id, str(path), artifact_path)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        """`status`: FINISHED, FAILED or KILLED."""
        self.client.set_terminated(run_id, status)

    def link(self, run_id: str) -> str:
        """Where the run lives (the MLflow UI shows it under this experiment and run id)."""
        return f"{self.uri}#/experiments/{self.experiment_id}/runs/{run_id}"
