"""Settings, token parsing, log redaction and the embedded head's paths: no server needed."""

from __future__ import annotations

import logging

import pytest

from service import ray_head
from service.logs import RedactSecrets
from service.progress import redact_uri
from service.settings import Settings, parse_tokens

TOKENS = "admin:s3cret-admin-token,read:s3cret-read-token"


def test_tokens_parse_into_scopes_and_bad_entries_name_the_fix_not_the_token():
    assert parse_tokens(TOKENS) == {"s3cret-admin-token": "admin", "s3cret-read-token": "read"}
    for bad in ("s3cret-admin-token", "root:s3cret-admin-token", "admin:short"):
        with pytest.raises(ValueError, match="SCOPE:TOKEN") as err:
            parse_tokens(bad)
        assert "s3cret" not in str(err.value)


def test_settings_read_the_environment_and_hide_secrets(monkeypatch, tmp_path):
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("PTCTL_API_TOKENS", TOKENS)
    monkeypatch.setenv("RAY_ADDRESS", "")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    settings = Settings()
    assert settings.data_dir == tmp_path and settings.ray_address is None
    assert settings.db_url == f"sqlite:///{tmp_path / 'ptctl.db'}" and settings.tracking_uri == "http://mlflow:5000"
    assert "s3cret" not in repr(settings) and settings.secrets() == ["s3cret-admin-token", "s3cret-read-token"]


def test_a_public_address_needs_tokens(tmp_path):
    Settings(data_dir=tmp_path, host="127.0.0.1").check_exposure()
    Settings(data_dir=tmp_path, host="0.0.0.0", api_tokens=TOKENS).check_exposure()
    with pytest.raises(ValueError, match="PTCTL_API_TOKENS"):
        Settings(data_dir=tmp_path, host="0.0.0.0").check_exposure()


def test_log_records_never_show_a_secret(caplog):
    logger = logging.getLogger("ptctl-test-redaction")
    handler = caplog.handler
    handler.addFilter(RedactSecrets(["s3cret-admin-token"]))
    try:
        logger.warning('"GET /studies?token=%s HTTP/1.1" 200', "s3cret-admin-token")
        try:
            raise RuntimeError("bad token s3cret-admin-token")
        except RuntimeError:
            logger.exception("failed")
    finally:
        handler.filters.clear()
    text = caplog.text
    assert "s3cret" not in text and "token=***" in text and "RuntimeError: bad token ***" in text


def test_uris_lose_their_credentials():
    assert redact_uri("postgresql+psycopg://ptctl:pw@db:5432/mlflow") == "postgresql+psycopg://***@db:5432/mlflow"
    assert redact_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_ray_temp_dir_is_short_enough_for_unix_sockets(tmp_path):
    assert ray_head.temp_dir(tmp_path / ("x" * 80)).as_posix().startswith("/tmp/ptctl-ray-")
    assert len(str(ray_head.temp_dir(tmp_path / ("x" * 80)))) <= ray_head.MAX_TEMP_DIR
    short = ray_head.temp_dir(ray_head.Path("/d"))
    assert short == ray_head.Path("/d/ray/tmp")
