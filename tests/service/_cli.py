"""`ptctl` as a subprocess on a data directory of its own (linking the shared corpus cache)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import DEFAULT_DATA


def data_dir(tmp: Path, name: str) -> Path:
    path = tmp / name
    path.mkdir()
    (DEFAULT_DATA / "corpora").mkdir(parents=True, exist_ok=True)
    (path / "corpora").symlink_to(DEFAULT_DATA / "corpora")
    return path


def ptctl(args: list[str], data: Path, tracking_uri: str | None = None, timeout: float = 600,
          **env: str) -> subprocess.CompletedProcess:
    """Run `ptctl ARGS` with PTCTL_DATA_DIR=data, a local Ray (unless `env` names RAY_ADDRESS) and MLflow at
    `tracking_uri` (default: the data directory's SQLite); MLflow's HTTP retries off, so failures are quick."""
    inherited = {k: v for k, v in os.environ.items()  # a user's shell: no embedded head's token from earlier tests
                 if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
    full = {**inherited, "PTCTL_DATA_DIR": str(data), "RAY_ADDRESS": "", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
            "PTCTL_MLFLOW_RETRY_S": "3",
            "MLFLOW_HTTP_REQUEST_TIMEOUT": "5", "COLUMNS": "200", **env}
    full.pop("MLFLOW_TRACKING_URI", None)
    if tracking_uri:
        full["MLFLOW_TRACKING_URI"] = tracking_uri
    return subprocess.run([sys.executable, "-m", "service.cli", *args], env=full, capture_output=True, text=True,
                          timeout=timeout)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    """The single `error: ...` line a failed study ends with (after any progress bars): exit code 1, the
    only error line, and no traceback anywhere."""
    lines = done.stdout.strip().splitlines()
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    errors = [line for line in lines if line.startswith("error:")]
    assert done.returncode == 1 and lines and errors == lines[-1:], (done.returncode, done.stdout)
    return lines[-1]
