"""The study driver: run a study's phases in order, persist what is done, resume after a crash.

A study lives in its `workers.folder.StudyFolder`: `state.json` (finished phases and their results, MLflow
run ids; rewritten atomically), `ray/` (one restorable experiment per phase), and `artifacts/` (spec, trial
tables, plots, certificate, report). Re-running a study id skips finished phases and restores an interrupted
one, so no finished trial runs twice and no MLflow run is made twice (runs are found by their tags).

Seams: `StudyDriver(spec, runner, tracker)`. The runner trains a phase's trials (`workers.runner.Runner`:
`workers.ray.experiment.RayRunner` by default, `workers.runner.InProcessRunner` without Ray); the tracker records
the study's MLflow runs (`workers.mlflow_tracker.Tracker` by default, `workers.tracker.NullTracker` for none).
Phases run in `phases_of(spec)` order through `StudyDriver.PHASES`.

Ownership: `state.json` records a random `instance` id, minted when it is first written, and the
(redacted) tracking URI; every MLflow run the study makes is tagged with the instance, and a resume
finds, reuses and prunes only runs of its own instance. A store that does not hold the study's run
(another `MLFLOW_TRACKING_URI`) stops the resume with an error naming both stores.

Failure: whatever ends a study early is recorded before it propagates, as one of `workers.errors`:
`state.json` gets `failed` (or `interrupted` when Ray was lost) with a one-line `error`, and the
study run, the running phase's run and its open trial runs are ended FAILED (KILLED when
interrupted) with tags `status` and `error`. A driver process that dies without a word (SIGKILL,
or Ray aborting it when its cluster's GCS is lost) cannot record anything: the next driver of the
study finds it `running` under a process that no longer exists, records that attempt `interrupted`
(closing its runs KILLED), then resumes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import render_report, report_html
from studies.cost import measured_cost
from studies.members import solo_note
from studies.phases import PHASES, Phase, PhaseFailed, PhaseStatus, StudyState, phases_of
from studies.phases.base import Context, Stage
from studies.plan import PlannedTrial
from studies.spec import StudySpec
from studies.status import StudyStatus
from workers.errors import ConfigError, InfrastructureLost, StudyError, StudyFailed, one_line
from workers.folder import PhaseIndex, StudyFolder, studies_dir, write_json
from workers.model_check import check_memory, check_study
from workers.paths import redact_uri
from workers.report import TrialReport
from workers.runner import PhaseJob, Runner, TrialRecorder, experiment_name
from workers.tracker import NullTracker, RunTracker, mlflow_installed
from workers.train import load_data
from workers.verdicts import provenance_tags, study_verdict, verdict_columns

log = logging.getLogger(__name__)
Event = Callable[[str, dict[str, Any]], None]
__all__ = ["StudyDriver", "StudyState", "default_study_id", "load_state", "phase_key", "run_study", "studies_dir"]


def default_study_id(spec: StudySpec) -> str:
    return f"{spec.name}-{spec.content_hash()[:10]}"


def phase_key(spec: StudySpec, phase: str) -> str:
    """What a reusable phase depends on (`Phase.reusable`): equal keys give equal results, so a finished phase of
    another study is reused (`ptctl transfer` to new widths reuses tune; `ptctl verify` reuses tune and transfer)."""
    d = spec.as_dict()
    part = {"phase": phase, **{k: d[k] for k in PHASES[phase].reusable}}
    return hashlib.sha256(json.dumps(part, sort_keys=True).encode()).hexdigest()[:16]


def load_state(path: Path, study_id: str, spec_hash: str) -> StudyState:
    """The study's `state.json`, or a new state with a fresh instance id; another spec's state is refused."""
    if not path.exists():
        return StudyState(study_id=study_id, spec_hash=spec_hash, instance=secrets.token_hex(8))
    state = StudyState.model_validate_json(path.read_text())
    if state.spec_hash != spec_hash:
        raise ConfigError(f"study {study_id} was started with another spec (hash {state.spec_hash[:10]}); "
                          "use a new study id or the original spec")
    return state


class _Written:
    """The study folder as a phase's `Artifacts`, remembering each file the phase names (logged to its run)."""

    def __init__(self, folder: StudyFolder) -> None:
        self.folder = folder
        self.paths: list[Path] = []

    def _keep(self, path: Path) -> Path:
        self.paths.append(path)
        return path

    def artifact(self, name: str) -> Path:
        return self._keep(self.folder.artifact(name))

    def figure(self, name: str) -> Path:
        return self._keep(self.folder.figure(name))

    def write_artifact(self, name: str, data: Any) -> Path:
        return self._keep(self.folder.write_artifact(name, data))


