"""Shared fixtures: an isolated data directory per test session that reuses the downloaded corpus."""

import os
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
