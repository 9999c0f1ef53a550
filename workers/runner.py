"""How a phase's trials get trained: the `Runner` seam of the driver, and the in-process runner.

A runner takes one `PhaseJob` (the spec, the phase, its planned trials, or None for tune's search) and returns
the phase's trial table (`analysis/__init__.py`), one `trial_row` per trial, writing each trial's MLflow run
through the job's tracker and telling the driver of each finished trial (`notify`). The CLI and the service run
`workers.ray.experiment.RayRunner` (Ray Tune, Optuna TPE + ASHA). `InProcessRunner` (here) trains one trial after
another, no Ray: tune asks TPE for `tune.num_trials` suggestions (no ASHA), and each finished row is appended to a
journal, so a phase run again trains only what it had not finished (tune replays the journal into the sampler).
A trial's own output goes to `logs/<trial key>.log` beside the journal (`trial_log`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from analysis.table import LOSS_STATUSES, TrialStatus
from studies.family import FAMILIES
from studies.members import auto_members, batches
from studies.plan import PlannedTrial
from studies.spec import StudySpec, TrialConfig
from workers.errors import one_line
from workers.report import TrialReport
from workers.tracker import RunTracker
from workers.verdicts import trial_run_name


def flag_tags(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The MLflow tags a trial's metric rows raise (`Family.flag_tags`; TauGPT: a nonzero `tau.collapse.<layer>`
    → `taumode_collapse`, `analysis.taumode`'s warning), each as "step S: <names after the prefix>" of the last
    row that raises it: the warnings are visible in the runs table."""
    rules = {prefix: tag for f in FAMILIES.values() for prefix, tag in f.flag_tags.items()}
    tags: dict[str, str] = {}
    for row in rows:
        for prefix, tag in rules.items():
            flagged = sorted(k[len(prefix):] for k, v in row.items() if k.startswith(prefix) and v)
            if flagged:
                tags[tag] = f"step {row['step']}: {', '.join(flagged)}"
    return tags


def end_tags(status: str, message: str | None) -> dict[str, str]:
    """The tags a finished trial's run gets beside its status: why it diverged, if it did."""
    return {"diverged_reason": message or "unknown"} if status == TrialStatus.DIVERGED else {}


def experiment_name(study_id: str, phase: str, stage: str | None = None) -> str:
    """The experiment (storage folder; Ray's driver staging folder) of one study's phase or compare stage."""
    return f"{study_id}.{phase}" + (f".{stage}" if stage else "")


@dataclass
class PhaseJob:
    """One phase (or compare stage) for a runner to train."""

    spec: StudySpec  # a compare stage's: its sub-spec
    phase: str  # the trials' phase ("tune" for a compare stage's search)
    planned: list[PlannedTrial] | None  # None: tune's search (tune.num_trials suggestions)
    study_id: str
    instance: str | None  # the study instance, tagged on every trial run
    phase_run: str  # the MLflow run the trial runs nest under
    tracker: RunTracker
    storage: Path  # the study's experiments folder (`StudyFolder.ray`)
    experiment: str  # `experiment_name(...)`: unique to the study, phase and stage
    tags: dict[str, Any] = field(default_factory=dict)  # on every trial run ("phase" overrides: compare's stages)
    notify: Callable[[dict[str, Any]], None] = lambda info: None  # told of each finished trial

    def recorder(self) -> TrialRecorder:
        return TrialRecorder(self.spec, self.study_id, self.phase, self.phase_run, self.tracker, self.instance,
                             self.tags)