class StudyDriver:
    """Run one study's phases: `runner` trains trials (None: Ray Tune), `tracker` records runs (None: MLflow)."""

    def __init__(self, spec: StudySpec, runner: Runner | None = None, tracker: RunTracker | None = None,
                 *, study_id: str | None = None, on_event: Event | None = None) -> None:
        self.spec = spec
        self.study_id = study_id or default_study_id(spec)
        self.folder = StudyFolder(self.study_id).create()
        self.dir = self.folder.path
        self.state = load_state(self.folder.state_path, self.study_id, spec.content_hash())
        self.folder.spec.write_text(spec.to_yaml())
        self._runner = runner
        self._tracker = tracker
        self.uri = spec.resources.tracking.tracking_uri or (tracker.uri if tracker is not None else None)
        self.emit = on_event or (lambda kind, data: None)

    # ------------------------------------------------------------------ helpers
    def _save(self) -> None:
        write_json(self.folder.state_path, self.state.model_dump(mode="json"))

    @property
    def runner(self) -> Runner:
        if self._runner is None and self.spec.resources.runner == "local":
            from workers.runner import InProcessRunner

            self._runner = InProcessRunner()
        if self._runner is None:
            from workers.ray.experiment import RayRunner  # only here: the driver runs without Ray when given a runner

            self._runner = RayRunner()
        return self._runner

    @property
    def tracker(self) -> RunTracker:
        """The tracker; MLflow's when none was given, connected on first use (an unreachable store fails the study)."""
        if self._tracker is None and self.spec.resources.runner == "local" and not mlflow_installed():
            self.emit("note", {"error": "MLflow is not installed: this study records no MLflow runs (its folder has "
                                        "every result: the trial tables, the report, the certificate)"})
            self._tracker = NullTracker()  # type: ignore[abstract]  # its Protocol bodies are its behaviour
        if self._tracker is None:
            from workers.mlflow_tracker import Tracker, default_tracking_uri  # only here: MLflow is optional

            self.uri = self.uri or default_tracking_uri()
            try:
                self._tracker = Tracker(self.spec.experiment_name(), self.uri)
            except Exception as exc:
                raise StudyFailed(f"cannot reach the MLflow tracking store {redact_uri(self.uri)} ({one_line(exc)}); "
                                  "start it or set MLFLOW_TRACKING_URI, then re-run to resume") from exc
        return self._tracker

    def _check_store(self) -> None:
        """A resumed study's runs must be in the current store: else name both stores and stop."""
        tracker = self.tracker
        state, here = self.state, redact_uri(self.uri or tracker.uri)
        if "study" in state.runs and not tracker.owns(state.runs["study"], self.study_id, state.instance):
            self._tracker = None  # nothing of this study's to close in that store
            raise StudyFailed(
                f"the tracking store {here} does not hold this study's MLflow run {state.runs['study']}; its runs "
                f"are in {state.tracking_uri or '(a store not recorded in state.json)'}: set MLFLOW_TRACKING_URI "
                "(or resources.tracking.tracking_uri) to that store to resume, or start a new --study-id")
        state.tracking_uri = here

    def table(self, phase: str) -> pd.DataFrame:
        return pd.read_csv(self.folder.trials(phase))

    def _table_if_any(self, name: str) -> pd.DataFrame | None:
        return self.table(name) if self.folder.trials(name).exists() else None

    def context(self) -> Context:
        """What the phases plan and judge from."""
        return Context(self.spec, self.state, self._table_if_any, lambda: load_data(self.spec.data).vocab_size)

    def _phase_run(self, phase: str) -> str:
        if phase not in self.state.runs:
            self.state.runs[phase] = self.tracker.phase_run(self.study_id, phase, self.state.runs["study"],
                                                            self.state.instance)
            self._save()
        return self.state.runs[phase]

    def _job(self, spec: StudySpec, phase: str, planned: list[PlannedTrial] | None, experiment: str,
             tags: dict[str, Any] | None = None) -> PhaseJob:
        return PhaseJob(spec=spec, phase=phase, planned=planned, study_id=self.study_id, instance=self.state.instance,
                        phase_run=self._phase_run(tags["phase"] if tags else phase), tracker=self.tracker,
                        storage=self.folder.ray, experiment=experiment, tags=dict(tags or {}),
                        notify=lambda info: self.emit("trial_done", info))

    # ------------------------------------------------------------------ one phase
    def _run_phase(self, phase: Phase) -> None:
        """Run a phase's stages and trials (or reuse an identical finished phase), judge its table, record it."""
        ctx = self.context()
        for stage in phase.stages(ctx):
            phase.stage_done(ctx, stage, self._run_stage(phase.name, stage))
            self._save()
        table, source = self._trials_or_reuse(phase, ctx)
        out = _Written(self.folder)
        try:
            result = phase.judge(ctx, table, out)
        except PhaseFailed as exc:
            raise StudyFailed(str(exc)) from exc
        if phase.reusable:
            result = result.model_copy(update={"reused_from": source})
        run = self._phase_run(phase.name)
        self.tracker.log_artifacts(run, [self.folder.trials(phase.name), *dict.fromkeys(out.paths)])
        numeric = {k: v for k, v in result.model_dump().items() if isinstance(v, int | float)
                   and not isinstance(v, bool) and k != "wall_s"}
        self.tracker.log_metrics(run, [{"step": 0, **numeric}])
        verdict = phase.verdict(self.spec, result)
        self.tracker.log_verdict(run, verdict.params, verdict.metrics, verdict.tags, verdict.sentence)
        self.tracker.log_table(run, table, f"{phase.name}_trials.json")
        self.tracker.finish(run)
        self.state.phases[phase.name] = result.model_copy(update={"status": PhaseStatus.DONE})
        self._save()
        self._log_study_verdict()
        log.info("%s: %s phase done", self.study_id, phase.name)
        if phase.reusable and source is None:  # the index names the study that ran it
            PhaseIndex().record(phase_key(self.spec, phase.name), self.study_id)
        self.emit("phase_done", {"phase": phase.name, **result.model_dump(mode="json", exclude={"status"})})

    def _run_stage(self, phase: str, stage: Stage) -> pd.DataFrame:
        """One tune search a phase runs first (compare's), its table kept under `stage.table` with its tags."""
        path = self.folder.trials(stage.table)
        if not path.exists():
            tags = dict(stage.tags)
            job = self._job(stage.spec, "tune", None, experiment_name(self.study_id, phase, tags.get("stage")), tags)
            table = self.runner.run_phase(job)
            self.tracker.prune_trials(self.study_id, phase, set(table.trial_id), stage=tags.get("stage"),
                                      instance=self.state.instance)
            table.assign(**{k: v for k, v in tags.items() if k != "phase"}).to_csv(path, index=False)
        return pd.read_csv(path)

    def _trials_or_reuse(self, phase: Phase, ctx: Context) -> tuple[pd.DataFrame, str | None]:
        """The phase's trial table: copied from an identical finished phase of another study, else run."""
        name = phase.name
        source = self._reusable(name) if phase.reusable else None
        if source is not None:
            log.info("%s: reusing the identical %s phase of study %s", self.study_id, name, source.study_id)
            shutil.copy(source.trials(name), self.folder.trials(name))
            self.tracker.set_tags(self._phase_run(name), {"reused_from": source.study_id})
            return self.table(name), source.study_id
        planned = phase.plan(ctx)
        ran = self.runner.run_phase(self._job(self.spec, name, planned, experiment_name(self.study_id, name)))
        table = phase.completed(ctx, ran)
        self.tracker.prune_trials(self.study_id, name, set(table.trial_id), instance=self.state.instance)
        table.to_csv(self.folder.trials(name), index=False)
        self._record_copied(name, table[~table["trial_id"].isin(ran["trial_id"])])
        return table, None

    def _record_copied(self, phase: str, rows: pd.DataFrame) -> None:
        """A run for each row a phase copied instead of training (verify's centre runs from transfer), tagged
        `reused_from` with its final eval loss, so the phase's runs are all there in MLflow (and counted by the
        progress)."""
        if rows.empty:
            return
        recorder = TrialRecorder(self.spec, self.study_id, phase, self._phase_run(phase), self.tracker,
                                 self.state.instance)
        hparams = list(self.spec.space.defaults())
        for row in rows.itertuples():
            trial = PlannedTrial(str(row.trial_id), phase, int(row.width), int(row.seed),
                                 {h: float(getattr(row, h)) for h in hparams}, is_centre=bool(row.is_centre))
            run = recorder.start(trial, reused_from=str(row.message).removeprefix("reused from "))
            recorder.log_steps(run, [{"step": int(row.steps), "eval_loss": row.eval_loss}])
            recorder.finish(run, TrialReport(status=row.status, message=str(row.message)))
            self.emit("trial_done", {"phase": phase, "trial_id": row.trial_id, "status": row.status,
                                     "eval_loss": float(row.eval_loss), "reused": True})

    # ------------------------------------------------------------------ reuse of finished phases
    def _reusable(self, phase: str) -> StudyFolder | None:
        other = PhaseIndex().get(phase_key(self.spec, phase))
        if other is None or other == self.study_id:
            return None
        source = StudyFolder(other)
        return source if source.phase_done(phase) else None

    # ------------------------------------------------------------------ the study
    def run(self) -> StudyState:
        """Run the remaining phases; any failure is recorded, then raised as a `workers.errors.StudyError`."""
        phase = None
        if (note := solo_note(self.spec)) and not all(self.state.done(p) for p in phases_of(self.spec)):
            self.emit("note", {"error": note})  # once, first: what the plan said of the batches
        try:
            self._check_store()
            self._recover()
            self.state.status, self.state.error = StudyStatus.RUNNING, None
            self.state.driver = {"host": socket.gethostname(), "pid": os.getpid()}
            self._save()
            if not all(self.state.done(p) for p in phases_of(self.spec)):
                check_memory(self.spec)  # a trial that cannot fit, and
                check_study(self.spec)  # a model that breaks the contract, stop here, before the first trial
            self._study_run()
            for phase in phases_of(self.spec):
                if self.state.done(phase):
                    self.emit("phase_skipped", {"phase": phase})
                    continue
                self.tracker.set_tags(self.state.runs["study"], {"phase": phase})
                self.emit("phase_start", {"phase": phase, "trials": PHASES[phase].count(self.spec)})
                start = time.monotonic()
                self._run_phase(PHASES[phase])
                self.state.phases[phase].wall_s = time.monotonic() - start  # the cost account's phase time
                self._save()
            phase = None
            self.write_report()
            self.tracker.set_tags(self.state.runs["study"], {"phase": "done", "status": StudyStatus.SUCCEEDED})
            self.tracker.finish(self.state.runs["study"])
        except KeyboardInterrupt:
            self._fail(InfrastructureLost("stopped by the user (Ctrl-C); re-run the same command to resume"), phase)
            raise
        except Exception as exc:
            raise self._fail(exc, phase) from exc
        self.state.status = StudyStatus.SUCCEEDED
        self._save()
        return self.state

    def _recover(self) -> None:
        """Record an earlier attempt whose process died while `running` as `interrupted`."""
        state, driver = self.state, self.state.driver or {}
        here = driver.get("host") == socket.gethostname() and driver.get("pid") != os.getpid()
        if state.status != StudyStatus.RUNNING or not here:
            return
        try:
            os.kill(driver["pid"], 0)
            return  # still alive (or another process took its pid): nothing to say for sure
        except ProcessLookupError:
            pass
        except PermissionError:
            return
        err = InfrastructureLost(f"its driver process {driver['pid']} ended without recording an outcome (killed, "
                                 "or its Ray cluster was lost); resumed")
        self._fail(err, next((p for p in phases_of(self.spec) if not state.done(p)), None))
        self.emit("recovered", {"error": err.describe()})

    def _study_run(self) -> None:
        """The study's MLflow run: created on the first attempt; a resumed attempt reopens it and its
        unfinished phases' runs, which the interruption ended."""
        if "study" in self.state.runs:
            for key, run_id in self.state.runs.items():
                if key == "study" or not self.state.done(key):
                    self.tracker.reopen(run_id)
        else:
            spec = self.spec
            self.state.runs["study"] = self.tracker.study_run(self.study_id, {
                "spec_hash": self.state.spec_hash, "model": spec.model.family, "study_dir": str(self.dir),
                "ray_experiment": str(self.folder.ray), "mlflow.note.content": spec.description,
                **provenance_tags(spec.name)}, self.state.instance)
            self.tracker.log_artifacts(self.state.runs["study"], [self.folder.spec])
            self._log_dataset(self.state.runs["study"])
            self._save()

    def _log_study_verdict(self) -> None:
        """Every finished phase's verdict on the study run; its description: the sentences, then the spec's (the
        runs table's Description cell shows its start). The experiment's saved view `verdicts` gets the columns of
        what was logged, so the runs table the printed link opens shows them."""
        verdict = study_verdict(self.spec, self.state)
        description = "\n\n".join(s for s in (verdict.sentence, self.spec.description) if s)
        self.tracker.log_verdict(self.state.runs["study"], verdict.params, verdict.metrics, verdict.tags,
                                 description)
        self.tracker.save_view(verdict_columns(verdict))

    def _log_dataset(self, run: str) -> None:
        data = self.spec.data
        digest = hashlib.sha256(json.dumps(data.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]
        name = data.source if data.path is None else f"{data.source}:{Path(data.path).name}"
        source = data.path or f"ptctl built-in corpus {data.source!r}"
        self.tracker.log_dataset(run, name, digest, source, "local" if data.path else "code")

    def _fail(self, exc: Exception, phase: str | None) -> StudyError:
        """Record how the study ended (state.json, then its open MLflow runs); the error to raise."""
        err = exc if isinstance(exc, StudyError) else StudyFailed(one_line(exc))
        err.study_id, err.phase = self.study_id, err.phase or phase
        self.state.status, self.state.error = err.status, str(err)
        self._save()
        log.info("%s", err.describe())  # the caller reports it (the CLI's error line, the service's store)
        if self._tracker is not None:
            try:
                self._close_runs(err)
            except Exception as close_exc:  # MLflow itself may be what failed: state.json has it
                log.warning("%s: could not mark its MLflow runs %s: %s", self.study_id, err.status, one_line(close_exc))
        return err

    def _close_runs(self, err: StudyError) -> None:
        run_status = "KILLED" if err.status == StudyStatus.INTERRUPTED else "FAILED"
        tags = {"status": err.status, "error": str(err)}
        for run in self.tracker.runs(self.study_id, "trial", self.state.instance):
            if run.info.status == "RUNNING" and (err.phase is None or run.data.tags.get("phase") == err.phase):
                self.tracker.close(run.info.run_id, "KILLED", {"status": err.status})
        for key in (err.phase, "study"):
            if key in self.state.runs:
                self.tracker.close(self.state.runs[key], run_status, tags)

    def write_report(self) -> Path:
        """report.md: each finished phase's section (`Phase.section`) and figures, the cost, the batches."""
        folder, spec, state, ctx = self.folder, self.spec, self.state, self.context()
        tables = {p: self.table(p) for p in phases_of(spec) if folder.trials(p).exists()}
        all_trials = pd.concat(tables.values(), ignore_index=True)
        all_trials.to_csv(folder.all_trials, index=False)
        done = [PHASES[p] for p in phases_of(spec) if state.done(p)]
        plots = {label: f"{name}.png" for p in done for label, name in p.figures(state.phases[p.name]).items()
                 if folder.figure(name).exists()}
        study = {"name": spec.name, "study_id": self.study_id, "model": spec.model.family,
                 "base_width": spec.tune.base_width, "widths": spec.transfer.widths if spec.transfer else None,
                 "budget": f"{spec.train.steps} steps × batch {spec.train.batch_size}"}
        for name in phases_of(spec):
            study.update(PHASES[name].about(spec, state.phases.get(name)))
        cost = measured_cost(spec, tables, {p: r.wall_s for p, r in state.phases.items() if r.wall_s is not None})
        folder.write_artifact(folder.cost.name, cost)
        if cost["metrics"]:
            self.tracker.log_metrics(state.runs["study"], [{"step": 0, **cost["metrics"]}])
        note = solo_note(spec)
        text = render_report(study=study, phases=list(PHASES), plots=plots, tables=tables, cost=cost,
                             sections={p.name: p.section(ctx, state.phases[p.name], tables) for p in done},
                             headline={k: v for p in done for k, v in p.headline.items()},
                             flags=[f"batches: {note}"] if note else [])
        path = folder.report
        path.write_text(text)
        # report.md beside its figures, which it links by file name; report.html with them inline, for MLflow's
        # artifact view, which renders no relative image
        page = folder.artifact("report.html")
        page.write_text(report_html(text, folder.artifacts))
        figures = [folder.artifact(name) for name in plots.values()]
        self.tracker.log_artifacts(state.runs["study"], [path, page, folder.all_trials, folder.cost, *figures])
        self.tracker.log_table(state.runs["study"], all_trials, "trials.json")
        return path


def run_study(spec: StudySpec, study_id: str | None = None, on_event: Event | None = None, *,
              runner: Runner | None = None, tracker: RunTracker | None = None) -> StudyState:
    """Run `spec` to the end (resuming `study_id` where it stopped); returns the final state."""
    return StudyDriver(spec, runner, tracker, study_id=study_id, on_event=on_event).run()
