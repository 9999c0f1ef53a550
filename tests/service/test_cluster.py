"""Studies on a multi-node Ray cluster whose worker nodes do not see the driver's data directory.

A head with no CPUs for trials and two worker nodes, each a separate `ray start --address ...` with its own temp
dir and its own custom resource, started in a mount namespace of its own (`unshare -m`) where the data directory
is an empty tmpfs: what a trial needs must reach it through Ray, not the disk. `ptctl study run` joins the
cluster through `RAY_ADDRESS`. The tests that kill worker nodes (kill -9 of a node's process group) take `whole`,
which first starts again any node a test before them killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from studies.spec import CATALOG_DIR
from tests.service._cli import data_dir, ptctl
from tests.service.conftest import ADMIN, READ, Server, free_port, running_mlflow, start_serving, wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                                 reason="a worker node in a mount namespace of its own needs root and unshare")]
WORKERS = ("node_a", "node_b")


@dataclass
class Cluster:
    address: str
    env: dict[str, str]  # what a client of the cluster needs: the address and the auth token
    workers: dict[str, str]  # custom resource → the worker node's id
    head: str  # the head node's id
    processes: dict[str, subprocess.Popen]  # custom resource → its `ray start --block` (a process group)
    join: Callable[[str], subprocess.Popen]  # start the worker node of this custom resource (again)


def _node_ids(env: dict[str, str]) -> dict[str, str]:
    """Each live node's id by its custom resource (the head: `head`)."""
    probe = ("import json, ray; ray.init(); print(json.dumps({next((r for r in n['Resources'] if r.startswith("
             "'node_')), 'head'): n['NodeID'] for n in ray.nodes() if n['Alive']})); ray.shutdown()")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else {}


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A real S3-compatible server on loopback (moto's) with a bucket `ptctl`: the AWS environment every node gets."""
    log = tmp_path_factory.mktemp("s3") / "moto.log"

    def launch(port: int) -> subprocess.Popen:
        with open(log, "a") as out:
            return subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def bucket_made(port: int) -> bool:
        try:
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/ptctl", method="PUT"))
            return True
        except OSError:
            return False

    server, port = start_serving(launch, bucket_made, log, "moto's S3 server")
    try:
        yield {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
               "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    finally:
        os.killpg(server.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3) -> Iterator[tuple[Cluster, Path]]:
    root = Path(tempfile.mkdtemp(prefix="ptctl-mn-"))  # Ray's socket paths must stay short
    data = data_dir(tmp_path_factory.mktemp("cluster"), "data")
    token = root / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "PTCTL_DATA_DIR": str(data), **s3}
    env.pop("RAY_AUTH_TOKEN", None)
    # a node killed -9 is marked dead after 3 missed health checks 1 s apart (≈ 5 s), not Ray's default 5 × 3 s
    detect = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
    procs = [subprocess.Popen(["ray", "start", "--head", "--block", "--num-cpus=0", f"--port={port}",
                               "--include-dashboard=false", f"--temp-dir={root / 'head'}"], env={**env, **detect},
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)]
    address = f"127.0.0.1:{port}"
    time.sleep(5)

    def join(name: str) -> subprocess.Popen:  # the data directory is an empty tmpfs in the node's mount namespace
        gpus = 1 if name == "node_a" else 0  # node_a says it has a GPU: placement only, trials train on CPU
        command = (f"mount -t tmpfs tmpfs {data} && exec ray start --block --address={address} --num-cpus=1 "
                   f"--num-gpus={gpus} --resources='{{\"{name}\": 1}}' --temp-dir={root / name}")
        return subprocess.Popen(["unshare", "-m", "sh", "-c", command], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, start_new_session=True)

    nodes = {name: join(name) for name in WORKERS}
    client = {**env, "RAY_ADDRESS": address}
    deadline, ids = time.monotonic() + 180, {}
    while time.monotonic() < deadline and set(ids) != {"head", *WORKERS}:
        time.sleep(3)
        ids = _node_ids(client)
    try:
        assert set(ids) == {"head", *WORKERS}, f"the cluster did not come up: {ids}"
        yield Cluster(address, {k: client[k] for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", *s3)},
                      {k: v for k, v in ids.items() if k != "head"}, ids["head"], nodes, join), data
    finally:  # kill -9, as the tests kill nodes: `ray start --block` takes 32 s to exit on SIGTERM
        procs += nodes.values()  # as they are now: a test may have started a node again
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _kill(c: Cluster, *names: str) -> None:
    """kill -9 of each named worker node: its `ray start`, raylet and workers (one process group)."""
    for name in names:
        os.killpg(c.processes[name].pid, signal.SIGKILL)
        c.processes[name].wait()


def _restart(c: Cluster, *names: str) -> None:
    """Start the named (lost) worker nodes again and wait until each is live; their new ids in `c.workers`."""
    old = {name: c.workers[name] for name in names}
    for name in names:
        c.processes[name] = c.join(name)
    deadline, ids = time.monotonic() + 180, {}
    while time.monotonic() < deadline and not all(ids.get(n, old[n]) != old[n] for n in names):
        time.sleep(2)
        ids = _node_ids({**os.environ, **c.env})
    assert all(ids.get(n, old[n]) != old[n] for n in names), f"{names} did not join again: {ids}"
    c.workers.update({n: ids[n] for n in names})


@pytest.fixture
def whole(cluster) -> tuple[Cluster, Path]:
    """The module's cluster with both worker nodes live: those a test before killed are started again."""
    c, _ = cluster
    lost = [name for name, proc in c.processes.items() if proc.poll() is not None]
    if lost:
        _restart(c, *lost)
    return cluster


def _spec(tmp_path: Path, name: str, seed: int = 0, **resources: float) -> Path:
    data = yaml.safe_load((CATALOG_DIR / "tiny.yaml").read_text())
    data.update(name=name, transfer=None, verify=None)
    data["tune"].update(num_trials=2, seed=seed)
    data["resources"].update(resources)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_trial_storage_no_worker_can_reach_is_named_with_its_fix(cluster, tmp_path):
    """Checkpointing trials on nodes that cannot see the study's storage path fail; the study's error says that
    storage failed and how to fix it, not that the lr range diverged."""
    c, data = cluster
    spec = _spec(tmp_path, "mn-storage", seed=1, checkpoint_every_s=0, max_retries=1)  # not the other's tune
    done = ptctl(["study", "run", str(spec)], data, f"sqlite:///{tmp_path / 'mlflow.db'}", **c.env)
    error = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1 and error.startswith("error:"), done.stdout[-3000:]
    assert "(2 failed of 2)" in error and "a Ray node cannot reach the study's storage" in error, error
    assert "PTCTL_DATA_DIR" in error and "space.lr" not in error and "max_loss" not in error, error


def _certified_spec(tmp_path: Path, name: str, **resources: Any) -> Path:
    """tiny with a transfer and a verify phase, and nothing that depends on timing: TPE one trial at a time (its
    suggestions see every result in the same order), ASHA off."""
    data = yaml.safe_load((CATALOG_DIR / "tiny.yaml").read_text())
    data["name"] = "mn-same"
    data["tune"].update(num_trials=2, max_concurrent=1, seed=3, asha={"enabled": False})
    data["verify"].update(n_samples=3, centre_seeds=2)
    data["resources"].update(resources)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _study_outcome(data: Path, uri: str) -> dict[str, Any]:
    """What a reader takes from a finished study: its trials (tune's by hparams: Tune names them afresh), their
    losses, the certificate, the trial runs' names and the study run's artifacts."""
    import pandas as pd
    from mlflow import MlflowClient

    folder = next((data / "studies").glob("mn-same-*"))
    trials = pd.read_csv(folder / "artifacts" / "trials.csv")
    rows = sorted((r.phase, r.trial_id if r.phase != "tune" else f"lr={r.lr:.12g}", r.status, round(r.eval_loss, 5))
                  for r in trials.itertuples())
    cert = json.loads((folder / "artifacts" / "certificate.json").read_text())
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments)  # the tracking store holds this study alone
    study = next(r for r in runs if r.data.tags.get("kind") == "study")
    names = sorted(r.info.run_name for r in runs if r.data.tags.get("kind") == "trial")
    return {"trials": rows, "certificate": {k: cert[k] for k in ("verdict", "n_better", "centre_rank", "n_samples")},
            "trial runs": names, "artifacts": sorted(a.path for a in client.list_artifacts(study.info.run_id)),
            "study": folder.name}


def test_the_plan_counts_the_clusters_cpus(cluster, tmp_path):
    """`ptctl study plan` with RAY_ADDRESS estimates for the cluster's CPUs (two worker nodes of one CPU each, a
    head of none), not this machine's."""
    c, data = cluster
    done = ptctl(["study", "plan", str(_spec(tmp_path, "planned"))], data, **c.env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = " ".join(done.stdout.split())
    assert "the Ray cluster's 2 CPUs and 1 GPUs counted" in said, said
    assert "(2 CPUs ÷ resources.cpus_per_trial 1" in said, said


def test_a_study_on_the_cluster_is_the_same_study_as_on_one_node(cluster, tmp_path):
    """The same spec on the cluster — trials on the worker nodes, Tune's state and checkpoints in S3, MLflow a
    server that stores the artifacts — and on one local Ray node with MLflow on SQLite: the same study id, the same
    trials with the same eval losses (to 1e-5), the same certificate, the same trial runs and study artifacts."""
    c, data = cluster
    with running_mlflow(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path) as (uri, _):
        spread = _certified_spec(tmp_path, "cluster", checkpoint_every_s=0, storage="s3://ptctl/same")
        done = ptctl(["study", "run", str(spread)], data, uri, **c.env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        on_cluster = _study_outcome(data, uri)
    alone = data_dir(tmp_path, "one-node")
    done = ptctl(["study", "run", str(_certified_spec(tmp_path, "alone", checkpoint_every_s=0))], alone)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    on_one_node = _study_outcome(alone, f"sqlite:///{alone / 'mlflow.db'}")
    assert on_cluster == on_one_node
    assert (tmp_path / "artifacts").exists()  # the server stored the artifacts, not the driver's folder alone


def test_checkpoints_in_s3_let_trials_on_nodes_without_a_shared_disk_finish(cluster, tmp_path):
    """The same checkpointing trials with `resources.storage` an S3 URI: Tune's experiment state and every
    checkpoint go to the bucket, which every node reaches, and the study succeeds on the worker nodes."""
    import pyarrow.fs as pafs
    from mlflow import MlflowClient

    c, data = cluster
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = _spec(tmp_path, "mn-s3", seed=2, checkpoint_every_s=0, max_retries=1, storage="s3://ptctl/studies")
    done = ptctl(["study", "run", str(spec)], data, uri, **c.env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    study = next(p.name for p in (data / "studies").glob("mn-s3-*"))
    bucket = pafs.S3FileSystem(endpoint_override=c.env["AWS_ENDPOINT_URL"], access_key="test", secret_key="test",
                               region="us-east-1")
    stored = [f.path for f in bucket.get_file_info(pafs.FileSelector(f"ptctl/studies/{study}", recursive=True))]
    assert any("checkpoint_" in p for p in stored) and any(p.endswith("tuner.pkl") for p in stored), stored[:20]
    assert not (data / "studies" / study / "ray" / f"{study}.tune" / "tuner.pkl").exists()  # nothing on this disk
    runs = MlflowClient(uri).search_runs(
        [e.experiment_id for e in MlflowClient(uri).search_experiments()], "tags.kind = 'trial'")
    assert len(runs) == 2 and {r.data.tags.get("node_id") for r in runs} <= set(c.workers.values())


def test_trials_asking_for_a_gpu_land_only_on_the_node_that_has_one(cluster, tmp_path):
    """Half a GPU per trial: both tune trials train on node_a (the one with `--num-gpus=1`), never on node_b nor the
    head. Short trials (no checkpoint) need nothing from the driver's disk."""
    c, data = cluster
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = ptctl(["study", "run", str(_spec(tmp_path, "mn-gpu", seed=4, gpus_per_trial=0.5))], data, uri, **c.env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert {r.data.tags.get("node_id") for r in _trial_runs(uri)} == {c.workers["node_a"]}


def test_a_study_through_the_api_trains_on_the_worker_nodes(cluster, tmp_path):
    """`ptctl serve` joined to the cluster (RAY_ADDRESS): a study posted to it succeeds, its driver on the API's
    node (it writes the study folder the API reads) and its trials on the worker nodes."""
    c, data = cluster
    uri = f"sqlite:///{data / 'api-mlflow.db'}"
    env = {**os.environ, **c.env, "PTCTL_DATA_DIR": str(data), "MLFLOW_TRACKING_URI": uri, "PTCTL_RECONCILE_S": "1",
           "PTCTL_API_TOKENS": f"admin:{ADMIN},read:{READ}", "PTCTL_TOKEN": "", "PTCTL_SERVER": ""}
    server = Server(env, tmp_path / "api.log")
    spec = yaml.safe_load(_spec(tmp_path, "mn-api", seed=5).read_text())
    try:
        server.start()
        with server.client() as api:
            posted = api.post("/studies", json=spec)
            assert posted.status_code == 201, posted.text
            study_id = posted.json()["id"]
            wait_for(lambda: api.get(f"/studies/{study_id}").json()["status"] not in ("pending", "running"), 600,
                     "the study's end")
            assert api.get(f"/studies/{study_id}").json()["status"] == "succeeded", (tmp_path / "api.log").read_text()
    finally:
        server.stop()
    nodes = {r.data.tags.get("node_id") for r in _trial_runs(uri)}
    assert len(_trial_runs(uri)) == 2 and nodes <= set(c.workers.values()), nodes


def _trial_runs(uri: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, "tags.kind = 'trial'") if experiments else []


def _logged_once(uri: str, runs: list) -> bool:
    """Each run's train_loss history holds each step once (a restarted trial logged no step twice)."""
    from mlflow import MlflowClient

    steps = [[m.step for m in MlflowClient(uri).get_metric_history(r.info.run_id, "train_loss")] for r in runs]
    return all(s and len(s) == len(set(s)) for s in steps)


def _long(path: Path, **phases: dict) -> Path:
    """The spec at `path` with evaluations (and checkpoints) every 20 steps, no ASHA, and `phases`' updates."""
    spec = yaml.safe_load(path.read_text())
    spec["train"].update(eval_every=20, log_every=20)
    spec["tune"]["asha"]["enabled"] = False
    for phase, update in phases.items():
        spec[phase] = {**(spec[phase] or {}), **update}
    path.write_text(yaml.safe_dump(spec))
    return path


def _start(path: Path, data: Path, uri: str, c: Cluster, **env: str) -> subprocess.Popen:
    """`ptctl study run` of `path` on the cluster, in the background; the tracking store's tables made first (two
    processes creating them at once collide: `_until_reported` reads the store while the study starts)."""
    _trial_runs(uri)
    full = {**os.environ, "PTCTL_DATA_DIR": str(data), "MLFLOW_TRACKING_URI": uri, "COLUMNS": "200", **c.env, **env}
    return subprocess.Popen([sys.executable, "-m", "service.cli", "study", "run", str(path)], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _until_reported(run: subprocess.Popen, uri: str, phase: str, nodes: set[str]) -> None:
    """Wait until a trial of `phase` on each of `nodes` has logged a step (and so saved a checkpoint)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and run.poll() is None:
        reported = {r.data.tags.get("node_id") for r in _trial_runs(uri)
                    if r.data.tags.get("phase") == phase and "train_loss" in r.data.metrics}
        if nodes <= reported:
            return
        time.sleep(1)
    pytest.fail(f"the study ended or stalled before its {phase} trials on {nodes} reported")


def test_a_worker_node_lost_mid_trial_is_survived_from_its_checkpoint_in_s3(whole, tmp_path):
    """kill -9 of one worker node (its raylet and workers) while its trial trains: the trial restarts on the other
    node from its last checkpoint in S3, the study succeeds, and each trial has one run that logged each step once."""
    c, data = whole
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = _long(_spec(tmp_path, "mn-lost", seed=3, checkpoint_every_s=0, max_retries=2, storage="s3://ptctl/studies"),
                 tune={"steps": 300})
    run = _start(path, data, uri, c)
    _until_reported(run, uri, "tune", {c.workers["node_b"]})
    _kill(c, "node_b")
    out, _ = run.communicate(timeout=900)
    assert run.returncode == 0, out[-3000:]
    runs = _trial_runs(uri)
    assert len(runs) == 2 and {r.data.tags["status"] for r in runs} == {"completed"}, out[-2000:]
    assert _logged_once(uri, runs)
    moved = next(r for r in runs if r.data.tags.get("retries"))
    assert moved.data.tags["node_id"] == c.workers["node_a"] and int(moved.data.tags["resumed_from_step"]) >= 20


def test_a_worker_node_lost_mid_verify_is_survived_from_its_checkpoint_in_s3(whole, tmp_path):
    """The same kill -9 during the verify phase (one verify trial per node): node_b's verify trial restarts on
    node_a from its last checkpoint in S3; the study succeeds, each verify trial with one run that logged each step
    once."""
    c, data = whole
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = _long(_spec(tmp_path, "mn-verify", seed=6, checkpoint_every_s=0, max_retries=2, transfer_gpus=0,
                       storage="s3://ptctl/studies"),
                 verify={"width": 16, "n_samples": 1, "centre_seeds": 1, "tolerance": 0.004, "steps": 300})
    run = _start(path, data, uri, c)
    _until_reported(run, uri, "verify", {c.workers["node_b"]})
    _kill(c, "node_b")
    out, _ = run.communicate(timeout=900)
    assert run.returncode == 0, out[-3000:]
    verify = [r for r in _trial_runs(uri) if r.data.tags["phase"] == "verify"]
    assert len(verify) == 2 and {r.data.tags["status"] for r in verify} == {"completed"}, out[-2000:]
    assert _logged_once(uri, verify)
    moved = next(r for r in verify if r.data.tags.get("retries"))
    assert moved.data.tags["node_id"] == c.workers["node_a"] and int(moved.data.tags["resumed_from_step"]) >= 20


def test_every_worker_node_lost_interrupts_the_study_and_resumes_when_nodes_are_back(whole, tmp_path):
    """kill -9 of both worker nodes mid-tune: after PTCTL_NO_NODE_S with no node for its trials the study ends
    `interrupted`, naming the cause and the fix; with the nodes started again, re-running it resumes both trials
    from their checkpoints in S3 and succeeds, each trial one run that logged each step once."""
    c, data = whole
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = _long(_spec(tmp_path, "mn-none", seed=7, checkpoint_every_s=0, max_retries=2, storage="s3://ptctl/studies"),
                 tune={"steps": 400})
    run = _start(path, data, uri, c, PTCTL_NO_NODE_S="5")
    _until_reported(run, uri, "tune", set(c.workers.values()))
    _kill(c, *WORKERS)
    out, _ = run.communicate(timeout=600)
    error = next((line for line in out.splitlines() if line.startswith("error:")), out[-3000:])
    assert run.returncode == 1 and "(tune phase) interrupted" in error, error
    assert "no live node that can run the tune phase's trials (1 CPU each)" in error and "ray start" in error, error
    study = next(p for p in (data / "studies").glob("mn-none-*"))
    assert json.loads((study / "state.json").read_text())["status"] == "interrupted"
    _restart(c, *WORKERS)
    done = _start(path, data, uri, c)
    out, _ = done.communicate(timeout=900)
    assert done.returncode == 0, out[-3000:]
    runs = _trial_runs(uri)
    assert len(runs) == 2 and {r.data.tags["status"] for r in runs} == {"completed"}, out[-2000:]
    moved = [r for r in runs if r.data.tags.get("retries")]  # those not finished before the kill (all, most times)
    assert moved and all(int(r.data.tags["resumed_from_step"]) >= 20 for r in moved) and _logged_once(uri, runs)