@dataclass
class TrialRecorder:
    """A trial's MLflow run, written one way by every runner (and for the runs a phase reuses): `start` it with
    its tags and its full config as params, `log_steps` as evaluations arrive (a restarted trial's repeats are
    the caller's to drop), then `finish` it with its status, the steps it ran and its per-group lr multipliers."""

    spec: StudySpec
    study_id: str
    phase: str
    phase_run: str
    tracker: RunTracker
    instance: str | None = None
    tags: dict[str, Any] = field(default_factory=dict)  # on every trial run ("phase" overrides: compare's stages)

    def start(self, trial: PlannedTrial, number: int | None = None, **tags: Any) -> str:
        """The trial's run (found again by its key after a restart), tagged `running`, its config logged."""
        extra = {k: v for k, v in (("family", trial.family), ("budget", trial.budget)) if v is not None}
        tags = {"width": trial.width, "seed": trial.seed, "status": TrialStatus.RUNNING, "is_centre": trial.is_centre,
                **tags, **extra, **self.tags}
        run = self.tracker.trial_run(self.study_id, self.phase, trial.trial_key, self.phase_run,
                                     {k: str(v) for k, v in tags.items()}, instance=self.instance,
                                     name=trial_run_name(trial.trial_key, dict(trial.hparams), number))
        self.tracker.log_params(run, trial.trial_config(self.spec))
        return run

    def log_steps(self, run: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Per-step metrics (every key of a row is a metric at its `step`), and the tags any of them raise."""
        kept = [dict(row) for row in rows]
        if not kept:
            return
        self.tracker.log_metrics(run, kept)
        flags = flag_tags(kept)
        if flags:
            self.tracker.set_tags(run, flags)

    def finish(self, run: str, report: TrialReport, *, run_status: str = "FINISHED",
               tags: Mapping[str, Any] | None = None) -> None:
        """End the run: how far it trained (`steps_done`), its lr multipliers and the model's run params, its
        status and why it ended so."""
        if report.steps:
            self.tracker.log_metrics(run, [{"step": report.steps, "steps_done": report.steps}])
        if report.lr_multipliers or report.run_params:
            self.tracker.log_params(run, {**{f"lr_mult.{k}": v for k, v in report.lr_multipliers.items()},
                                          **report.run_params})
        self.tracker.set_tags(run, {"status": str(report.status), **end_tags(report.status, report.message),
                                    **(tags or {})})
        self.tracker.finish(run, run_status)

    def attach_log(self, run: str, log: Path) -> None:
        """The trial's log file (`workers.quiet`): where it is as the run's `log` tag, and as an artifact when the
        model wrote anything (most write nothing)."""
        if not log.exists():
            return
        self.tracker.set_tags(run, {"log": str(log)})
        if log.stat().st_size:
            self.tracker.log_artifacts(run, [log])


def optuna_space(spec: StudySpec) -> dict[str, Any]:
    """The tune search's Optuna distributions (`StudySpec.search_space`), for either runner."""
    import optuna  # the driver's searcher only

    return {name: optuna.distributions.FloatDistribution(low, high, log=log)
            for name, (low, high, log) in spec.search_space().items()}


class Runner(Protocol):
    def run_phase(self, job: PhaseJob) -> pd.DataFrame:
        """Train (or finish) the job's trials; the phase's trial table."""
        ...


PER_TRIAL = {"status", "message", "rows", "lr_multipliers", "run_params", "batch"}  # a report's non-final fields


def trial_row(spec: StudySpec, trial: PlannedTrial, report: TrialReport) -> dict[str, Any]:
    """One trial-table row: the planned trial's columns and every final value of its report (a field added to
    `TrialReport` is a column); a batched trial's row names its batch."""
    planned = trial.columns(spec)
    ident = {k: planned.pop(k) for k in ("trial_id", "phase", "width", "seed")}
    finals = report.model_dump(exclude=PER_TRIAL)
    finals["eval_curve"] = json.dumps(report.eval_curve)  # one CSV cell (`analysis.optimizers`)
    if report.status not in LOSS_STATUSES:
        finals["eval_loss"] = math.nan
    return {**ident, "status": str(report.status), **finals, "is_centre": planned.pop("is_centre"),
            "message": report.message, **planned, **({"batch": report.batch} if report.batch else {})}


def batch_tag(batch: str, members: int) -> str:
    """The `batch` tag of a batched trial's run and its table row: which of the phase's batches, and its size."""
    return f"{batch} ({members} members)"


def gpu_memory() -> int | None:
    """The total memory of this process's CUDA device; None where torch sees none."""
    import torch

    return torch.cuda.mem_get_info()[1] if torch.cuda.is_available() else None


def local_members(spec: StudySpec, trials: list[PlannedTrial]) -> int:
    """K for batches trained in this process (`studies.members.auto_members`: one slot, this machine's GPU)."""
    memory = gpu_memory() if spec.train.device != "cpu" else None
    return auto_members(spec, trials, slots=1, memory_bytes=memory, gpu=memory is not None)


def trial_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows).sort_values("trial_id", kind="stable").reset_index(drop=True)


