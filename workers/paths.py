"""Where ptctl keeps its state; importable without torch (the service and MLflow layers need it)."""

import os
from pathlib import Path


def data_dir() -> Path:
    """The project's data directory: `$PTCTL_DATA_DIR` if set, else `~/.ptctl`; created on demand."""
    path = Path(os.environ.get("PTCTL_DATA_DIR") or "~/.ptctl").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path
