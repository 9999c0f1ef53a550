"""The tests' PostgreSQL comes from the project's own install, and its absence fails CI instead of skipping."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.service import postgres as pg


def test_without_the_wheel_ci_fails_and_elsewhere_skips(monkeypatch):
    monkeypatch.setattr(pg.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="make install"):
        pg.require_install()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="make install"):
        pg.require_install()


def test_the_server_runs_the_wheels_binaries_not_a_system_install(postgres):
    exe = Path(f"/proc/{postgres.proc.pid}/exe").resolve()
    assert exe.name == "postgres"
    assert exe.is_relative_to(postgres.root) or exe.is_relative_to(pg.wheel_install()), exe
    assert "pgserver" in exe.parts
