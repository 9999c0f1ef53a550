"""MLflow: the one module that imports it.

One experiment per study name; a study run, a child run per phase and a grandchild per trial (tag `kind`, nested
by `mlflow.parentRunId`), each found-or-created by its tags so a resumed study never makes a second run. The
`study_instance` tag (a random id in `state.json`) keeps two studies with one id, run from two data directories
against one server, off each other's runs. Only the study driver's process writes (SQLite allows one writer).

Links (`runs_link`, a run's `link`) point at an MLflow UI (`ui_address`), never at the store's URI, which no
browser opens. An unreachable server delays logging (`_Retrying`, up to `PTCTL_MLFLOW_RETRY_S`), then fails with
`TrackingUnavailable`. Artifacts, the saved view and the retries: docs/results.md, docs/studies.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import requests
from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException

from workers.paths import data_dir
from workers.tracker import RunTracker

log = logging.getLogger(__name__)
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # its notes on a new store's tables
VIEW_ATTEMPTS = 8  # writes of the saved view before giving up (`Tracker.save_view`)
VIEW_SETTLE_S = 0.5  # how long a written view must keep its columns before `save_view` trusts it
PARENT = "mlflow.parentRunId"
INSTANCE = "study_instance"  # tag: the study instance (state.json's `instance`) that created the run
REOPENED = ("KILLED", "FAILED")  # run statuses a resumed study sets back to RUNNING
MAX_PARAM = 6000  # MLflow's limit on a param value
KIND_TAG = "mlflow.experimentKind"  # the UI's view of an experiment: custom_model_development = the ML runs table
NOTE = "mlflow.note.content"  # a run's description in the UI
VIEW_TAG = "mlflow.sharedViewState."  # + a view id: an experiment tag holding a saved view of the UI's runs table
VIEW_ID = "ptctl-verdicts"  # the saved view ptctl keeps on each experiment, named `verdicts` in the UI's Views menu
RUN_NAME, DESCRIPTION = "attributes.`Run Name`", "attributes.`Description`"  # two of the runs table's columns
UI_QUERY = "workflowType=machine_learning"  # the UI's model-training mode (its default, GenAI, files runs as evals)
UI_ADDRESS = "http://127.0.0.1:5000"  # default of PTCTL_MLFLOW_UI: where `mlflow ui` serves a store by default
RETRY_S = 300.0  # default of PTCTL_MLFLOW_RETRY_S: how long a call waits for an unreachable tracking server
for _name, _value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                      ("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")):
    os.environ.setdefault(_name, _value)  # short inner retries: `_Retrying`'s budget is the one that counts


TRANSIENT_CODES = ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "RESOURCE_EXHAUSTED")


class TrackingUnavailable(RuntimeError):
    """The tracking server stayed unreachable past `PTCTL_MLFLOW_RETRY_S`."""


def _transient(exc: BaseException) -> bool:
    """A failure worth waiting out: the server unreachable, timing out, restarting (502/503/504) or throttling."""
    if isinstance(exc, MlflowException) and (  # mlflow leaves get_http_status_code unannotated
            exc.get_http_status_code() in (429, 502, 503, 504)  # type: ignore[no-untyped-call]
            or exc.error_code in TRANSIENT_CODES):
        return True
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _cause(exc: BaseException) -> str:
    """The gist of a client failure: the OS error (`[Errno 111] Connection refused`) if there is one."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\][^'\")]*", text)
    return found.group(0).strip() if found else text.splitlines()[0][:300] if text else type(exc).__name__


