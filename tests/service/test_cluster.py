"""Studies on a multi-node Ray cluster whose worker nodes do not see the driver's data directory.

A head with no CPUs for trials and two worker nodes, each a separate `ray start --address ...` with its own temp
dir and its own custom resource, started in a mount namespace of its own (`unshare -m`) where the data directory
is an empty tmpfs: what a trial needs must reach it through Ray, not the disk. `ptctl study run` joins the
cluster through `RAY_ADDRESS`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from studies.spec import CATALOG_DIR
from tests.service._cli import data_dir, ptctl

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_ids(env: dict[str, str]) -> dict[str, str]:
    """Each live node's id by its custom resource (the head: `head`)."""
    probe = ("import json, ray; ray.init(); print(json.dumps({next((r for r in n['Resources'] if r.startswith("
             "'node_')), 'head'): n['NodeID'] for n in ray.nodes() if n['Alive']})); ray.shutdown()")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else {}


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """A real S3-compatible server on loopback (moto's) with a bucket `ptctl`: the AWS environment every node gets."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        for _ in range(60):
            try:
                urllib.request.urlopen(urllib.request.Request(f"{env['AWS_ENDPOINT_URL']}/ptctl", method="PUT"))
                break
            except OSError:
                time.sleep(0.5)
        yield env
    finally:
        os.killpg(server.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3) -> Iterator[tuple[Cluster, Path]]:
    root = Path(tempfile.mkdtemp(prefix="ptctl-mn-"))  # Ray's socket paths must stay short
    data = data_dir(tmp_path_factory.mktemp("cluster"), "data")
    token = root / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "PTCTL_DATA_DIR": str(data), **s3}
    env.pop("RAY_AUTH_TOKEN", None)
    procs = [subprocess.Popen(["ray", "start", "--head", "--block", "--num-cpus=0", f"--port={port}",
                               "--include-dashboard=false", f"--temp-dir={root / 'head'}"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)]
    address = f"127.0.0.1:{port}"
    time.sleep(5)
    for name in WORKERS:  # the data directory is an empty tmpfs in the worker node's mount namespace
        join = (f"mount -t tmpfs tmpfs {data} && exec ray start --block --address={address} --num-cpus=1 "
                f"--resources='{{\"{name}\": 1}}' --temp-dir={root / name}")
        procs.append(subprocess.Popen(["unshare", "-m", "sh", "-c", join], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    client = {**env, "RAY_ADDRESS": address}
    deadline, ids = time.monotonic() + 180, {}
    while time.monotonic() < deadline and set(ids) != {"head", *WORKERS}:
        time.sleep(3)
        ids = _node_ids(client)
    try:
        assert set(ids) == {"head", *WORKERS}, f"the cluster did not come up: {ids}"
        yield Cluster(address, {k: client[k] for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", *s3)},
                      {k: v for k, v in ids.items() if k != "head"}, ids["head"]), data
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def _spec(tmp_path: Path, name: str, seed: int = 0, **resources: float) -> Path:
    data = yaml.safe_load((CATALOG_DIR / "tiny.yaml").read_text())
    data.update(name=name, transfer=None, verify=None)
    data["tune"].update(num_trials=2, seed=seed)
    data["resources"].update(resources)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_trials_run_on_the_worker_nodes(cluster, tmp_path):
    """Short trials (no checkpoint) need nothing from the driver's disk: each trial's run names the worker node
    it trained on, never the head."""
    from mlflow import MlflowClient

    c, data = cluster
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = ptctl(["study", "run", str(_spec(tmp_path, "mn-ok"))], data, uri, **c.env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = MlflowClient(uri).search_runs(
        [e.experiment_id for e in MlflowClient(uri).search_experiments()], "tags.kind = 'trial'")
    nodes = {r.data.tags.get("node_id") for r in runs}
    assert len(runs) == 2 and nodes <= set(c.workers.values()) and c.head not in nodes, (nodes, c)


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
