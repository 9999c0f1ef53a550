"""The test servers answer from their own process, never from a stranger on their port.

A server is started on a port picked free beforehand; until it binds, another process may take that port
(a second pytest worker's server). The server then exits, and a readiness poll of the port would be answered
by the stranger: the tests would go on against another worker's API or MLflow server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import suppress

import pytest

from tests.service import conftest
from tests.service.conftest import EVENT_S, free_port, http_ok, listeners, start_serving, wait_for


def _http_server(port: int, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture
def stranger(tmp_path):
    """Another process serving HTTP 200 on a port of its own; yields (process, port)."""
    port = free_port()
    with open(tmp_path / "stranger.log", "w") as log:
        proc = _http_server(port, log)
    try:
        wait_for(lambda: proc.pid in listeners(port), EVENT_S, "the stranger's listening socket", interval=0.05)
        yield proc, port
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_listeners_name_the_process_group_that_listens(stranger):
    proc, port = stranger
    assert listeners(port) == {proc.pid}
    assert listeners(free_port()) == set()


def test_a_server_whose_port_was_taken_starts_on_another(stranger, tmp_path, monkeypatch):
    _, taken = stranger
    picks = iter([taken])
    monkeypatch.setattr(conftest, "free_port", lambda: next(picks, None) or free_port())
    log = tmp_path / "server.log"

    def launch(port: int) -> subprocess.Popen:
        with open(log, "a") as out:
            return _http_server(port, out)

    proc, port = start_serving(launch, http_ok("/"), log, "the http.server")
    try:
        assert port != taken  # the stranger's 200 on the taken port did not count as this server up
        assert listeners(port) == {proc.pid}
        assert "Address already in use" in log.read_text()  # the first try did meet the taken port
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
