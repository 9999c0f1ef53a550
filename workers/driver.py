"""The study driver: run a study's phases in order, persist what is done, resume after a crash.

A study lives in `data_dir()/studies/<study_id>/`: `spec.yaml`, `state.json` (finished phases and
their results, MLflow run ids; rewritten atomically), `ray/` (one restorable Tune experiment per
phase), and `artifacts/` (trial tables, plots, certificate, report). Re-running a study id skips
finished phases and restores an interrupted one, so no finished trial runs twice and no MLflow run
is made twice (runs are found by their tags).

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

import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    transfer_table,
)
from studies.cost import measured_cost
from studies.plan import (
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
from studies.spec import StudySpec
from workers.data import DataConfig, data_dir
from workers.errors import InfrastructureLost, StudyError, StudyFailed, one_line
from workers.paths import redact_uri
from workers.ray_runner import MlflowTrials, experiment_name, run_phase
from workers.tracking import Tracker, default_tracking_uri
from workers.train import load_data
from workers.verdicts import phase_verdict, provenance_tags, study_verdict

log = logging.getLogger(__name__)
Event = Callable[[str, dict[str, Any]], None]


def studies_dir() -> Path:
    return data_dir() / "studies"


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


def _write_json(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # one per writer
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)  # atomic: a crash leaves the old or the new state, never half


def record_phase(index: Path, key: str, study_id: str) -> None:
    """`index[key] = study_id`, read-modify-written under an exclusive lock: drivers of studies finishing
    together (the service runs several) must not drop each other's entries."""
    with open(index.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = json.loads(index.read_text()) if index.exists() else {}
        _write_json(index, {**current, key: study_id})


@dataclass
class StudyState:
    study_id: str
    spec_hash: str
    status: str = "running"  # running | succeeded | failed | interrupted
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
            raise ValueError(f"study {study_id} was started with another spec (hash {state.spec_hash[:10]}); "
                             "use a new study id or the original spec")
        return state

    def save(self, path: Path) -> None:
        _write_json(path, self.__dict__)


class StudyDriver:
    def __init__(self, spec: StudySpec, study_id: str | None = None, on_event: Event | None = None) -> None:
        self.spec = spec
        self.study_id = study_id or default_study_id(spec)
        self.dir = studies_dir() / self.study_id
        self.art = self.dir / "artifacts"
        self.art.mkdir(parents=True, exist_ok=True)
        self.state_path = self.dir / "state.json"
        self.state = StudyState.load(self.state_path, self.study_id, spec.content_hash())
        (self.art / "spec.yaml").write_text(spec.to_yaml())
        self.uri = spec.resources.tracking.tracking_uri or default_tracking_uri()
        self._tracker: Tracker | None = None
        self.emit = on_event or (lambda kind, data: None)

    # ------------------------------------------------------------------ helpers
    def _save(self) -> None:
        self.state.save(self.state_path)

    @property
    def tracker(self) -> Tracker:
        """The MLflow tracker, connected on first use; an unreachable store fails the study."""
        if self._tracker is None:
            try:
                self._tracker = Tracker(self.spec.experiment_name(), self.uri)
            except Exception as exc:
                raise StudyFailed(f"cannot reach the MLflow tracking store {redact_uri(self.uri)} ({one_line(exc)}); "
                                  "start it or set MLFLOW_TRACKING_URI, then re-run to resume") from exc
        return self._tracker

    def _check_store(self) -> None:
        """A resumed study's runs must be in the current store: else name both stores and stop."""
        state, here = self.state, redact_uri(self.uri)
        if "study" in state.runs and not self.tracker.owns(state.runs["study"], self.study_id, state.instance):
            self._tracker = None  # nothing of this study's to close in that store
            raise StudyFailed(
                f"the tracking store {here} does not hold this study's MLflow run {state.runs['study']}; its runs "
                f"are in {state.tracking_uri or '(a store not recorded in state.json)'}: set MLFLOW_TRACKING_URI "
                "(or resources.tracking.tracking_uri) to that store to resume, or start a new --study-id")
        state.tracking_uri = here

    def table(self, phase: str) -> pd.DataFrame:
        return pd.read_csv(self.art / f"{phase}_trials.csv")

    def _phase_run(self, phase: str) -> str:
        if phase not in self.state.runs:
            self.state.runs[phase] = self.tracker.phase_run(self.study_id, phase, self.state.runs["study"],
                                                            self.state.instance)
            self._save()
        return self.state.runs[phase]

    def _run_trials(self, phase: str, planned: list[dict] | None = None, keep: frozenset[str] = frozenset()
                    ) -> pd.DataFrame:
        callback = MlflowTrials(self.spec, self.study_id, phase, self._phase_run(phase), self.tracker.uri,
                                instance=self.state.instance)
        callback.notify = lambda info: self.emit("trial_done", info)
        table = run_phase(self.spec, phase, self.dir / "ray", callback, planned,
                          experiment=experiment_name(self.study_id, phase))
        self.tracker.prune_trials(self.study_id, phase, set(table.trial_id) | keep, instance=self.state.instance)
        table.to_csv(self.art / f"{phase}_trials.csv", index=False)
        return table

    def _finish_phase(self, phase: str, result: dict[str, Any], files: list[Path]) -> None:
        run = self._phase_run(phase)
        self.tracker.log_artifacts(run, [self.art / f"{phase}_trials.csv", *files])
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
            record_phase(self._index_path(), phase_key(self.spec, phase), self.study_id)
        self.emit("phase_done", {"phase": phase, **result})

    # ------------------------------------------------------------------ phases
    def _trials_or_reuse(self, phase: str, planned: list[dict] | None = None) -> tuple[pd.DataFrame, str | None]:
        """The phase's trial table: copied from an identical finished phase of another study, else run."""
        source = self._reusable(phase)
        if source is None:
            return self._run_trials(phase, planned), None
        log.info("%s: reusing the identical %s phase of study %s", self.study_id, phase, source.name)
        shutil.copy(source / "artifacts" / f"{phase}_trials.csv", self.art / f"{phase}_trials.csv")
        self.tracker.set_tags(self._phase_run(phase), {"reused_from": source.name})
        return self.table(phase), source.name

    def phase_tune(self) -> dict[str, Any]:
        table, source = self._trials_or_reuse("tune")
        if not (table.status == "completed").any():
            counts = ", ".join(f"{n} {s}" for s, n in table.status.value_counts().items())
            raise StudyFailed(f"no tune trial completed its budget ({counts} of {len(table)}): lower space.lr's "
                              "range or raise train.max_loss, then run it as a new study")
        best = best_hparams(self.spec, table)
        plot_tune_history(table, self.art / "tune_history.png")
        done = table[table.status == "completed"]
        result = {"best_hparams": best, "best_eval_loss": float(done.eval_loss.min()),
                  "n_trials": len(table), "n_diverged": int((table.status == "diverged").sum()),
                  "reused_from": source}
        self._finish_phase("tune", result, [self.art / "tune_history.png"])
        return result

    def phase_transfer(self) -> dict[str, Any]:
        table, source = self._trials_or_reuse("transfer", transfer_trials(self.spec, self.centre()))
        summary = transfer_table(table)
        plot_transfer(pd.concat([self.table("tune"), table], ignore_index=True), self.art / "transfer.png")
        summary.to_csv(self.art / "transfer_summary.csv", index=False)
        result = {"widths": summary.to_dict(orient="records"), "reused_from": source}
        self._finish_phase("transfer", result, [self.art / "transfer.png", self.art / "transfer_summary.csv"])
        return result

    def phase_verify(self) -> dict[str, Any]:
        v, centre = self.spec.verify, self.centre()
        reused = reused_centre_seeds(self.spec) if (self.art / "transfer_trials.csv").exists() else []
        keys = frozenset(f"verify-centre-s{seed - v.seed}" for seed in reused)
        table = self._run_trials("verify", verify_trials(self.spec, centre, reused), keys)
        if reused:
            table = with_reused_centre(self.spec, table, self.table("transfer"))
            table.to_csv(self.art / "verify_trials.csv", index=False)
            self._record_reused(table[table["trial_id"].isin(keys)])
        cert = certify(table, p=v.p, alpha=v.alpha, tolerance=v.tolerance)
        _write_json(self.art / "certificate.json", cert.model_dump())
        plot_verify(table, centre, list(self.spec.space.searched()), self.art / "verify.png")
        self._finish_phase("verify", {"certificate": cert.model_dump()},
                           [self.art / "certificate.json", self.art / "verify.png"])
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
        v = self.spec.validate_
        table = self._run_trials("validate", validate_trials(self.spec, self.centre()))
        drift = lr_drift(table, threshold=v.drift_threshold)
        others = {h: lr_drift(table, threshold=v.drift_threshold, hparam=h).model_dump() for h in v.hparams}
        figures = [self.art / "mutransfer.png", *(self.art / f"mutransfer_{h}.png" for h in v.hparams)]
        for hparam, path in zip(v.sweeps(), figures, strict=True):
            plot_mutransfer(table, path, hparam)
        result = {"lr_drift": drift.model_dump(), **({"hparam_drift": others} if others else {})}
        self._finish_phase("validate", result, figures)
        return result

    def phase_compare(self) -> dict[str, Any]:
        """Tune the study's model at its proxy width and each baseline at every budget (one restorable Tune
        experiment per stage, recorded in the state as it finishes), then train every family at every budget."""
        spec, c = self.spec, self.spec.compare
        vocab = load_data(DataConfig(**spec.data.model_dump(mode="json"))).vocab_size  # the real one, not the cap
        done = self.state.phases.setdefault("compare", {}).setdefault("stages", {})
        tune_tables = []
        for stage in compare_stages(spec, vocab):
            name, sub = stage["name"], stage["spec"]
            tags = {"phase": "compare", "stage": f"tune-{name}", "family": stage["family"], "budget": stage["budget"]}
            path = self.art / f"compare_tune_{name}.csv"
            if name not in done:
                callback = MlflowTrials(sub, self.study_id, "tune", self._phase_run("compare"), self.tracker.uri, tags,
                                        instance=self.state.instance)
                callback.notify = lambda info: self.emit("trial_done", info)
                table = run_phase(sub, "tune", self.dir / "ray", callback,
                                  experiment=experiment_name(self.study_id, "compare", f"tune-{name}"))
                self.tracker.prune_trials(self.study_id, "compare", set(table.trial_id), stage=tags["stage"],
                                          instance=self.state.instance)
                table.assign(**{k: v for k, v in tags.items() if k != "phase"}).to_csv(path, index=False)
                done[name] = {"best_hparams": best_hparams(sub, table), "width": stage["width"]}
                self._save()
            tune_tables.append(pd.read_csv(path))
        pd.concat(tune_tables, ignore_index=True).to_csv(self.art / "compare_tune_trials.csv", index=False)
        best = {name: info["best_hparams"] for name, info in done.items()}
        table = self._run_trials("compare", compare_trials(spec, vocab, best))
        summary = compare_table(table)
        summary.to_csv(self.art / "compare_summary.csv", index=False)
        plot_compare(table, self.art / "compare.png")
        result = {"vocab_size": vocab, "widths": compare_widths(spec, vocab), "stages": done,
                  "summary": summary.to_dict(orient="records"), "budgets": c.budgets, "tokens": c.tokens}
        files = [self.art / n for n in ("compare.png", "compare_summary.csv", "compare_tune_trials.csv")]
        self._finish_phase("compare", result, files)
        return result

    def planned_count(self, phase: str) -> int:
        spec = self.spec
        if phase == "compare":
            c = spec.compare
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
    @staticmethod
    def _index_path() -> Path:
        return studies_dir() / "phase_index.json"

    def _index(self) -> dict[str, str]:
        path = self._index_path()
        return json.loads(path.read_text()) if path.exists() else {}

    def _reusable(self, phase: str) -> Path | None:
        other = self._index().get(phase_key(self.spec, phase))
        if other is None or other == self.study_id:
            return None
        source = studies_dir() / other
        state = json.loads((source / "state.json").read_text()) if (source / "state.json").exists() else {}
        done = state.get("phases", {}).get(phase, {}).get("status") == "done"
        return source if done and (source / "artifacts" / f"{phase}_trials.csv").exists() else None

    # ------------------------------------------------------------------ the study
    def run(self) -> StudyState:
        """Run the remaining phases; any failure is recorded, then raised as a `workers.errors.StudyError`."""
        phase = None
        try:
            self._check_store()
            self._recover()
            self.state.status, self.state.error = "running", None
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
                getattr(self, f"phase_{phase}")()
                self.state.phases[phase]["wall_s"] = time.monotonic() - start  # the cost account's phase time
                self._save()
            phase = None
            self.write_report()
            self.tracker.set_tags(self.state.runs["study"], {"phase": "done", "status": "succeeded"})
            self.tracker.finish(self.state.runs["study"])
        except KeyboardInterrupt:
            self._fail(InfrastructureLost("stopped by the user (Ctrl-C); re-run the same command to resume"), phase)
            raise
        except Exception as exc:
            raise self._fail(exc, phase) from exc
        self.state.status = "succeeded"
        self._save()
        return self.state

    def _recover(self) -> None:
        """Record an earlier attempt whose process died while `running` as `interrupted`."""
        state, driver = self.state, self.state.driver or {}
        if state.status != "running" or driver.get("host") != socket.gethostname() or driver.get("pid") == os.getpid():
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
        unfinished phases' runs, which the interruption ended."""
        if "study" in self.state.runs:
            for key, run_id in self.state.runs.items():
                if key == "study" or self.state.phases.get(key, {}).get("status") != "done":
                    self.tracker.reopen(run_id)
        else:
            spec = self.spec
            self.state.runs["study"] = self.tracker.study_run(self.study_id, {
                "spec_hash": self.state.spec_hash, "model": spec.model.family, "study_dir": str(self.dir),
                "ray_experiment": str(self.dir / "ray"), "mlflow.note.content": spec.description,
                **provenance_tags(spec.name)}, self.state.instance)
            self.tracker.log_artifacts(self.state.runs["study"], [self.art / "spec.yaml"])
            self._log_dataset(self.state.runs["study"])
            self._save()

    def _log_study_verdict(self) -> None:
        """Every finished phase's verdict on the study run; its description: the spec's, then the sentences."""
        verdict = study_verdict(self.spec, self.state.phases)
        description = "\n\n".join(s for s in (self.spec.description, verdict.sentence) if s)
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
        run_status = "KILLED" if err.status == "interrupted" else "FAILED"
        tags = {"status": err.status, "error": str(err)}
        for run in self.tracker.runs(self.study_id, "trial", self.state.instance):
            if run.info.status == "RUNNING" and (err.phase is None or run.data.tags.get("phase") == err.phase):
                self.tracker.close(run.info.run_id, "KILLED", {"status": err.status})
        for key in (err.phase, "study"):
            if key in self.state.runs:
                self.tracker.close(self.state.runs[key], run_status, tags)

    def write_report(self) -> Path:
        tables = {p: self.table(p) for p in self.spec.phases() if (self.art / f"{p}_trials.csv").exists()}
        all_trials = pd.concat(tables.values(), ignore_index=True)
        all_trials.to_csv(self.art / "trials.csv", index=False)
        cert = self.state.phases.get("verify", {}).get("certificate")
        validate = self.state.phases.get("validate", {})
        drift = validate.get("lr_drift")
        plots = {p: f"{name}.png" for p, name in (("tune", "tune_history"), ("transfer", "transfer"),
                                                  ("verify", "verify"), ("validate", "mutransfer"),
                                                  *((f"validate ({h})", f"mutransfer_{h}")
                                                    for h in validate.get("hparam_drift", {})),
                                                  ("compare", "compare"))
                 if (self.art / f"{name}.png").exists()}
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
        _write_json(self.art / "cost.json", cost)
        if cost["metrics"]:
            self.tracker.log_metrics(self.state.runs["study"], [{"step": 0, **cost["metrics"]}])
        certificate = Certificate(**cert) if cert else None
        advice = None
        if certificate is not None and not certificate.certified and "verify" in tables:
            advice = neighbour_advice(tables["verify"], self.centre(), list(spec.space.searched()),
                                      certificate.tolerance)
        text = render_report(study=study, tables=tables, certificate=certificate,
                             lr_drift=LRDrift(**drift) if drift else None, plots=plots, hparams=spec.space.HPARAMS,
                             hparam_drift=[LRDrift(**d) for d in validate.get("hparam_drift", {}).values()],
                             advice=advice, cost=cost)
        path = self.art / "report.md"
        path.write_text(text)
        figures = [self.art / name for name in plots.values()]  # beside report.md, so its links resolve in MLflow
        self.tracker.log_artifacts(self.state.runs["study"],
                                   [path, self.art / "trials.csv", self.art / "cost.json", *figures])
        self.tracker.log_table(self.state.runs["study"], all_trials, "trials.json")
        return path


def run_study(spec: StudySpec, study_id: str | None = None, on_event: Event | None = None) -> StudyState:
    """Run `spec` to the end (resuming `study_id` where it stopped); returns the final state."""
    return StudyDriver(spec, study_id, on_event).run()
