"""The Tracker waits out an unreachable tracking server for a bounded time, then fails naming it and the cause."""

import socket
import time

import pytest

from workers.mlflow_tracker import Tracker, TrackingUnavailable, _transient


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_an_unreachable_server_fails_clearly_after_the_retry_budget(monkeypatch, caplog):
    monkeypatch.setenv("PTCTL_MLFLOW_RETRY_S", "3")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # each call fails at once: only ptctl's budget waits
    uri = f"http://127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    with pytest.raises(TrackingUnavailable) as err:
        Tracker("unreachable", uri)
    elapsed = time.monotonic() - start
    assert elapsed < 20  # MLflow alone retries for ~4 minutes
    assert uri in str(err.value) and "Connection refused" in str(err.value) and "PTCTL_MLFLOW_RETRY_S" in str(err.value)
    assert any("retrying in" in r.getMessage() for r in caplog.records)


def test_only_transient_failures_are_retried():
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, TEMPORARILY_UNAVAILABLE

    assert not _transient(MlflowException("no such run", error_code=RESOURCE_DOES_NOT_EXIST))
    assert _transient(MlflowException("busy", error_code=TEMPORARILY_UNAVAILABLE))
    assert not _transient(ValueError("bad input"))
