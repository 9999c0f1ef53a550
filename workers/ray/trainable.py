"""One Tune trial: `_trainable` trains a planned trial, a TPE suggestion or a batch of planned trials (as one
batched model) and reports each member's `TrialReport`; `study_trainable` registers it for a study's phase.

Faults: every evaluation's report carries a checkpoint (`workers.train`'s resumable state), and a trial whose
worker dies is restarted from it up to `resources.max_retries` times (Tune's `FailureConfig`) before it is
recorded `failed`.

What the trial's model prints and warns goes to `trial.log` in the trial's folder of the experiment's storage, beside
its checkpoints (`trial_log`), not to Ray's worker logs (or a terminal they are forwarded to); each result names it
(`log`: the runs' tag).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
import torch
from ray import tune

from analysis.table import TrialStatus
from studies.plan import PlannedTrial
from studies.spec import StudySpec, TrialConfig
from workers.models import family
from workers.ray.ledger import content_key
from workers.report import Row, TrialReport, dump_reports, load_reports
from workers.train import train

if TYPE_CHECKING:
    from ray.train._internal.storage import StorageContext  # what `tune.get_context().get_storage()` returns

OBJECTIVE = "objective"  # eval loss; the loss ceiling (train.max_loss) for a diverged trial
STATE_FILE = "state.pt"  # a trial checkpoint: `workers.train`'s resumable state, torch.save'd
TRIAL_LOG = "trial.log"  # what the trial's model printed and warned (`workers.quiet`), in the trial's folder


def planned_trial(spec: StudySpec, phase: str, config: dict[str, Any], trial_id: str) -> PlannedTrial:
    """The trial behind a Tune config: a planned trial (grid phases, `PlannedTrial.as_dict`) or a TPE suggestion."""
    if "trial" in config:
        return PlannedTrial.from_dict(config["trial"])
    if phase != "tune":  # never a default tune trial in its place
        raise ValueError(f"a {phase} trial's Tune config holds no planned trial (got keys {sorted(config)}): the "
                         f"phase's experiment does not hold its plan; delete its folder under the study's ray/ and "
                         "re-run to resume")
    return PlannedTrial.for_tune(spec, trial_id, config)


class CheckpointClock:
    """Whether an evaluation should carry a checkpoint: retries are allowed and `every_s` seconds passed since the
    last one (or the trial's start); `every_s` = 0: every evaluation."""

    def __init__(self, max_retries: int, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled, self.every_s, self.clock = max_retries > 0, every_s, clock
        self.last = clock()

    def __call__(self) -> bool:
        now = self.clock()
        if not self.enabled or now - self.last < self.every_s:
            return False
        self.last = now
        return True


REPORT_EVERY_S = 10.0  # the longest a trial's evaluations wait to be reported (MLflow's live view lags this much)


class ReportClock:
    """Whether an evaluation at `step` is reported to Tune now, or kept for the next report.

    Tune's function trainables report synchronously: the training thread waits at every report until the driver
    has processed it (scheduler, searcher, callbacks) and asks for the next, so each report is a pause of one
    driver round trip. Evaluations are therefore reported in batches: at the first evaluation at or past each ASHA
    rung (`rungs`; its decisions see what they saw when every evaluation was reported), when `every_s` passed
    since the last report, and with the final result; the rows in between ride along (`REPORTS`)."""

    def __init__(self, rungs: list[float], every_s: float = REPORT_EVERY_S, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.rungs, self.every_s, self.clock = sorted(rungs), every_s, clock
        self.last = clock()

    def __call__(self, step: int) -> bool:
        now, at_rung = self.clock(), bool(self.rungs) and step >= self.rungs[0]
        self.rungs = [r for r in self.rungs if r > step]
        if at_rung or now - self.last >= self.every_s:
            self.last = now
            return True
        return False


REPORTS = "reports"  # a Tune result's one field of ptctl's: its members' `TrialReport`s as JSON (`dump_reports`)
LAST = "trainable_left"  # only a trial's last report carries it


def batch_of(config: dict[str, Any]) -> list[PlannedTrial] | None:
    """The members of a batched Tune trial (`{"trial": {"members": [...], "batch": tag}}`); None for one trial."""
    trial = config.get("trial")
    if not isinstance(trial, dict) or "members" not in trial:
        return None
    return [PlannedTrial.from_dict(m) for m in trial["members"]]


def members_of(spec: StudySpec, phase: str, config: dict[str, Any], trial_id: str) -> list[PlannedTrial]:
    """The planned trials a Tune trial trains: a batch's members, or the one trial."""
    return batch_of(config) or [planned_trial(spec, phase, config, trial_id)]


def final_reports(last: dict[str, Any], members: int) -> list[TrialReport]:
    """Each member's report at a Tune trial's end (`last`: its last result): the final ones, or, for a trial ASHA
    stopped (its last report a running one, or none), `stopped` where it got to."""
    reports = load_reports(last.get(REPORTS)) or [TrialReport(status=TrialStatus.RUNNING, steps=last.get("step", 0))
                                                  ] * members
    return [r.model_copy(update={"status": TrialStatus.STOPPED}) if r.status == TrialStatus.RUNNING else r
            for r in reports]


def _trainable(config: dict[str, Any], spec_dict: dict[str, Any], phase: str, cpus: float,
               finished: dict[str, dict[str, Any]] | None = None) -> None:
    """One Tune trial: train its trials (one, or a batch's members as one batched model; from the last checkpoint
    when Tune restarts it), report their evaluations, then one final result with each member's report.

    Evaluations are reported in batches (`ReportClock`) and carry a checkpoint when retries are allowed and
    `checkpoint_every_s` of training passed since the last one: each checkpoint costs a save, a copy to storage and
    (with num_to_keep) Tune's snapshot of the whole experiment, so a short trial makes none and a long one one per
    interval."""
    entered = time.time()  # with `left`: the trainable's own span (the orchestration benchmark splits the overhead)
    record = (finished or {}).get(content_key(config))
    if record is not None:  # finished before its driver was lost: its results again, nothing trained
        for result in record["results"]:
            tune.report(result)
        return
    family(spec_dict["model"]["family"])  # a plugin's family missing on this node: named, with the fix
    spec = StudySpec.model_validate(spec_dict)
    members = members_of(spec, phase, config, tune.get_context().get_trial_id())
    cfgs = [TrialConfig.model_validate(m.trial_config(spec)) for m in members]
    torch.set_num_threads(max(1, int(cpus)))
    resume = _checkpointed_state()
    where: dict[str, Any] = {"resumed_from": resume["step"]} if resume else {}
    where["node_id"] = ray.get_runtime_context().get_node_id()  # where it trains: a tag on its runs
    storage = tune.get_context().get_storage()
    log, where["log"] = trial_log(storage)
    due = CheckpointClock(spec.resources.max_retries, spec.resources.checkpoint_every_s)
    report_now = ReportClock(spec.asha_rungs() if phase == "tune" else [])
    kept: list[list[Row]] = [[] for _ in members]  # each member's rows since the last report

    def progress(i: int, row: Row) -> None:
        kept[i].append(row)

    def send(step: int, reports: list[TrialReport], objective: float, state: dict[str, Any] | None = None,
             **extra: Any) -> None:
        result = {"step": step, **where, OBJECTIVE: objective, **extra,
                  REPORTS: dump_reports([r.model_copy(update={"rows": rows}) for r, rows in zip(reports, kept,
                                                                                               strict=True)])}
        for rows in kept:
            rows.clear()
        if state is None:
            tune.report(result)
            return
        with tempfile.TemporaryDirectory(prefix="ptctl-ckpt-") as folder:  # tune.report copies it to storage
            torch.save(state, Path(folder) / STATE_FILE)
            tune.report(result, checkpoint=tune.Checkpoint.from_directory(folder))

    def checkpoint(rows: dict[int, Row], state: dict[str, Any]) -> None:
        save = due()
        if not (report_now(state["step"]) or save):
            return
        running = [TrialReport(status=TrialStatus.RUNNING, eval_loss=m["eval_loss"], best_eval_loss=m["best"],
                               train_loss=m["train_loss"], steps=state["step"], tokens=state["tokens"],
                               wall_time_s=state["wall_time_s"] / len(members)) for m in state["members"]]
        losses = [r["eval_loss"] for r in rows.values()]
        send(state["step"], running, min(losses, default=cfgs[0].max_loss), state if save else None)

    try:
        reports = train(cfgs, progress=progress, checkpoint=checkpoint, resume=resume, log=log)
    finally:
        keep_log(storage, log)
    done = [r.eval_loss for r in reports if r.status == TrialStatus.COMPLETED]
    send(max(r.steps for r in reports), reports, min(done, default=cfgs[0].max_loss),
         trainable_entered=entered, trainable_left=time.time())  # trainable_left: LAST


def trial_log(storage: StorageContext) -> tuple[Path, str]:
    """Where the trial's log file (`workers.quiet`) is written, and where it is kept (its runs' `log` tag): beside
    its checkpoints in the experiment's storage; storage that is no local folder (S3) gets it written on the node,
    in the trial's working directory, and copied there when the trial ends (`keep_log`)."""
    fs, kept = storage.storage_filesystem, f"{storage.trial_fs_path}/{TRIAL_LOG}"
    if fs.type_name == "local":
        return Path(kept), kept
    return Path(storage.trial_working_directory) / TRIAL_LOG, f"{fs.type_name}://{kept}"


def keep_log(storage: StorageContext, log: Path) -> None:
    """Copy a log written on the node to the experiment's storage (nothing to do for a local folder's)."""
    fs = storage.storage_filesystem
    if fs.type_name != "local" and log.exists():
        with fs.open_output_stream(f"{storage.trial_fs_path}/{TRIAL_LOG}") as out:
            out.write(log.read_bytes())


def _checkpointed_state() -> dict[str, Any] | None:
    """The state of this trial's last checkpoint, if Tune restarts (retry) or restores (resume) it."""
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        state: dict[str, Any] = torch.load(Path(folder) / STATE_FILE, map_location="cpu", weights_only=True)
        return state


def study_trainable(spec: StudySpec, phase: str, experiment: str, gpus: float,
                    finished: dict[str, dict[str, Any]] | None = None) -> Callable[..., Any]:
    """`_trainable` with this study's spec and phase, registered with Ray Tune under a name of its own.

    Tune registers a trainable in a registry shared by the whole Ray job, under the function's name, and the
    service's drivers are detached actors of one job: under the shared name `_trainable`, concurrent studies
    replaced each other's registration, so a trial could start with another study's spec, or fail with
    `OwnerDiedError` once that study's driver had exited. `experiment` (`experiment_name`: study id and phase)
    names it instead; a restore registers the same name again."""
    res = spec.resources
    trainable: Callable[..., Any] = tune.with_resources(
        tune.with_parameters(_trainable, spec_dict=spec.as_dict(), phase=phase, cpus=res.cpus_per_trial,
                             finished=finished or {}),
        {"cpu": res.cpus_per_trial, "gpu": gpus})
    trainable._name = f"ptctl.{experiment}"  # type: ignore[attr-defined]  # Tune's registry name (`_name` first)
    return trainable
