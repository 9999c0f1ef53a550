"""Ray Tune glue: the one module that imports Ray.

Every phase is a Ray Tune experiment stored under the study's folder, so a killed driver can
`Tuner.restore` it. Its name carries the study id (`experiment_name`): Tune stages a driver's
experiment files in `<Ray session>/artifacts/<start time, to the second>/<experiment name>/`, so two
studies whose phases start in the same second under one phase name would share (and restore) each
other's trials. `tune` searches with OptunaSearch (TPE) and ASHA; `transfer`, `verify` and
`validate` run a fixed list of planned trials (`studies.plan`) as a grid. Trials report to Tune at
every evaluation; `MlflowTrials`, a callback in the driver process, writes their nested runs.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's console boxes; the CLI draws its own progress

import optuna  # noqa: E402
import pandas as pd  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from ray import tune  # noqa: E402
from ray.tune.schedulers import ASHAScheduler  # noqa: E402
from ray.tune.search.optuna import OptunaSearch  # noqa: E402

from studies.spec import StudySpec  # noqa: E402
from workers.errors import InfrastructureLost  # noqa: E402
from workers.tracking import Tracker  # noqa: E402
from workers.train import TrialConfig, train_trial  # noqa: E402

log = logging.getLogger(__name__)
OBJECTIVE = "objective"  # eval loss; the loss ceiling (train.max_loss) for a diverged trial
FINAL_KEYS = ("status", "eval_loss", "best_eval_loss", "steps", "tokens", "wall_time_s", "params", "message")


def ensure_ray() -> None:
    """Join `RAY_ADDRESS` when set (e.g. `auto` or `ray://head:10001`), else start a private local Ray."""
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or "local"
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=False)
        except (ConnectionError, ray.exceptions.RayError) as exc:
            raise InfrastructureLost(f"cannot reach Ray at RAY_ADDRESS={address!r} ({exc}); start the cluster "
                                     "or unset RAY_ADDRESS for a local Ray, then re-run to resume") from exc


def experiment_name(study_id: str, phase: str, stage: str | None = None) -> str:
    """The Tune experiment (storage folder and driver staging folder) of one study's phase or compare stage."""
    return f"{study_id}.{phase}" + (f".{stage}" if stage else "")


def has_gpus() -> bool:
    return ray.cluster_resources().get("GPU", 0) > 0


def planned_trial(spec: StudySpec, phase: str, config: dict[str, Any], trial_id: str) -> dict[str, Any]:
    """The trial behind a Tune config: a planned trial (grid phases) or a TPE suggestion (tune)."""
    if "trial" in config:
        return config["trial"]
    hparams = spec.space.complete(dict(config))
    return {"trial_key": f"tune-{trial_id}", "phase": phase, "width": spec.tune.base_width,
            "seed": spec.tune.seed, "hparams": hparams, "is_centre": False}


METRIC_PREFIXES = ("lr_", "train_loss", "eval_loss", "stream_val_loss", "tokens", "tau.")  # logged per step
COMPARE_KEYS = ("family", "budget", "role", "tuned_at", "train_flops")  # compare trials' extra table columns


def trial_config(spec: StudySpec, trial: dict[str, Any]) -> dict[str, Any]:
    if "config" in trial:  # a compare trial: its family's own config, planned by `studies.plan.compare_trials`
        return trial["config"]
    return spec.trial_config(trial["width"], trial["hparams"], trial["seed"], spec.steps_for(trial["phase"]),
                             trial.get("parametrization"))


