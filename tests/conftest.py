"""Shared fixtures: an isolated data directory per test session that reuses the downloaded corpus."""

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

DEFAULT_DATA = Path(os.environ.get("PTCTL_DATA_DIR") or Path.home() / ".ptctl")


@pytest.fixture(scope="session")
def isolated_data_dir(tmp_path_factory) -> Path:
    """A fresh PTCTL_DATA_DIR (studies, MLflow, caches) that links the shared corpus cache."""
    path = tmp_path_factory.mktemp("ptctl-data")
    (DEFAULT_DATA / "corpora").mkdir(parents=True, exist_ok=True)
    (path / "corpora").symlink_to(DEFAULT_DATA / "corpora")
    return path


@pytest.fixture(scope="session")
def migrated(tmp_path_factory):
    """`migrated(data_dir)` puts a created and migrated MLflow SQLite store in `data_dir` and returns it: a copy of
    one the session made once, so each in-process app's start-up (which prepares the store: MLflow's ~0.9 s of
    migrations on a new file) finds it ready, as a restarted service does."""
    from workers.mlflow_tracker import prepare_store

    template = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    prepare_store(f"sqlite:///{template}")

    def seed(data_dir: Path) -> Path:
        data_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, data_dir / "mlflow.db")
        return data_dir

    return seed


@pytest.fixture(scope="module")
def study_data_dir(isolated_data_dir, ray_session):
    """PTCTL_DATA_DIR set to the isolated data dir before Ray starts, so its workers inherit it."""
    old = os.environ.get("PTCTL_DATA_DIR")
    os.environ["PTCTL_DATA_DIR"] = str(isolated_data_dir)
    yield isolated_data_dir
    if old is None:
        os.environ.pop("PTCTL_DATA_DIR")
    else:
        os.environ["PTCTL_DATA_DIR"] = old


@pytest.fixture(scope="session")
def ray_session():
    import ray

    yield
    ray.shutdown()


@contextmanager
def float64_default():
    """torch's default dtype float64 inside the block (models built there are float64), restored after."""
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)
