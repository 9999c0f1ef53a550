"""Service test fixtures: a fake executor for in-process tests; for the slow ones a real MLflow server,
a real `ptctl serve` (uvicorn) on 127.0.0.1 and the real embedded Ray head it starts, shared by the
whole session and torn down at its end (only the head this session started is stopped)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path

import httpx
import pytest

from service import ray_head
from service.execution import LAUNCH_S
from tests.conftest import DEFAULT_DATA

ADMIN, READ = "adm1n-7f3a9c2e5b", "r3ad-4d8e1b6a0c"  # test tokens; the auth tests scan every log for them


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


EVENT_S = 300  # the ceiling on an event a loaded 2-core machine may be slow to show (a stop, an interruption)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5, seen=None):
    """Poll `predicate` until it returns something truthy; fail naming `what` (and `seen()`, what there is
    instead) after `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}" + (f"; instead: {seen()}" if seen else ""))


def listeners(port: int) -> set[int]:
    """The process groups holding a listening TCP socket on `port`, read from /proc."""
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    sockets.add(f"socket:[{fields[9]}]")
    groups: set[int] = set()
    for entry in Path("/proc").iterdir() if sockets else ():
        with suppress(OSError, ValueError):
            if entry.name.isdigit() and any(os.readlink(fd) in sockets for fd in (entry / "fd").iterdir()):
                groups.add(os.getpgid(int(entry.name)))
    return groups


SYSTEM = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def ray_work(data_dir: Path) -> dict[int, str]:
    """pid → title of the Ray workers doing this data dir's work (drivers, trials), found through /proc:
    every driver and trial gets PTCTL_DATA_DIR from the driver's runtime_env."""
    found = {}
    marker = f"PTCTL_DATA_DIR={data_dir}".encode()
    for entry in Path("/proc").iterdir():
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").strip()
            if title.startswith("ray::") and title not in SYSTEM and marker in (entry / "environ").read_bytes():
                found[int(entry.name)] = title
        except (OSError, ValueError):
            continue
    return found


def service_state(api: httpx.Client, data_dir: Path):
    """A `seen` for `wait_for` over the session's service: every study's status and phase, the Ray work
    of `data_dir` and the machine's load (what a timed-out wait found instead)."""
    def seen() -> str:
        listed = api.get("/studies", params={"limit": 500}).json()["items"]
        studies = [(s["id"], s["status"], s["phase"]) for s in listed]
        return f"studies {studies}; Ray work {sorted(ray_work(data_dir).values())}; load {os.getloadavg()}"
    return seen


def start_serving(launch, ready, log: Path, what: str, timeout: float = 180) -> tuple[subprocess.Popen, int]:
    """`launch(port)` (a server in a session of its own) on a free port, once `serving`; returns the process and the
    port. The port is picked before the server binds it, so another process (another pytest worker's server) may
    take it meanwhile: then the server exits, the answers on that port are the stranger's and do not count, and a
    fresh port is tried."""
    for _ in range(3):
        port = free_port()
        proc, up = launch(port), False
        try:
            up = serving(proc, port, ready, what, log, timeout)
        finally:
            if not up:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        if up:
            return proc, port
    pytest.fail(f"{what}: other processes took three free ports before it could listen on them (log: {log})")


def serving(proc: subprocess.Popen, port: int, ready, what: str, log: Path, timeout: float) -> bool:
    """Wait until `proc`'s own process group listens on `port` and `ready(port)`: True; False if it exited while
    another process listens there (the port was taken). Fails on its exit otherwise, or after `timeout` s."""
    state = wait_for(partial(_serving, proc, port, ready, what, log), timeout, f"{what} on port {port} (log: {log})")
    return state == "up"


def _serving(proc: subprocess.Popen, port: int, ready, what: str, log: Path) -> str | None:
    """"up" once `proc`'s group listens on `port` and `ready(port)`; "taken" if it exited while another process
    listens there; None meanwhile."""
    holders = listeners(port)
    if proc.poll() is not None:
        if holders:
            return "taken"
        pytest.fail(f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    return "up" if proc.pid in holders and ready(port) else None


def http_ok(path: str):
    """A `ready` for `start_serving`: the server answers 200 on `path`."""
    def ready(port: int) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code == 200
        except httpx.TransportError:
            return False
    return ready


class FakeExecutor:
    """An executor that starts nothing: records which studies would have a live driver."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.launched: list[str] = []

    def connect(self) -> None:
        pass

    def alive(self, study_id: str) -> bool:
        return study_id in self.live

    def start(self, study_id: str) -> str:
        self.live.add(study_id)
        return study_id

    def launch(self, handle, spec, study_id: str, attempt: int) -> None:
        self.launched.append(study_id)

    def idle(self, study_id: str) -> bool:
        return study_id in self.live and study_id not in self.launched

    def stop(self, study_id: str) -> bool:
        was = study_id in self.live
        self.live.discard(study_id)
        return was

    def lost(self) -> str | None:
        return None

    def release(self) -> list[str]:
        return []

    def check(self) -> str:
        return "fake executor"


class Server:
    """`ptctl serve` as a subprocess (its own session), logging to `log`; restartable (on a fresh port)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log, self.url = env, log, ""
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        def launch(port: int) -> subprocess.Popen:
            with open(self.log, "a") as out:
                return subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                                        env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

        self.proc, port = start_serving(launch, http_ok("/readyz"), self.log, "ptctl serve")
        self.url = f"http://127.0.0.1:{port}"

    def kill(self) -> None:
        """SIGKILL the API process only (the Ray head and the drivers live in other sessions)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self, token: str | None = ADMIN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # a submit answers once its driver has begun, which may take LAUNCH_S on a busy machine
        return httpx.Client(base_url=self.url, headers=headers, timeout=LAUNCH_S + 30)


@pytest.fixture(scope="session")
def service_dir(tmp_path_factory) -> Path:
    """A data directory of the service tests' own (the engine tests' tune phases must not be reused here),
    linking the shared corpus cache like `isolated_data_dir`."""
    path = tmp_path_factory.mktemp("ptctl-service")
    (DEFAULT_DATA / "corpora").mkdir(parents=True, exist_ok=True)
    (path / "corpora").symlink_to(DEFAULT_DATA / "corpora")
    return path


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL server (`tests/service/postgres.py`) shared by the session; each test takes a
    database of its own (`postgres.fresh_database(name)`). Skips without the binaries, fails under CI."""
    from tests.service.postgres import Postgres, require_install

    server = Postgres(require_install())
    try:
        yield server.start()
    finally:
        server.stop()


def launch_mlflow(backend_uri: str, root: Path, log, port: int) -> subprocess.Popen:
    """`mlflow server` on `backend_uri` and 127.0.0.1:`port` in a session of its own, artifacts under `root`,
    writing to the open file `log` (job execution off: ~10 s to start, 2 processes)."""
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    return subprocess.Popen(["mlflow", "server", "--backend-store-uri", backend_uri,
                             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@contextmanager
def running_mlflow(backend_uri: str, root: Path):
    """A real MLflow tracking server on `backend_uri` (`launch_mlflow`), artifacts and log under `root`, on a free
    port; yields its URL and log path."""
    root.mkdir(parents=True, exist_ok=True)
    log = open(root / "mlflow.log", "w")  # noqa: SIM115 (closed at exit)
    launch = partial(launch_mlflow, backend_uri, root, log)
    proc = None
    try:
        proc, port = start_serving(launch, http_ok("/health"), root / "mlflow.log", "the MLflow server")
        yield f"http://127.0.0.1:{port}", root / "mlflow.log"
    finally:
        if proc is not None:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        log.close()


@pytest.fixture(scope="session")
def mlflow_server(service_dir):
    """A real MLflow tracking server on SQLite."""
    root = service_dir / "mlflow-server"
    with running_mlflow(f"sqlite:///{root / 'mlflow.db'}", root) as server:
        yield server


@pytest.fixture(scope="session")
def server(service_dir, mlflow_server):
    """The API with tokens, the MLflow server, and the embedded Ray head (2 CPUs) it starts."""
    env = {**os.environ, "PTCTL_DATA_DIR": str(service_dir), "MLFLOW_TRACKING_URI": mlflow_server[0],
           "PTCTL_API_TOKENS": f"admin:{ADMIN},read:{READ}", "PTCTL_RAY_NUM_CPUS": "2",
           "PTCTL_RECONCILE_S": "1", "RAY_ADDRESS": "", "PTCTL_TOKEN": "", "PTCTL_SERVER": ""}
    srv = Server(env, service_dir / "api.log")
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()
        ray_head.stop(service_dir)  # the head this session started, by its process group