class _Retrying:
    """An MlflowClient whose calls wait out a transient outage with bounded exponential backoff."""

    def __init__(self, client: MlflowClient, uri: str, budget_s: float | None = None) -> None:
        self._client, self._uri, self._budget_s = client, uri, budget_s

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        return self._wrap(name, attr) if callable(attr) else attr

    def _wrap(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def retried(*args: Any, **kwargs: Any) -> Any:
            budget = self._budget_s if self._budget_s is not None else float(
                os.environ.get("PTCTL_MLFLOW_RETRY_S") or RETRY_S)
            start, delay = time.monotonic(), 0.5
            while True:
                try:
                    return call(*args, **kwargs)
                except Exception as exc:
                    waited = time.monotonic() - start
                    if not _transient(exc):
                        raise
                    if waited + delay > budget:
                        raise TrackingUnavailable(
                            f"MLflow tracking server {self._uri} unreachable for {waited:.0f} s ({name}): "
                            f"{_cause(exc)}; check that it is up, or raise PTCTL_MLFLOW_RETRY_S "
                            f"(now {budget:g} s)") from exc
                    log.warning("MLflow %s at %s failed (%s); retrying in %.1f s", name, self._uri, _cause(exc), delay)
                    time.sleep(delay)
                    delay = min(2 * delay, 10.0)
        return retried


def default_tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI` if set, else SQLite in the data directory (MLflow ≥3.13 refuses ./mlruns)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{data_dir() / 'mlflow.db'}"


def artifact_root() -> Path:
    """Where experiments created on a database store keep their artifacts."""
    return Path(os.environ.get("PTCTL_ARTIFACT_ROOT") or data_dir() / "mlartifacts").expanduser().absolute()


def _is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://", "databricks"))


def _is_http(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))


def ui_address(tracking_uri: str) -> str:
    """The MLflow UI that shows `tracking_uri`'s runs, no trailing slash: an http(s) tracking server itself (less
    any user:password, which a link must not carry), else `$PTCTL_MLFLOW_UI`, else `UI_ADDRESS`."""
    if _is_http(tracking_uri):
        scheme, rest = tracking_uri.split("://", 1)
        host, slash, path = rest.partition("/")
        return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}".rstrip("/")
    configured = (os.environ.get("PTCTL_MLFLOW_UI") or "").strip()
    if configured and not _is_http(configured):
        log.warning("PTCTL_MLFLOW_UI=%r is not an http(s) address: links point at %s; set it to the MLflow UI's "
                    "URL, e.g. http://mlflow.example.org", configured, UI_ADDRESS)
        configured = ""
    return (configured or UI_ADDRESS).rstrip("/")


def prepare_store(tracking_uri: str | None = None) -> str:
    """Create and migrate the tracking store now (a database store: its schema), so that studies
    started together do not race to do it; returns the URI."""
    uri = tracking_uri or default_tracking_uri()
    MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    return uri


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


class Tracker(RunTracker):
    """Find-or-create runs of one study's experiment and log to them (`workers.tracker.RunTracker` on MLflow)."""

    def __init__(self, experiment: str, tracking_uri: str | None = None, retry_s: float | None = None) -> None:
        """`retry_s`: how long a call waits out an unreachable server (None: PTCTL_MLFLOW_RETRY_S, else RETRY_S)."""
        self.uri = tracking_uri or default_tracking_uri()
        client = _Retrying(MlflowClient(tracking_uri=self.uri), self.uri, retry_s)  # its calls, retried
        self.client = cast(MlflowClient, client)
        self.experiment_id = self._experiment(experiment)

    def _experiment(self, name: str) -> str:
        """The experiment's id, created if needed (two drivers creating it at once: one wins, both use it)."""
        found = self.client.get_experiment_by_name(name)
        if found:
            return found.experiment_id
        location = None if _is_server(self.uri) else (artifact_root() / name).as_uri()
        try:  # a model-training experiment: the UI opens on its runs table, not the GenAI view
            return self.client.create_experiment(name, artifact_location=location,
                                                 tags={KIND_TAG: "custom_model_development"})
        except MlflowException:
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def save_view(self, columns: Iterable[str], name: str = "verdicts") -> None:
        """Save the runs-table view `name` on the experiment (the UI's Views menu; `runs_link` opens it): `columns`
        are the UI's column keys, shown in that order after the run's name and start time (the description last).

        The view is one experiment tag, `VIEW_TAG + VIEW_ID`, in the envelope MLflow 3.17's UI writes (`{name,
        createdAt, updatedAt, state}`). Columns already there stay, after the new ones (a study saves the view after
        each phase, and studies of one experiment differ). Studies that start together race on the tag (read, merge,
        write): each rewrites until its columns are in, and a view that still cannot be saved is a warning, never a
        failed study."""
        wanted = set(columns)
        for attempt in range(VIEW_ATTEMPTS):
            try:
                if wanted <= set(self._write_view(list(dict.fromkeys(columns)), name)):
                    time.sleep(VIEW_SETTLE_S)  # a writer that read the view before this write may still replace it
                    if wanted <= set(self._view_columns()):
                        return
            except MlflowException as exc:  # a concurrent first write of the tag won
                log.debug("saving the runs-table view %r lost a race (%s); trying again", VIEW_ID, _cause(exc))
            time.sleep(0.1 * (attempt + 1))
        log.warning("could not save the runs-table view %r on experiment %s: the runs are logged, and the MLflow UI "
                    "shows its default columns", VIEW_ID, self.experiment_id)

    def _write_view(self, wanted: list[str], name: str) -> list[str]:
        """Merge `wanted` into the saved view and write it; the columns the view holds afterwards, re-read."""
        key, now = VIEW_TAG + VIEW_ID, int(time.time() * 1000)
        created, selected = now, wanted
        old = self.client.get_experiment(self.experiment_id).tags.get(key)
        if old:
            try:
                envelope = json.loads(old)
                created = int(envelope["createdAt"])
                selected = list(dict.fromkeys([*wanted, *json.loads(envelope["state"])["selectedColumns"]]))
            except (ValueError, KeyError, TypeError):
                log.warning("the experiment's saved view %r is not one ptctl can read; replacing it", VIEW_ID)
        last = [c for c in selected if c == DESCRIPTION]
        order = [RUN_NAME, "runDateAndNestInfo", *(c for c in selected if c != DESCRIPTION), "duration", *last]
        state = json.dumps({"selectedColumns": selected, "columnOrder": order, "columnWidths": {RUN_NAME: 230}})
        self.client.set_experiment_tag(self.experiment_id, key, json.dumps(
            {"name": name, "createdAt": created, "updatedAt": now, "state": state}))
        return self._view_columns()

    def _view_columns(self) -> list[str]:
        """The columns of the saved view as the store holds it now (none if there is no view)."""
        saved = self.client.get_experiment(self.experiment_id).tags.get(VIEW_TAG + VIEW_ID, "{}")
        return list(json.loads(json.loads(saved).get("state", "{}")).get("selectedColumns", []))

    # ---------------------------------------------------------------- runs
    def _find(self, tags: dict[str, str]) -> Run | None:
        query = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=2)
        if len(runs) > 1:
            log.warning("more than one MLflow run matches %s; using the first", tags)
        return runs[0] if runs else None

    def run(self, name: str, key_tags: dict[str, str], parent: str | None = None,
            tags: dict[str, str] | None = None) -> str:
        """The run with `key_tags`, created (nested under `parent`) if it does not exist yet. A found run that an
        interruption ended (KILLED, FAILED) is reopened: the resumed study writes to it again."""
        found = self._find(key_tags)
        if found is None:
            all_tags = {**key_tags, **(tags or {}), **({PARENT: parent} if parent else {})}
            created: str = self.client.create_run(self.experiment_id, tags=all_tags, run_name=name).info.run_id
            return created
        run_id: str = found.info.run_id
        if found.info.status in REOPENED:
            self.client.update_run(run_id, status="RUNNING")
        if tags:
            self.set_tags(run_id, tags)
        return run_id

    def study_run(self, study_id: str, tags: dict[str, str], instance: str | None = None) -> str:
        return self.run(study_id, _key(study_id, "study", instance), tags=tags)

    def phase_run(self, study_id: str, phase: str, parent: str, instance: str | None = None) -> str:
        return self.run(phase, _key(study_id, "phase", instance, phase=phase), parent)

    def trial_run(self, study_id: str, phase: str, trial_key: str, parent: str, tags: dict[str, str],
                  instance: str | None = None, name: str | None = None) -> str:
        return self.run(name or trial_key, _key(study_id, "trial", instance, trial_key=trial_key), parent,
                        {"phase": phase, **tags})

    def runs(self, study_id: str, kind: str, instance: str | None = None) -> list[Any]:
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

    def reopen(self, run_id: str) -> None:
        """A run an interruption ended (KILLED, FAILED) is RUNNING again: the resumed study writes to it."""
        if self.client.get_run(run_id).info.status in REOPENED:
            self.client.update_run(run_id, status="RUNNING")

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

    def log_verdict(self, run_id: str, params: dict[str, Any], metrics: list[dict[str, Any]], tags: dict[str, Any],
                    description: str | None = None) -> None:
        """A verdict (`workers.verdicts.Verdict`'s fields): params once, metric rows, tags, and the run's
        description (`mlflow.note.content`) when given."""
        self.log_params(run_id, params)
        self.log_metrics(run_id, metrics)
        self.set_tags(run_id, {**tags, **({NOTE: description} if description else {})})

    def log_table(self, run_id: str, table: Any, artifact_file: str) -> None:
        """A trial table as an MLflow table artifact (the UI's artifact view and `mlflow.load_table`)."""
        self.client.log_table(run_id, table.astype(object).where(table.notna(), None), artifact_file)

    def log_dataset(self, run_id: str, name: str, digest: str, source: str, source_type: str = "local",
                    context: str = "training") -> None:
        """The run's dataset as an MLflow input (the runs table's Dataset column)."""
        dataset = Dataset(name=name, digest=digest, source_type=source_type, source=source)
        self.client.log_inputs(run_id, [DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])])

    def last_step(self, run_id: str, key: str) -> int:
        """The highest step of metric `key` the run holds (0: none), so a restarted trial logs only later steps."""
        return max((m.step for m in self.client.get_metric_history(run_id, key)), default=0)

    def log_artifacts(self, run_id: str, paths: Iterable[Path], artifact_path: str | None = None) -> None:
        for path in paths:
            self.client.log_artifact(run_id, str(path), artifact_path)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        """`status`: FINISHED, FAILED or KILLED."""
        self.client.set_terminated(run_id, status)

    def runs_link(self) -> str:
        """The experiment's runs table in the MLflow UI (`ui_address`, its model-training mode), opened on the saved
        view `verdicts` when the experiment has it; on a store no UI address was configured for, followed by the
        command that serves it there."""
        view = VIEW_TAG + VIEW_ID in self.client.get_experiment(self.experiment_id).tags
        path = f"#/experiments/{self.experiment_id}/runs?{UI_QUERY}" + (f"&viewStateShareKey={VIEW_ID}" if view else "")
        ui = ui_address(self.uri)
        link = f"{ui}/{path}"
        if _is_http(self.uri) or ui != UI_ADDRESS:  # a server, or a UI the operator runs: nothing to start
            return link
        return f"{link} (after `mlflow ui --backend-store-uri {self.uri}`)"

    def link(self, run_id: str) -> str:
        """The run's page in the MLflow UI (`ui_address`): an http(s) URL a browser opens."""
        return f"{ui_address(self.uri)}/#/experiments/{self.experiment_id}/runs/{run_id}?{UI_QUERY}"
