"""The embedded Ray head listens where `ptctl serve` does by default: on 127.0.0.1 alone; its workers run at normal
priority.

Ray binds its GCS, raylet and workers to every interface unless the node's address is exactly 127.0.0.1, and it
swaps a given 127.0.0.1 for the machine's address on Linux (service/ray_head.py). The slow test starts the head as
`ptctl serve` does (`RayExecutor.connect`, in a process of its own), runs an actor on it, and reads the listening
sockets of the head's process group, of every process below it and of the connected client.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from service import ray_head
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CLIENT = """
import json, os, sys
from service.execution import RayExecutor
from service.settings import Settings
import ray

RayExecutor(Settings()).connect()


@ray.remote(num_cpus=0)
class Probe:
    def pid(self):
        return os.getpid(), os.nice(0)


probe = Probe.remote()
actor, nice = ray.get(probe.pid.remote())
print(json.dumps({"actor": actor, "nice": nice}), flush=True)
sys.stdin.read()  # hold the connection and the actor until the test has looked
"""

PRIVATE = """
import json, os, sys
from workers.ray.cluster import ensure_ray
import ray

ensure_ray()


@ray.remote(num_cpus=0)
def pid():
    return os.getpid(), os.nice(0)


task, nice = ray.get(pid.remote())
print(json.dumps({"task": task, "nice": nice}), flush=True)
sys.stdin.read()
"""


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # `::ffff:127.0.0.1`: an IPv6 socket bound to 127.0.0.1
    return (mapped or address).is_loopback


def _group(pgid: int) -> set[int]:
    """Every process of the process group `pgid` and every process below them (Ray's workers leave the group)."""
    members = set()
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members |= {proc.pid, *(c.pid for c in proc.children(recursive=True))}
        except (OSError, psutil.Error):
            continue
    return members


def _listening(pids: set[int]) -> list[tuple[str, str, int]]:
    """(process name, address, port) of each listening TCP socket of `pids`."""
    found = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.pid in pids and conn.status == psutil.CONN_LISTEN:
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.Error:
                name = str(conn.pid)
            found.append((name, conn.laddr.ip, conn.laddr.port))
    return found


@pytest.mark.slow  # a real Ray head (~10 s)
def test_the_embedded_head_listens_on_loopback_only(tmp_path):
    env = {**os.environ, "PTCTL_DATA_DIR": str(tmp_path), "PTCTL_RAY_NUM_CPUS": "1", "RAY_ADDRESS": "",
           "PYTHONPATH": str(ROOT)}
    env.pop("PTCTL_RAY_HOST", None)
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # the head must set the switch itself
    env.pop("RAY_worker_niceness", None)  # and its workers' priority
    client = subprocess.Popen([sys.executable, "-c", CLIENT], env=env, cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = client.stdout.readline()
        assert line, f"the client did not connect (exit {client.poll()})"
        actor, nice = json.loads(line)["actor"], json.loads(line)["nice"]
        assert nice == 0  # the workers at normal priority: Ray's default, 15, starves them beside any busy process
        head = ray_head.running(tmp_path)
        assert head is not None
        pids = _group(head.pgid)
        assert actor in pids  # the workers are looked at too
        sockets = _listening(pids | {client.pid})
        assert int(head.address.rsplit(":", 1)[1]) in {port for _, _, port in sockets}  # the GCS is among them
        assert {name for name, _, _ in sockets} >= {"gcs_server", "raylet"}
        assert [s for s in sockets if not _loopback(s[1])] == []
        assert head.address.startswith("127.0.0.1:")  # what it announces, so what a client dials
    finally:
        client.stdin.close()
        client.wait(60)
        ray_head.stop(tmp_path)


@pytest.mark.slow  # a real local Ray (~10 s)
def test_the_private_ray_of_the_cli_listens_on_loopback_only(tmp_path):
    """`ptctl study run` without RAY_ADDRESS starts a Ray of its own (`ensure_ray`): loopback too."""
    env = {**os.environ, "PTCTL_DATA_DIR": str(tmp_path), "RAY_ADDRESS": "", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    env.pop("RAY_worker_niceness", None)
    client = subprocess.Popen([sys.executable, "-c", PRIVATE], env=env, cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = client.stdout.readline()
        assert line, f"the private Ray did not start (exit {client.poll()})"
        pids = _group(client.pid)  # the CLI's session: Ray's processes are its children
        assert json.loads(line)["task"] in pids and json.loads(line)["nice"] == 0  # normal priority
        sockets = _listening(pids)
        assert {name for name, _, _ in sockets} >= {"gcs_server", "raylet"}
        assert [s for s in sockets if not _loopback(s[1])] == []
    finally:
        client.stdin.close()
        client.wait(60)


def test_the_head_command_follows_the_setting(tmp_path, monkeypatch):
    """127.0.0.1 by default with Ray's loopback switch; an operator's address without it (other machines may
    join, the token keeps others out); a name or 0.0.0.0 is refused naming the fix."""
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # an API process that once connected on loopback
    cmd, env = ray_head.launch(tmp_path, tmp_path / "token", 2, Settings().ray_host)
    assert "--node-ip-address=127.0.0.1" in cmd and env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    monkeypatch.setenv("PTCTL_RAY_HOST", "10.0.0.5")
    cmd, env = ray_head.launch(tmp_path, tmp_path / "token", 2, Settings().ray_host)
    assert "--node-ip-address=10.0.0.5" in cmd and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in env
    monkeypatch.setenv("PTCTL_RAY_HOST", "localhost")
    assert Settings().ray_host == "127.0.0.1"
    for bad in ("0.0.0.0", "head.example.org"):
        monkeypatch.setenv("PTCTL_RAY_HOST", bad)
        with pytest.raises(ValueError, match="PTCTL_RAY_HOST=.* leave it unset"):
            Settings()
