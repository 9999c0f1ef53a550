"""The embedded Ray head: a `ray start --head` process group that outlives the API process.

Without `RAY_ADDRESS` the service must not `ray.init()` a local cluster inside uvicorn's process: that cluster,
and every study driver on it, would die with the web process. The head runs in its own session, recorded in
`<data dir>/ray/head.json`; a restarted API reuses it while its processes live. It uses token auth with its own
token (`<data dir>/ray/auth_token`, mode 0600; `use_token`) and free ports. By default it listens on 127.0.0.1
alone, which Ray honours only with `LOOPBACK_ENV` set in the head and every process that connects
(`workers.ray.keep_loopback`). Only this head is ever stopped (`stop`, by its process group), never with
`ray stop`, which kills every Ray process of the user. This module imports no Ray. More: docs/cluster.md.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)
MAX_TEMP_DIR = 40  # Ray's socket paths (<temp>/session_<date>_<pid>/sockets/plasma_store) must stay < 108 chars
LOOPBACK = "127.0.0.1"  # the head's default address: Ray compares it as this exact string
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # keeps Ray from swapping 127.0.0.1 for the machine's address


@dataclass(frozen=True)
class Head:
    address: str  # host:port of the head's GCS
    pgid: int  # the process group of all its processes
    temp_dir: str  # Ray's --temp-dir (sessions, logs)
    token_path: str  # RAY_AUTH_TOKEN_PATH


def ray_dir(data_dir: Path) -> Path:
    return data_dir / "ray"


def temp_dir(data_dir: Path) -> Path:
    """`<data dir>/ray/tmp`, or a short path under the system temp dir when that one is too long."""
    preferred = ray_dir(data_dir) / "tmp"
    if len(str(preferred)) <= MAX_TEMP_DIR:
        return preferred
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"ptctl-ray-{digest}"


def token_path(data_dir: Path) -> Path:
    """The head's auth token file, created (random, 0600) on first use."""
    path = ray_dir(data_dir) / "auth_token"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


def use_token(path: Path | str) -> None:
    """Make this process (and its children) authenticate to the embedded head."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    os.environ.pop("RAY_AUTH_TOKEN", None)  # would take precedence over the file


def _record(data_dir: Path) -> Path:
    return ray_dir(data_dir) / "head.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _group_alive(head: Head) -> bool:
    """True if a process of the head's group still runs with the head's temp dir on its command line."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: trust the process group alone
        try:
            os.killpg(head.pgid, 0)
            return True
        except OSError:
            return False
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            pgid = int(stat.rsplit(")", 1)[1].split()[2])
            if pgid == head.pgid and head.temp_dir.encode() in (entry / "cmdline").read_bytes():
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """One API process at a time decides whether to start a head."""
    ray_dir(data_dir).mkdir(parents=True, exist_ok=True)
    with open(ray_dir(data_dir) / "head.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def running(data_dir: Path) -> Head | None:
    """The recorded head if its processes are still there."""
    path = _record(data_dir)
    if not path.exists():
        return None
    head = Head(**json.loads(path.read_text()))
    return head if _group_alive(head) else None


def ensure(data_dir: Path, num_cpus: int | None = None, host: str = LOOPBACK) -> Head:
    """The running embedded head, started first on `host` if there is none (takes ~5–10 s)."""
    with _locked(data_dir):
        head = running(data_dir)
        if head is not None:
            log.info("reusing the embedded Ray head at %s", head.address)
            if head_host(head) != host:
                log.warning("the embedded Ray head runs at %s, not on PTCTL_RAY_HOST=%s: run `ptctl ray-head stop` "
                            "(it ends the studies running on it) and restart `ptctl serve` to move it", head.address,
                            host)
            return head
        return _start(data_dir, num_cpus or os.cpu_count() or 1, host)


def head_host(head: Head) -> str:
    """The address the head announces (and, when it is 127.0.0.1, the only one it listens on)."""
    return head.address.rsplit(":", 1)[0].strip("[]")


def launch(tmp: Path, token: Path, num_cpus: int, host: str) -> tuple[list[str], dict[str, str]]:
    """The `ray start --head` command line and its environment."""
    nice = os.environ.get("RAY_worker_niceness", "0")  # noqa: SIM112  # Ray's own name; why 0: workers/ray/__init__
    env = {**head_env(os.environ), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_worker_niceness": nice, **(LOOPBACK_ENV if host == LOOPBACK else {})}
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--port=0", f"--num-cpus={num_cpus}",
           "--disable-usage-stats", "--include-dashboard=false", f"--node-ip-address={host}",
           f"--temp-dir={tmp}", f"--dashboard-host={LOOPBACK}", f"--dashboard-port={_free_port()}",
           f"--dashboard-agent-listen-port={_free_port()}"]
    return cmd, env


def _start(data_dir: Path, num_cpus: int, host: str) -> Head:
    tmp, token = temp_dir(data_dir), token_path(data_dir)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "ray_current_cluster").unlink(missing_ok=True)
    cmd, env = launch(tmp, token, num_cpus, host)
    log.info("starting the embedded Ray head: %s", " ".join(cmd))
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        raise RuntimeError(f"`ray start --head` did not finish in 180 s; see its logs under {tmp}") from None
    address_file = tmp / "ray_current_cluster"
    if proc.returncode != 0 or not address_file.exists():
        _kill_group(proc.pid)
        raise RuntimeError(f"`ray start --head` failed (exit {proc.returncode}):\n{out[-2000:]}\n"
                           "Fix the cause above, or point RAY_ADDRESS at a running Ray cluster")
    head = Head(address_file.read_text().strip(), proc.pid, str(tmp), str(token))
    _record(data_dir).write_text(json.dumps(asdict(head)))
    log.info("embedded Ray head up at %s (process group %d, %d CPUs)", head.address, head.pgid, num_cpus)
    return head


def head_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the head (and so every Ray worker it spawns) gets: the API's, less the API's own
    settings (tokens, database URL: workers are handed what they need explicitly) and Ray's address/token/host."""
    dropped = {"RAY_AUTH_TOKEN", "RAY_ADDRESS", *LOOPBACK_ENV}  # the loopback switch: set by `launch` alone
    return {k: v for k, v in environ.items() if k not in dropped and (not k.startswith("PTCTL_") or k in PASSED)}


PASSED = frozenset({"PTCTL_DATA_DIR", "PTCTL_ARTIFACT_ROOT"})  # the ptctl settings Ray's workers may see


def _kill_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM the group, SIGKILL what is left after `grace_s` (gcs_server and raylet ignore SIGTERM)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def stop(data_dir: Path) -> bool:
    """Stop the embedded head of `data_dir` (and every study driver on it); False if none ran.
    Its Ray files stay under the data dir, or are removed with the head if they were in the /tmp fallback."""
    with _locked(data_dir):
        head = running(data_dir)
        _record(data_dir).unlink(missing_ok=True)
        if head is None:
            return False
        _kill_group(head.pgid)
        if not Path(head.temp_dir).is_relative_to(data_dir):  # the short fallback under /tmp: ours alone
            shutil.rmtree(head.temp_dir, ignore_errors=True)
        return True
