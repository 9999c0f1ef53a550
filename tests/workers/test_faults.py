"""Faults in the work itself, through real Ray Tune and MLflow: a trial worker SIGKILLed mid-trial is retried from
its checkpoint (one run, each step logged once), a diverged trial keeps its reason, and a tracking server stopped
and restarted mid-phase delays the study's logging without losing a run."""

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient

from studies import load_catalog
from studies.spec import StudySpec
from tests.service.conftest import http_ok, launch_mlflow, ray_work, serving

pytestmark = pytest.mark.slow
STEPS, EVERY = 200, 20


def _spec() -> StudySpec:
    data = load_catalog("tiny").as_dict()
    data["name"] = "tiny-faults"
    # trial 1 is the space's default, an absurd lr that diverges at once; TPE's seed 5 draws lr ≈ 0.1 next
    data["space"]["lr"] = {"low": 1e-3, "high": 1e6, "log": True, "default": 1e6}
    data["tune"] |= {"num_trials": 2, "max_concurrent": 1, "seed": 5, "asha": {"enabled": False}}
    # lr ≈ 0.1 ends worse than uniform prediction on this tiny model: off, so that trial completes (and is killed)
    data["train"] |= {"steps": STEPS, "eval_every": EVERY, "log_every": EVERY, "uniform_margin": None}
    data["transfer"] = data["verify"] = None
    data["resources"]["checkpoint_every_s"] = 0  # a checkpoint at every evaluation: the kill finds one
    return StudySpec.model_validate(data)


# ray_work finds the trial workers: run_study runs in this process here, so no driver actor is among them
def _kill_once_trained(client: MlflowClient, experiment: str, data_dir: Path, killed: dict, stop: threading.Event,
                       where: str = ""):
    """SIGKILL the trial workers once a running trial's run (`where`: more of its tags) holds two evaluations (so
    a checkpoint exists)."""
    while not stop.is_set():
        found = client.get_experiment_by_name(experiment)
        runs = client.search_runs([found.experiment_id], f"tags.kind = 'trial' and tags.status = 'running'{where}") \
            if found else []
        for run in runs:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
            if steps and max(steps) >= 2 * EVERY:
                killed["at"], killed["run"], killed["pids"] = max(steps), run.info.run_id, ray_work(data_dir)
                for pid in killed["pids"]:
                    os.kill(pid, signal.SIGKILL)
                return
        time.sleep(0.1)


def _run_killed_once(spec: StudySpec, study_id: str, data_dir: Path, client: MlflowClient, where: str = ""):
    """Run the study in this process while `_kill_once_trained` watches it; its final state and what was killed."""
    from workers.driver import run_study

    killed, stop = {}, threading.Event()
    killer = threading.Thread(target=_kill_once_trained,
                              args=(client, spec.experiment_name(), data_dir, killed, stop, where), daemon=True)
    killer.start()
    try:
        state = run_study(spec, study_id)
    finally:
        stop.set()
        killer.join(30)
    return state, killed


def test_killed_trial_worker_is_retried_from_its_checkpoint(study_data_dir):
    spec = _spec()
    client = MlflowClient(f"sqlite:///{study_data_dir / 'mlflow.db'}")
    state, killed = _run_killed_once(spec, "faults", study_data_dir, client)
    assert killed.get("pids"), f"no trial worker was killed (trial finished first?): {killed}"
    assert state.status == "succeeded"

    table = pd.read_csv(study_data_dir / "studies" / "faults" / "artifacts" / "tune_trials.csv")
    assert sorted(table.status) == ["completed", "diverged"]
    diverged, completed = table[table.status == "diverged"].iloc[0], table[table.status == "completed"].iloc[0]
    assert diverged.message.startswith("loss became ") and " at step " in diverged.message
    assert state.phases["tune"].best_hparams["lr"] == pytest.approx(completed.lr)

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


def _mlflow_server(root: Path, port: int) -> subprocess.Popen:
    """A real MLflow tracking server on SQLite in `root`, on `port` (the outage test restarts it there)."""
    log = open(root / "mlflow.log", "a")  # noqa: SIM115 (the server's own; closed with the test process)
    proc = launch_mlflow(f"sqlite:///{root / 'mlflow.db'}", root, log, port)
    if not serving(proc, port, http_ok("/health"), "the MLflow server", root / "mlflow.log", 120):
        pytest.fail(f"another process took port {port} before the MLflow server could listen on it")
    return proc


