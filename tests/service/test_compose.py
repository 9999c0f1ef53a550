"""docker-compose.yml against the compose-spec JSON schema (no Docker engine on CI machines), and the
deployment facts the README promises: every service health-checked, GPU workers, settings by environment."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def _validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["check-jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_compose_file_matches_the_compose_spec():
    result = _validate(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_validator_rejects_a_broken_compose_file(tmp_path):
    broken = yaml.safe_load(COMPOSE.read_text())
    broken["services"]["api"]["ports"] = 8000  # must be a list
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    assert _validate(path).returncode != 0


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_services_health_checks_volumes_and_gpus(compose):
    services = compose["services"]
    assert set(services) == {"api", "ray-head", "ray-worker", "mlflow", "postgres"}
    unchecked = [name for name, s in services.items() if name != "ray-worker" and "healthcheck" not in s]
    assert not unchecked, f"services without a healthcheck: {unchecked}"
    gpu = services["ray-worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert "container_name" not in services["ray-worker"]  # `--scale ray-worker=N` needs unnamed containers
    shared = {n for n, s in services.items() if "ptctl-data:/data" in s.get("volumes", [])}
    assert shared == {"api", "ray-head", "ray-worker"}  # study folders written by drivers, read by the API
    assert set(compose["volumes"]) >= {"postgres", "mlartifacts", "ptctl-data"}


def test_settings_come_from_the_environment_without_secrets_in_the_file(compose):
    api = compose["services"]["api"]["environment"]
    assert api["RAY_ADDRESS"] == "ray-head:6379" and api["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert api["PTCTL_DATABASE_URL"].startswith("postgresql+psycopg://")
    for value in (api["PTCTL_API_TOKENS"], api["RAY_AUTH_TOKEN"], api["PTCTL_DATABASE_URL"]):
        assert "${" in value and ":?" in value, f"{value!r} must come from .env, required"
    assert "postgresql+psycopg://" in " ".join(compose["services"]["mlflow"]["command"])
