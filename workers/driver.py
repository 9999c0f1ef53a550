"""The study driver: run a study's phases in order, persist what is done, resume after a crash.

A study lives in its `workers.folder.StudyFolder`: `state.json` (finished phases and their results, MLflow
run ids; rewritten atomically), `ray/` (one restorable experiment per phase), and `artifacts/` (spec, trial
tables, plots, certificate, report). Re-running a study id skips finished phases and restores an interrupted
one, so no finished trial runs twice and no MLflow run is made twice (runs are found by their tags).

Seams: `StudyDriver(spec, runner, tracker)`. The runner trains a phase's trials (`workers.runner.Runner`:
`workers.ray_runner.RayRunner` by default, `workers.runner.InProcessRunner` without Ray); the tracker records
the study's MLflow runs (`workers.tracking.Tracker` by default, `workers.null_tracker.NullTracker` for none).
Phases run in `spec.phases()` order through `StudyDriver.PHASES`.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis import (
    Certificate,
    LRDrift,
    certify,
    compare_table,
    lr_drift,
    neighbour_advice,
    plot_compare,
    plot_mutransfer,
    plot_transfer,
    plot_tune_history,
    plot_verify,
    render_report,
    report_html,
    transfer_table,
)
from analysis.table import TrialStatus
from studies.cost import measured_cost
from studies.plan import (
    PlannedTrial,
    best_hparams,
    compare_stages,
    compare_trials,
    compare_widths,
    reused_centre_seeds,
    transfer_trials,
    validate_trials,
    verify_trials,
    with_reused_centre,
)
from studies.spec import StudySpec, required
from studies.status import StudyStatus
from workers.errors import ConfigError, InfrastructureLost, StudyError, StudyFailed, one_line
from workers.folder import PhaseIndex, StudyFolder, studies_dir, write_json
from workers.paths import redact_uri
from workers.runner import PhaseJob, Runner, experiment_name
from workers.train import load_data
from workers.verdicts import phase_verdict, provenance_tags, study_verdict, verdict_columns

if TYPE_CHECKING:
    from workers.null_tracker import NullTracker
    from workers.tracking import Tracker

log = logging.getLogger(__name__)
Event = Callable[[str, dict[str, Any]], None]
__all__ = ["StudyDriver", "StudyState", "default_study_id", "phase_key", "run_study", "studies_dir"]


def default_study_id(spec: StudySpec) -> str:
    return f"{spec.name}-{spec.content_hash()[:10]}"


REUSABLE = {"tune": ("model", "data", "train", "space", "tune"),
            "transfer": ("model", "data", "train", "space", "tune", "transfer")}


def phase_key(spec: StudySpec, phase: str) -> str:
    """What a reusable phase depends on: equal keys give equal results, so a finished phase of another
    study is reused (`ptctl transfer` to new widths reuses tune; `ptctl verify` reuses tune and transfer)."""
    d = spec.as_dict()
    part = {"phase": phase, **{k: d[k] for k in REUSABLE[phase]}}
    return hashlib.sha256(json.dumps(part, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class StudyState:
    study_id: str
    spec_hash: str
    status: str = StudyStatus.RUNNING  # running | succeeded | failed | interrupted
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)  # phase → {"status": "done", ...}
    runs: dict[str, str] = field(default_factory=dict)  # "study" | phase → MLflow run id
    instance: str | None = None  # tagged on every MLflow run of this study; None: a state from before it
    tracking_uri: str | None = None  # where the runs are (credentials redacted)
    error: str | None = None  # the one-line cause of `failed` / `interrupted`
    driver: dict[str, Any] | None = None  # the process running it: {"host", "pid"}

    @classmethod
    def load(cls, path: Path, study_id: str, spec_hash: str) -> StudyState:
        if not path.exists():
            return cls(study_id, spec_hash, instance=secrets.token_hex(8))
        state = cls(**json.loads(path.read_text()))
        if state.spec_hash != spec_hash:
            raise ConfigError(f"study {study_id} was started with another spec (hash {state.spec_hash[:10]}); "
                             "use a new study id or the original spec")
        return state

    def save(self, path: Path) -> None:
        write_json(path, self.__dict__)


class StudyDriver:
    """Run one study's phases: `runner` trains trials (None: Ray Tune), `tracker` records runs (None: MLflow)."""

    def __init__(self, spec: StudySpec, runner: Runner | None = None, tracker: Tracker | NullTracker | None = None,
                 *, study_id: str | None = None, on_event: Event | None = None) -> None:
        self.spec = spec
        self.study_id = study_id or default_study_id(spec)
        self.folder = StudyFolder(self.study_id).create()
        self.dir = self.folder.path
        self.state = StudyState.load(self.folder.state_path, self.study_id, spec.content_hash())
        self.folder.spec.write_text(spec.to_yaml())
        self._runner = runner
        self._tracker = tracker
        self.uri = spec.resources.tracking.tracking_uri or (tracker.uri if tracker is not None else None)
        self.emit = on_event or (lambda kind, data: None)

    # ------------------------------------------------------------------ helpers
    def _save(self) -> None:
        self.state.save(self.folder.state_path)

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            from workers.ray_runner import RayRunner  # only here: the driver runs without Ray when given a runner

            self._runner = RayRunner()
        return self._runner

    @property
    def tracker(self) -> Tracker | NullTracker:
        """The tracker; MLflow's when none was given, connected on first use (an unreachable store fails the study)."""
        if self._tracker is None:
            from workers.tracking import Tracker, default_tracking_uri  # only here: MLflow is optional

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

    def _run_trials(self, phase: str, planned: list[PlannedTrial] | None = None, keep: frozenset[str] = frozenset()
                    ) -> pd.DataFrame:
        table = self.runner.run_phase(self._job(self.spec, phase, planned, experiment_name(self.study_id, phase)))
        self.tracker.prune_trials(self.study_id, phase, set(table.trial_id) | keep, instance=self.state.instance)
        table.to_csv(self.folder.trials(phase), index=False)
        return table

    def _finish_phase(self, phase: str, result: dict[str, Any], files: list[Path]) -> None:
        run = self._phase_run(phase)
        self.tracker.log_artifacts(run, [self.folder.trials(phase), *files])
        numeric = {k: v for k, v in result.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        self.tracker.log_metrics(run, [{"step": 0, **numeric}])
        verdict = phase_verdict(self.spec, phase, result)
        self.tracker.log_verdict(run, verdict.params, verdict.metrics, verdict.tags, verdict.sentence)
        self.tracker.log_table(run, self.table(phase), f"{phase}_trials.json")
        self.tracker.finish(run)
        self.state.phases[phase] = {"status": "done", **result}
        self._save()
        self._log_study_verdict()
        log.info("%s: %s phase done", self.study_id, phase)
        if phase in REUSABLE and not result.get("reused_from"):  # the index names the study that ran it
            PhaseIndex().record(phase_key(self.spec, phase), self.study_id)
        self.emit("phase_done", {"phase": phase, **result})

    # ------------------------------------------------------------------ phases
    def _trials_or_reuse(self, phase: str, planned: list[PlannedTrial] | None = None
                         ) -> tuple[pd.DataFrame, str | None]:
        """The phase's trial table: copied from an identical finished phase of another study, else run."""
        source = self._reusable(phase)
        if source is None:
            return self._run_trials(phase, planned), None
        log.info("%s: reusing the identical %s phase of study %s", self.study_id, phase, source.study_id)
        shutil.copy(source.trials(phase), self.folder.trials(phase))
        self.tracker.set_tags(self._phase_run(phase), {"reused_from": source.study_id})
        return self.table(phase), source.study_id

    def phase_tune(self) -> dict[str, Any]:
        table, source = self._trials_or_reuse("tune")
        if not (table.status == TrialStatus.COMPLETED).any():
            counts = ", ".join(f"{n} {s}" for s, n in table.status.value_counts().items())
            raise StudyFailed(f"no tune trial completed its budget ({counts} of {len(table)}): lower space.lr's "
                              "range or raise train.max_loss, then run it as a new study")
        best = best_hparams(self.spec, table)
        plot_tune_history(table, self.folder.figure("tune_history"))
        done = table[table.status == TrialStatus.COMPLETED]
        result = {"best_hparams": best, "best_eval_loss": float(done.eval_loss.min()),
                  "n_trials": len(table), "n_diverged": int((table.status == TrialStatus.DIVERGED).sum()),
                  "reused_from": source}
        self._finish_phase("tune", result, [self.folder.figure("tune_history")])
        return result

    def phase_transfer(self) -> dict[str, Any]:
        table, source = self._trials_or_reuse("transfer", transfer_trials(self.spec, self.centre()))
        summary = transfer_table(table)
        figure, summary_csv = self.folder.figure("transfer"), self.folder.artifact("transfer_summary.csv")
        plot_transfer(pd.concat([self.table("tune"), table], ignore_index=True), figure)
        summary.to_csv(summary_csv, index=False)
        result = {"widths": summary.to_dict(orient="records"), "reused_from": source}
        self._finish_phase("transfer", result, [figure, summary_csv])
        return result

    def phase_verify(self) -> dict[str, Any]:
        v, centre = required(self.spec.verify, "verify"), self.centre()
        reused = reused_centre_seeds(self.spec) if self.folder.trials("transfer").exists() else []
        keys = frozenset(f"verify-centre-s{seed - v.seed}" for seed in reused)
        table = self._run_trials("verify", verify_trials(self.spec, centre, reused), keys)
        if reused:
            table = with_reused_centre(self.spec, table, self.table("transfer"))
            table.to_csv(self.folder.trials("verify"), index=False)
            self._record_reused(table[table["trial_id"].isin(keys)])
        cert = certify(table, p=v.p, alpha=v.alpha, tolerance=v.tolerance)
        self.folder.write_artifact(self.folder.certificate.name, cert.model_dump())
        plot_verify(table, centre, list(self.spec.space.searched()), self.folder.figure("verify"), cert.tolerance)
        self._finish_phase("verify", {"certificate": cert.model_dump()},
                           [self.folder.certificate, self.folder.figure("verify")])
        return cert.model_dump()

    def _record_reused(self, rows: pd.DataFrame) -> None:
        """A verify trial run for each centre run copied from transfer: tagged `reused_from`, its final eval loss
        logged, so the verify phase's runs are all there in MLflow (and counted by the progress)."""
        parent = self._phase_run("verify")
        for row in rows.itertuples():
            tags = {"width": row.width, "seed": row.seed, "status": row.status, "is_centre": True,
                    "reused_from": str(row.message).removeprefix("reused from ")}
            run = self.tracker.trial_run(self.study_id, "verify", row.trial_id, parent,
                                         {k: str(v) for k, v in tags.items()}, instance=self.state.instance)
            self.tracker.log_params(run, self.spec.trial_config(int(row.width), self.centre(), int(row.seed),
                                                                self.spec.steps_for("verify")))
            self.tracker.log_metrics(run, [{"step": int(row.steps), "eval_loss": row.eval_loss}])
            self.tracker.finish(run)
            self.emit("trial_done", {"phase": "verify", "trial_id": row.trial_id, "status": row.status,
                                     "eval_loss": float(row.eval_loss), "reused": True})

    def phase_validate(self) -> dict[str, Any]:
        v = required(self.spec.validate_, "validate")
        table = self._run_trials("validate", validate_trials(self.spec, self.centre()))
        drift = lr_drift(table, threshold=v.drift_threshold)
        others = {h: lr_drift(table, threshold=v.drift_threshold, hparam=h).model_dump() for h in v.hparams}
        figures = [self.folder.figure("mutransfer"), *(self.folder.figure(f"mutransfer_{h}") for h in v.hparams)]
        for hparam, path in zip(v.sweeps(), figures, strict=True):
            plot_mutransfer(table, path, hparam)
        result = {"lr_drift": drift.model_dump(), **({"hparam_drift": others} if others else {})}
        self._finish_phase("validate", result, figures)
        return result

    def phase_compare(self) -> dict[str, Any]:
        """Tune the study's model at its proxy width and each baseline at every budget (one restorable Tune
        experiment per stage, recorded in the state as it finishes), then train every family at every budget."""
        spec, c = self.spec, required(self.spec.compare, "compare")
        vocab = load_data(spec.data).vocab_size  # the real one, not the cap
        done = self.state.phases.setdefault("compare", {}).setdefault("stages", {})
        tune_tables = []
        for stage in compare_stages(spec, vocab):
            name, sub = stage["name"], stage["spec"]
            tags = {"phase": "compare", "stage": f"tune-{name}", "family": stage["family"], "budget": stage["budget"]}
            path = self.folder.trials(f"compare_tune_{name}")
            if name not in done:
                experiment = experiment_name(self.study_id, "compare", f"tune-{name}")
                table = self.runner.run_phase(self._job(sub, "tune", None, experiment, tags))
                self.tracker.prune_trials(self.study_id, "compare", set(table.trial_id), stage=tags["stage"],
                                          instance=self.state.instance)
                table.assign(**{k: v for k, v in tags.items() if k != "phase"}).to_csv(path, index=False)
                done[name] = {"best_hparams": best_hparams(sub, table), "width": stage["width"]}
                self._save()
            tune_tables.append(pd.read_csv(path))
        pd.concat(tune_tables, ignore_index=True).to_csv(self.folder.trials("compare_tune"), index=False)
        best = {name: info["best_hparams"] for name, info in done.items()}
        table = self._run_trials("compare", compare_trials(spec, vocab, best))
        summary = compare_table(table)
        summary.to_csv(self.folder.artifact("compare_summary.csv"), index=False)
        plot_compare(table, self.folder.figure("compare"))
        result = {"vocab_size": vocab, "widths": compare_widths(spec, vocab), "stages": done,
                  "summary": summary.to_dict(orient="records"), "budgets": c.budgets, "tokens": c.tokens}
        files = [self.folder.artifact(n) for n in ("compare.png", "compare_summary.csv", "compare_tune_trials.csv")]
        self._finish_phase("compare", result, files)
        return result

    PHASES: dict[str, Callable[[StudyDriver], dict[str, Any]]] = {  # each phase's step, run in spec.phases() order
        "tune": phase_tune, "transfer": phase_transfer, "verify": phase_verify, "validate": phase_validate,
        "compare": phase_compare}

    def planned_count(self, phase: str) -> int:
        spec = self.spec
        if phase == "compare":
            c = required(spec.compare, "compare")
            finals = (1 + len(c.baselines)) * len(c.budgets) * c.seeds
            return spec.tune.num_trials + sum(b.num_trials for b in c.baselines) * len(c.budgets) + finals
        counts = {"tune": spec.tune.num_trials,
                  "transfer": len(spec.transfer.widths) * spec.transfer.seeds if spec.transfer else 0,
                  "verify": (spec.verify.centre_seeds + spec.verify.resolved_n_samples()) if spec.verify else 0,
                  "validate": spec.validate_.n_trials() if spec.validate_ else 0}
        return counts[phase]

    def centre(self) -> dict[str, float]:
        return self.state.phases["tune"]["best_hparams"]

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
        try:
            self._check_store()
            self._recover()
            self.state.status, self.state.error = StudyStatus.RUNNING, None
            self.state.driver = {"host": socket.gethostname(), "pid": os.getpid()}
            self._save()
            self._study_run()
            for phase in self.spec.phases():
                if self.state.phases.get(phase, {}).get("status") == "done":
                    self.emit("phase_skipped", {"phase": phase})
                    continue
                self.tracker.set_tags(self.state.runs["study"], {"phase": phase})
                self.emit("phase_start", {"phase": phase, "trials": self.planned_count(phase)})
                start = time.monotonic()
                self.PHASES[phase](self)
                self.state.phases[phase]["wall_s"] = time.monotonic() - start  # the cost account's phase time
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
        self._fail(err, next((p for p in self.spec.phases() if state.phases.get(p, {}).get("status") != "done"), None))
        self.emit("recovered", {"error": err.describe()})

    def _study_run(self) -> None:
        """The study's MLflow run: created on the first attempt; a resumed attempt reopens it and its
        unfinished phases' runs, which the interruption ended. The experiment's saved view `verdicts` gets the
        study's verdict columns."""
        if "study" in self.state.runs:
            for key, run_id in self.state.runs.items():
                if key == "study" or self.state.phases.get(key, {}).get("status") != "done":
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
        self.tracker.save_view(verdict_columns(self.spec))  # the runs table the printed link opens shows the verdicts

    def _log_study_verdict(self) -> None:
        """Every finished phase's verdict on the study run; its description: the sentences, then the spec's (the
        runs table's Description cell shows its start)."""
        verdict = study_verdict(self.spec, self.state.phases)
        description = "\n\n".join(s for s in (verdict.sentence, self.spec.description) if s)
        self.tracker.log_verdict(self.state.runs["study"], verdict.params, verdict.metrics, verdict.tags,
                                 description)

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
        folder = self.folder
        tables = {p: self.table(p) for p in self.spec.phases() if folder.trials(p).exists()}
        all_trials = pd.concat(tables.values(), ignore_index=True)
        all_trials.to_csv(folder.all_trials, index=False)
        cert = self.state.phases.get("verify", {}).get("certificate")
        validate = self.state.phases.get("validate", {})
        drift = validate.get("lr_drift")
        plots = {p: f"{name}.png" for p, name in (("tune", "tune_history"), ("transfer", "transfer"),
                                                  ("verify", "verify"), ("validate", "mutransfer"),
                                                  *((f"validate ({h})", f"mutransfer_{h}")
                                                    for h in validate.get("hparam_drift", {})),
                                                  ("compare", "compare"))
                 if folder.figure(name).exists()}
        spec = self.spec
        study = {"name": spec.name, "study_id": self.study_id, "model": spec.model.family,
                 "base_width": spec.tune.base_width, "widths": spec.transfer.widths if spec.transfer else None,
                 "budget": f"{spec.train.steps} steps × batch {spec.train.batch_size}"}
        if spec.compare is not None:
            study.update(families=[spec.model.family, *(b.model.family for b in spec.compare.baselines)],
                         budgets=spec.compare.budgets, tokens=spec.compare.tokens,
                         budget=f"{spec.steps_for('compare')} steps × batch {spec.train.batch_size}",
                         widths={f: info["widths"] for f, info in
                                 self.state.phases.get("compare", {}).get("widths", {}).items()})
        cost = measured_cost(spec, tables, {p: s["wall_s"] for p, s in self.state.phases.items() if "wall_s" in s})
        folder.write_artifact(folder.cost.name, cost)
        if cost["metrics"]:
            self.tracker.log_metrics(self.state.runs["study"], [{"step": 0, **cost["metrics"]}])
        certificate = Certificate(**cert) if cert else None
        advice = None
        if certificate is not None and not certificate.certified and "verify" in tables:
            advice = neighbour_advice(tables["verify"], self.centre(), list(spec.space.searched()),
                                      certificate.tolerance, alpha=certificate.alpha)
        text = render_report(study=study, tables=tables, certificate=certificate,
                             lr_drift=LRDrift(**drift) if drift else None, plots=plots, hparams=spec.space.HPARAMS,
                             hparam_drift=[LRDrift(**d) for d in validate.get("hparam_drift", {}).values()],
                             advice=advice, cost=cost)
        path = folder.report
        path.write_text(text)
        # report.md beside its figures, which it links by file name; report.html with them inline, for MLflow's
        # artifact view, which renders no relative image
        page = folder.artifact("report.html")
        page.write_text(report_html(text, folder.artifacts))
        figures = [folder.artifact(name) for name in plots.values()]
        self.tracker.log_artifacts(self.state.runs["study"], [path, page, folder.all_trials, folder.cost, *figures])
        self.tracker.log_table(self.state.runs["study"], all_trials, "trials.json")
        return path


def run_study(spec: StudySpec, study_id: str | None = None, on_event: Event | None = None, *,
              runner: Runner | None = None, tracker: Tracker | NullTracker | None = None) -> StudyState:
    """Run `spec` to the end (resuming `study_id` where it stopped); returns the final state."""
    return StudyDriver(spec, runner, tracker, study_id=study_id, on_event=on_event).run()