def test_an_mlflow_outage_mid_phase_delays_logging_and_loses_no_run(study_data_dir, tmp_path, caplog):
    from tests.service.conftest import free_port
    from workers.driver import run_study

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    servers = [_mlflow_server(tmp_path, port)]
    data = load_catalog("tiny").as_dict()
    data["name"] = "tiny-outage"
    data["tune"] |= {"num_trials": 3, "max_concurrent": 1, "seed": 3, "asha": {"enabled": False}}
    data["train"] |= {"steps": 60}
    data["transfer"] = data["verify"] = None
    data["resources"]["tracking"] = {"tracking_uri": uri}
    spec = StudySpec.model_validate(data)
    outage = {}

    def stop_and_restart():
        client = MlflowClient(uri)
        while not client.search_runs([e.experiment_id for e in client.search_experiments()],
                                     "tags.kind = 'trial' and metrics.train_loss > 0"):
            time.sleep(0.2)
        os.killpg(servers[0].pid, signal.SIGTERM)
        servers[0].wait(30)
        outage["down"] = time.time()
        time.sleep(3)
        servers.append(_mlflow_server(tmp_path, port))
        outage["up"] = time.time()

    chaos = threading.Thread(target=stop_and_restart, daemon=True)
    chaos.start()
    try:
        with caplog.at_level("WARNING", logger="workers.mlflow_tracker"):
            state = run_study(spec, "outage")
        chaos.join(180)
        assert "down" in outage and "up" in outage, "the server was never stopped"
        assert state.status == "succeeded"
        assert any("retrying in" in r.getMessage() for r in caplog.records)  # the outage hit the study's logging
        # the restarted server, the same store: what the study logged through the outage
        client = MlflowClient(uri)
        found = client.get_experiment_by_name(spec.experiment_name())
        runs = client.search_runs([found.experiment_id], "tags.kind = 'trial' and tags.study_id = 'outage'")
        assert len(runs) == len({r.data.tags["trial_key"] for r in runs}) == 3
        assert all(r.info.status == "FINISHED" and r.data.tags["status"] == "completed" for r in runs)
        for run in runs:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
            assert sorted(steps) == [10, 20, 30, 40, 50, 60]
    finally:
        for server in servers:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(30)


def _batched_spec() -> StudySpec:
    data = load_catalog("tiny").as_dict()
    data["name"] = "tiny-batched-faults"
    data["tune"] |= {"num_trials": 1, "asha": {"enabled": False}}
    data["train"] |= {"steps": STEPS, "eval_every": EVERY, "log_every": EVERY, "uniform_margin": None}
    data["verify"] |= {"n_samples": 4, "centre_seeds": 1, "tolerance": 0.004, "steps": STEPS}  # centre: transfer's run
    data["resources"] |= {"checkpoint_every_s": 0, "batch_members": 8}
    return StudySpec.model_validate(data)


def test_a_killed_batch_worker_is_retried_from_its_checkpoint_and_no_member_is_lost_or_logged_twice(
        study_data_dir):
    """Verify's 4 samples train as one batched Tune trial; its worker is SIGKILLed mid-batch: the batch restarts
    from its checkpoint, each member keeps its one run (the batch tag beside the solo tags) and logs each step
    once, and the trial table holds every member."""
    spec = _batched_spec()
    client = MlflowClient(f"sqlite:///{study_data_dir / 'mlflow.db'}")
    state, killed = _run_killed_once(spec, "batch-faults", study_data_dir, client, " and tags.phase = 'verify'")
    assert killed.get("pids"), f"no batch worker was killed (the batch finished first?): {killed}"
    assert state.status == "succeeded"
    table = pd.read_csv(study_data_dir / "studies" / "batch-faults" / "artifacts" / "verify_trials.csv")
    samples = table[table.trial_id.str.startswith("verify-sample")]
    assert len(samples) == 4 and set(samples.status) == {"completed"}
    assert set(samples.batch) == {"1/1 (4 members)"}

    found = client.get_experiment_by_name(spec.experiment_name())
    runs = client.search_runs([found.experiment_id], "tags.kind = 'trial' and tags.study_id = 'batch-faults' and "
                              "tags.phase = 'verify'")
    members = [r for r in runs if r.data.tags["trial_key"].startswith("verify-sample")]
    assert len(members) == len({r.data.tags["trial_key"] for r in members}) == 4  # the retry kept each one run
    for run in members:
        assert run.data.tags["batch"] == "1/1 (4 members)" and run.data.tags["status"] == "completed"
        assert run.data.tags["retries"] == "1" and run.info.status == "FINISHED"
        assert EVERY <= int(run.data.tags["resumed_from_step"]) <= killed["at"]  # from a checkpoint, not step 0
        assert run.data.params["lr"] and run.data.metrics["steps_done"] == STEPS
        for key in ("train_loss", "eval_loss"):
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            assert sorted(steps) == list(range(EVERY, STEPS + 1, EVERY)), key  # each step once
