"""Where ptctl keeps its state; importable without torch (the service and MLflow layers need it)."""

import os
import re
from pathlib import Path


def data_dir() -> Path:
    """The project's data directory: `$PTCTL_DATA_DIR` if set, else `~/.ptctl`; created on demand."""
    path = Path(os.environ.get("PTCTL_DATA_DIR") or "~/.ptctl").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def redact_uri(uri: str) -> str:
    """`scheme://user:password@host/...` → `scheme://***@host/...` (for messages, logs and state.json)."""
    return re.sub(r"^([a-zA-Z][\w+.-]*://)[^/@]*@", r"\1***@", uri)
