"""Faults in the work itself, through real Ray Tune and MLflow on SQLite: a trial worker SIGKILLed mid-trial is
retried from its checkpoint (one run, each step logged once), a diverged trial keeps its reason."""

import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient

from studies import load_catalog
from studies.spec import StudySpec

pytestmark = pytest.mark.slow
SYSTEM = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
STEPS, EVERY = 200, 20


def trial_workers(data_dir: Path) -> dict[int, str]:
    """pid → title of the Ray workers running trials for this data dir (they inherit PTCTL_DATA_DIR)."""
    found, marker = {}, f"PTCTL_DATA_DIR={data_dir}".encode()
    for entry in Path("/proc").iterdir():
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").strip()
            if title.startswith("ray::") and title not in SYSTEM and marker in (entry / "environ").read_bytes():
                found[int(entry.name)] = title
        except (OSError, ValueError):
            continue
    return found


def _spec() -> StudySpec:
    data = load_catalog("tiny").as_dict()
    data["name"] = "tiny-faults"
    # trial 1 is the space's default, an absurd lr that diverges at once; TPE's seed 5 draws lr ≈ 0.1 next
    data["space"]["lr"] = {"low": 1e-3, "high": 1e6, "log": True, "default": 1e6}
    data["tune"] |= {"num_trials": 2, "max_concurrent": 1, "seed": 5, "asha": {"enabled": False}}
    data["train"] |= {"steps": STEPS, "eval_every": EVERY, "log_every": EVERY}
    data["transfer"] = data["verify"] = None
    return StudySpec.model_validate(data)


def _kill_once_trained(client: MlflowClient, experiment: str, data_dir: Path, killed: dict, stop: threading.Event):
    """SIGKILL the trial worker once a running trial's run holds two evaluations (so a checkpoint exists)."""
    while not stop.is_set():
        found = client.get_experiment_by_name(experiment)
        runs = client.search_runs([found.experiment_id], "tags.kind = 'trial' and tags.status = 'running'") \
            if found else []
        for run in runs:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
            if steps and max(steps) >= 2 * EVERY:
                killed["at"], killed["run"], killed["pids"] = max(steps), run.info.run_id, trial_workers(data_dir)
                for pid in killed["pids"]:
                    os.kill(pid, signal.SIGKILL)
                return
        time.sleep(0.1)


def test_killed_trial_worker_is_retried_from_its_checkpoint(study_data_dir):
    from workers.driver import run_study

    spec = _spec()
    client = MlflowClient(f"sqlite:///{study_data_dir / 'mlflow.db'}")
    killed, stop = {}, threading.Event()
    killer = threading.Thread(target=_kill_once_trained,
                              args=(client, spec.experiment_name(), study_data_dir, killed, stop), daemon=True)
    killer.start()
    try:
        state = run_study(spec, "faults")
    finally:
        stop.set()
        killer.join(30)
    assert killed.get("pids"), f"no trial worker was killed (trial finished first?): {killed}"
    assert state.status == "succeeded"

    table = pd.read_csv(study_data_dir / "studies" / "faults" / "artifacts" / "tune_trials.csv")
    assert sorted(table.status) == ["completed", "diverged"]
    diverged, completed = table[table.status == "diverged"].iloc[0], table[table.status == "completed"].iloc[0]
    assert diverged.message.startswith("loss became ") and " at step " in diverged.message
    assert state.phases["tune"]["best_hparams"]["lr"] == pytest.approx(completed.lr)

    found = client.get_experiment_by_name(spec.experiment_name())
    runs = client.search_runs([found.experiment_id], "tags.kind = 'trial' and tags.study_id = 'faults'")
    assert len(runs) == len({r.data.tags["trial_key"] for r in runs}) == 2  # the retry kept its one run
    by_status = {r.data.tags["status"]: r for r in runs}
    assert by_status["diverged"].data.tags["diverged_reason"] == diverged.message
    run = by_status["completed"]
    assert run.info.run_id == killed["run"] and run.info.status == "FINISHED"
    assert run.data.tags["retries"] == "1" and run.data.tags["last_failure"]
    assert EVERY <= int(run.data.tags["resumed_from_step"]) <= killed["at"]  # from a checkpoint, not step 0
    for key in ("train_loss", "eval_loss"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert sorted(steps) == list(range(EVERY, STEPS + 1, EVERY)), key  # each step once