class _Journal:
    """The finished trials' rows of one experiment, one JSON line each (appended as each trial ends)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def rows(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        lines = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return {row["trial_id"]: row for row in lines}

    def add(self, row: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")


Train = Callable[[list[TrialConfig]], list[TrialReport]]  # `workers.train.train`


class InProcessRunner:
    """Train a phase's trials one batch (or one trial) after another in this process (no Ray); `train` defaults to
    `workers.train.train`."""

    def __init__(self, train: Train | None = None) -> None:
        self.train = train

    def run_phase(self, job: PhaseJob) -> pd.DataFrame:
        journal = _Journal(job.storage / job.experiment / "trials.jsonl")
        done = journal.rows()
        if job.planned is None:
            return trial_frame(self._search(job, journal, done))
        todo = [t for t in job.planned if t.trial_key not in done]
        groups = batches(job.spec, todo, local_members(job.spec, todo))
        for i, group in enumerate(groups):
            for row in self._run(job, group, journal, f"{i + 1}/{len(groups)}"):
                done[row["trial_id"]] = row
        return trial_frame([done[t.trial_key] for t in job.planned])

    def _search(self, job: PhaseJob, journal: _Journal, done: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """Optuna TPE (seeded by tune.seed, the defaults first), asked and told one trial at a time."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        spec, t = job.spec, job.spec.tune
        space = optuna_space(spec)
        study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=t.seed))
        defaults = spec.space.defaults()
        study.enqueue_trial({k: defaults[k] for k in space})
        rows = []
        for i in range(t.num_trials):
            asked = study.ask(space)
            trial = PlannedTrial.for_tune(spec, f"{i:05d}", asked.params)
            row = done.get(trial.trial_key) or self._run(job, [trial], journal)[0]
            finished = row["status"] == TrialStatus.COMPLETED and math.isfinite(row["eval_loss"])
            study.tell(asked, row["eval_loss"] if finished else spec.train.max_loss)
            rows.append(row)
        return rows

    def _run(self, job: PhaseJob, group: list[PlannedTrial], journal: _Journal, batch: str = ""
             ) -> list[dict[str, Any]]:
        """Train `group` (one trial, or a batch's members), each recorded as its own trial with its MLflow run; a
        group that raises is `failed` whole."""
        from workers.train import train

        recorder = job.recorder()
        tag = batch_tag(batch, len(group)) if len(group) > 1 else None
        runs = [recorder.start(trial, None, **({"batch": tag} if tag else {})) for trial in group]
        log = trial_log(job, group[0])  # a batch's members share the one they train in
        try:
            cfgs = [TrialConfig.model_validate(t.trial_config(job.spec)) for t in group]
            reports = self.train(cfgs) if self.train else train(cfgs, log=log)
        except Exception as exc:  # Tune's `failed`: the trials could not train (no retries in process)
            failed = TrialReport(status=TrialStatus.FAILED, message=one_line(exc))
            reports = [failed] * len(group)
            for run in runs:
                recorder.attach_log(run, log)
                recorder.finish(run, failed, run_status="FAILED", tags={"failure": failed.message})
        else:
            for run, report in zip(runs, reports, strict=True):
                recorder.log_steps(run, report.rows)
                recorder.attach_log(run, log)
                recorder.finish(run, report)
        rows = [trial_row(job.spec, t, r.model_copy(update={"batch": tag}))
                for t, r in zip(group, reports, strict=True)]
        for row in rows:
            _finished(job, row, journal)
        return rows


def trial_log(job: PhaseJob, trial: PlannedTrial) -> Path:
    """A trial's log file in process (`workers.quiet`): `<experiment>/logs/<trial key>.log`, beside the journal."""
    return job.storage / job.experiment / "logs" / f"{trial.trial_key.replace('/', '_')}.log"


def _finished(job: PhaseJob, row: dict[str, Any], journal: _Journal) -> None:
    """A trial trained in process is done: its row into the journal, the driver told."""
    journal.add(row)
    job.notify({"phase": job.phase, "trial_id": row["trial_id"], "status": row["status"],
                "eval_loss": row["eval_loss"] if math.isfinite(row["eval_loss"]) else None})