def _trainable(config: dict[str, Any], spec_dict: dict[str, Any], phase: str, cpus: float) -> None:
    """One Tune trial: train, report each evaluation, then one final result with the status."""
    spec = StudySpec.model_validate(spec_dict)
    trial = planned_trial(spec, phase, config, tune.get_context().get_trial_id())
    cfg = TrialConfig.from_dict(trial_config(spec, trial))
    torch.set_num_threads(max(1, int(cpus)))

    def progress(row: dict[str, Any]) -> None:
        if "eval_loss" in row and row["step"] < cfg.steps:  # the last step comes with the final result
            tune.report({**row, OBJECTIVE: row["eval_loss"]})

    result = train_trial(cfg, progress)
    last = result.history[-1] if result.history else {"step": result.steps}
    final = {k: getattr(result, k) for k in FINAL_KEYS}
    objective = result.eval_loss if result.status == "completed" else cfg.max_loss
    tune.report({**last, **final, "step": result.steps, OBJECTIVE: objective})


class MlflowTrials(tune.Callback):
    """Nested MLflow runs for the trials of one phase, written from the driver (one SQLite writer)."""

    def __init__(self, spec: StudySpec, study_id: str, phase: str, phase_run: str, tracking_uri: str,
                 tags: dict[str, Any] | None = None, instance: str | None = None) -> None:
        self.spec_dict, self.study_id, self.phase, self.instance = spec.as_dict(), study_id, phase, instance
        self.phase_run, self.uri = phase_run, tracking_uri
        self.tags = dict(tags or {})  # on every trial run; a "phase" here overrides `phase` (compare's tunes)
        self._tracker: Tracker | None = None
        self._runs: dict[str, str] = {}
        self.notify: Callable[[dict[str, Any]], None] | None = None  # told of each finished trial

    def __getstate__(self) -> dict:  # Tune pickles callbacks with the experiment; clients stay behind
        return {**self.__dict__, "_tracker": None, "_runs": {}, "notify": None}

    @property
    def tracker(self) -> Tracker:
        if self._tracker is None:
            self._tracker = Tracker(StudySpec.model_validate(self.spec_dict).experiment_name(), self.uri)
        return self._tracker

    def _run(self, trial) -> str:
        if trial.trial_id not in self._runs:
            spec = StudySpec.model_validate(self.spec_dict)
            planned = planned_trial(spec, self.phase, trial.config, trial.trial_id)
            tags = {"width": planned["width"], "seed": planned["seed"], "status": "running",
                    "is_centre": planned["is_centre"], "ray_trial_id": trial.trial_id,
                    **{k: planned[k] for k in ("family", "budget") if k in planned}, **self.tags}
            run = self.tracker.trial_run(self.study_id, self.phase, planned["trial_key"], self.phase_run,
                                         {k: str(v) for k, v in tags.items()}, instance=self.instance)
            self.tracker.log_params(run, trial_config(spec, planned))
            self._runs[trial.trial_id] = run
        return self._runs[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self._run(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        row = {k: v for k, v in result.items() if k == "step" or k.startswith(METRIC_PREFIXES)}
        self.tracker.log_metrics(self._run(trial), [row])
        collapsed = sorted(k.rsplit(".", 1)[1] for k, v in row.items() if k.startswith("tau.collapse.") and v)
        if collapsed:  # TauGPT's collapse warning (analysis.taumode), also visible in the runs table
            self.tracker.set_tags(self._run(trial), {"taumode_collapse": f"step {row['step']}: {', '.join(collapsed)}"})

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        last = trial.last_result or {}
        self._end(trial, last.get("status", "stopped"), "FINISHED", last.get("eval_loss"))  # no status: ASHA

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._end(trial, "failed", "FAILED", None)

    def _end(self, trial, status: str, run_status: str, eval_loss: float | None) -> None:
        self.tracker.set_tags(self._run(trial), {"status": status})
        self.tracker.finish(self._run(trial), run_status)
        if self.notify is not None:
            self.notify({"phase": self.phase, "trial_id": trial.trial_id, "status": status, "eval_loss": eval_loss})


def run_phase(spec: StudySpec, phase: str, storage: Path, callback: MlflowTrials,
              planned: list[dict] | None = None, *, experiment: str) -> pd.DataFrame:
    """Run (or restore and finish) one phase's Tune experiment `storage/experiment`; return its trial table.

    `experiment` must be unique to the study (`experiment_name`). Ray itself failing (the cluster
    lost, a node's raylet gone) raises `InfrastructureLost`: the study is interrupted, not failed."""
    ensure_ray()
    res = spec.resources
    gpus = res.gpus_per_trial if phase == "tune" else (
        res.transfer_gpus if res.transfer_gpus is not None else (1.0 if has_gpus() else 0.0))
    trainable = tune.with_resources(
        tune.with_parameters(_trainable, spec_dict=spec.as_dict(), phase=phase, cpus=res.cpus_per_trial),
        {"cpu": res.cpus_per_trial, "gpu": gpus})
    path = storage / experiment
    try:
        if tune.Tuner.can_restore(path):
            log.info("restoring the %s phase from %s", phase, path)
            tuner = tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(trainable, param_space=_param_space(planned), tune_config=_tune_config(spec, phase),
                               run_config=tune.RunConfig(name=experiment, storage_path=str(storage),
                                                         callbacks=[callback], verbose=0, log_to_file=True))
        grid = tuner.fit()
    except (ray.exceptions.RaySystemError, ray.exceptions.ActorDiedError, ray.exceptions.NodeDiedError,
            ray.exceptions.RpcError) as exc:
        raise InfrastructureLost(f"Ray failed during the {phase} phase ({type(exc).__name__}: {exc}); "
                                 "re-run to resume it") from exc
    return trial_table(spec, phase, grid)


def _param_space(planned: list[dict] | None) -> dict[str, Any]:
    return {} if planned is None else {"trial": tune.grid_search(planned)}


def _tune_config(spec: StudySpec, phase: str) -> tune.TuneConfig:
    if phase != "tune":  # trial actors are reused: no process start, torch import or data load per trial
        return tune.TuneConfig(metric=OBJECTIVE, mode="min", reuse_actors=True)
    t = spec.tune
    space = {name: optuna.distributions.FloatDistribution(r.low, r.high, log=r.log)
             for name, r in spec.space.searched().items()}
    defaults = spec.space.defaults()
    searcher = OptunaSearch(space=space, metric=OBJECTIVE, mode="min", sampler=optuna.samplers.TPESampler(seed=t.seed),
                            points_to_evaluate=[{k: defaults[k] for k in space}])
    scheduler = ASHAScheduler(time_attr="step", max_t=spec.steps_for("tune"), grace_period=t.asha.grace_steps,
                              reduction_factor=t.asha.reduction_factor) if t.asha.enabled else None
    return tune.TuneConfig(metric=OBJECTIVE, mode="min", search_alg=searcher, scheduler=scheduler,
                           num_samples=t.num_trials, max_concurrent_trials=t.max_concurrent, reuse_actors=True)


def trial_table(spec: StudySpec, phase: str, grid) -> pd.DataFrame:
    """The tidy trial table (see `analysis`) of a finished Tune experiment, one row per trial."""
    rows = []
    for result in grid:
        m = result.metrics or {}
        trial_id = m.get("trial_id") or Path(result.path).name
        planned = planned_trial(spec, phase, result.config, trial_id)
        status = m.get("status") or ("failed" if result.error else "stopped")
        eval_loss = m.get("eval_loss", math.nan) if status in ("completed", "stopped") else math.nan
        rows.append({"trial_id": planned["trial_key"], "phase": phase, "width": planned["width"],
                     "seed": planned["seed"], "status": status, "eval_loss": eval_loss,
                     "best_eval_loss": m.get("best_eval_loss", eval_loss), "steps": m.get("step", 0),
                     "tokens": m.get("tokens", 0), "wall_time_s": m.get("wall_time_s", m.get("time_total_s")),
                     "params": m.get("params"), "is_centre": planned["is_centre"],
                     "parametrization": planned.get("parametrization", spec.model.parametrization),
                     **{k: planned[k] for k in COMPARE_KEYS if k in planned}, **planned["hparams"]})
    return pd.DataFrame(rows).sort_values("trial_id", kind="stable").reset_index(drop=True)
