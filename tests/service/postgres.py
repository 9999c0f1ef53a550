"""A throwaway PostgreSQL server for the tests, from the binaries the `pgserver` wheel ships (a test extra:
`make install` provides them on any machine pip reaches, no system package or Docker needed).

Only the wheel's files are used (`pgserver/pginstall/{bin,lib,share}`), never a server on the PATH: the tests
run against what the project installs. PostgreSQL refuses to run as root; as root the binaries are copied to a
temp dir any user can enter (the interpreter may live under a 0700 home) and the server runs as `nobody`.
Without the binaries the tests that need them skip, except under `CI=true`, where they fail.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.service.conftest import start_serving

MISSING = ("no PostgreSQL binaries: the `pgserver` test extra ships them; run `make install` "
           "(pip install -e '.[test]')")


def wheel_install() -> Path | None:
    """The PostgreSQL install inside the `pgserver` wheel, if it is installed (found without importing it)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    return root if (root / "bin" / "postgres").exists() else None


def require_install() -> Path:
    """The wheel's install, or fail (under CI) / skip (elsewhere) naming the fix."""
    root = wheel_install()
    if root is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(MISSING)
        pytest.skip(MISSING)
    return root


class Postgres:
    """One PostgreSQL cluster in a temp dir, listening on 127.0.0.1:`port` (trust auth, fsync off)."""

    def __init__(self, install: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ptctl-pg-"))  # not under pytest's 0700 tmp: `nobody` enters it
        self.root.chmod(0o755)
        self.port, self.user = 0, "ptctl"  # picked by `start`
        self.as_root = os.geteuid() == 0
        self.bin = install / "bin"
        if self.as_root:  # a copy `nobody` can reach, each part at its place relative to the others (the
            site = install.parent.parent  # binaries find libpq in ../../../pgserver.libs, the rest in ../lib, ../share)
            for part in ("pgserver/pginstall/bin", "pgserver/pginstall/lib", "pgserver/pginstall/share",
                         "pgserver.libs"):
                if (site / part).exists():
                    shutil.copytree(site / part, self.root / "pg" / part, symlinks=True)
            self.bin = self.root / "pg" / "pgserver" / "pginstall" / "bin"
            self.data = self.root / "data"
            self.data.mkdir()
            nobody = pwd.getpwnam("nobody")
            os.chown(self.data, nobody.pw_uid, nobody.pw_gid)
            self._ids: dict[str, Any] = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
        else:
            self.data, self._ids = self.root / "data", {}
        self.log = self.root / "postgres.log"
        self.proc: subprocess.Popen | None = None
        self.start_s = 0.0

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / args[0]), *args[1:]], check=True, capture_output=True, text=True,
                              cwd=self.root, **self._ids)

    def start(self) -> Postgres:
        began = time.monotonic()
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", self.user, "-E", "UTF8", "--no-sync")
        self.log.touch()
        if self.as_root:
            os.chown(self.log, self._ids["user"], self._ids["group"])

        def launch(port: int) -> subprocess.Popen:
            self.port = port
            with open(self.log, "a") as log:
                return subprocess.Popen(
                    [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(port), "-h", "127.0.0.1",
                     "-k", str(self.data), "-c", "fsync=off", "-c", "full_page_writes=off",
                     "-c", "max_connections=200"],
                    stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True, **self._ids)

        self.proc, _ = start_serving(launch, self._answers, self.log, "the throwaway PostgreSQL server")
        self.start_s = time.monotonic() - began
        return self

    def _answers(self, port: int) -> bool:
        try:
            self.execute("SELECT 1")
            return True
        except Exception:
            return False

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}", autocommit=True,
                             connect_timeout=5) as conn:
            conn.execute(sql)  # type: ignore[arg-type]  # a test's own literal SQL

    def fresh_database(self, name: str) -> str:
        """An empty database `name` (dropped first if a test made it before); returns its URL."""
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # a "fast" shutdown: no waiting for clients to leave
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)
