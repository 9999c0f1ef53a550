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
from pathlib import Path

import httpx
import pytest

from service import ray_head
from tests.conftest import DEFAULT_DATA

ADMIN, READ = "adm1n-7f3a9c2e5b", "r3ad-4d8e1b6a0c"  # test tokens; the auth tests scan every log for them


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    def check(self) -> str:
        return "fake executor"


class Server:
    """`ptctl serve` as a subprocess (its own session), logging to `log`; restartable."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log, self.port = env, log, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(self.port)],
                                         env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._ready, 180, f"ptctl serve on {self.url} (log: {self.log})")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"ptctl serve exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

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
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


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


@contextmanager
def running_mlflow(backend_uri: str, root: Path):
    """A real MLflow tracking server on `backend_uri`, artifacts and log under `root` (job execution off: ~10 s to
    start, 2 processes); yields its URL and log path."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    log = open(root / "mlflow.log", "w")  # noqa: SIM115 (closed at exit)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(["mlflow", "server", "--backend-store-uri", backend_uri,
                             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited:\n{(root / 'mlflow.log').read_text()[-3000:]}")
        try:
            return httpx.get(f"{url}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(up, 120, "the MLflow server")
        yield url, root / "mlflow.log"
    finally:
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
