"""A fresh data directory for a benchmark whose `corpora/` links to the shared, filled corpus cache.

The shared cache is the default data directory's (`$PTCTL_DATA_DIR`, else `~/.ptctl`). It is filled first
(the built-in corpus is downloaded on the first run of a fresh machine), in a child process so the benchmark
itself imports no torch; the link then never dangles, and every benchmark run reuses the one download.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shared_corpora() -> Path:
    """The default data directory's `corpora/`, with the built-in corpus in it."""
    shared = Path(os.environ.get("PTCTL_DATA_DIR") or "~/.ptctl").expanduser()
    env = {**os.environ, "PTCTL_DATA_DIR": str(shared),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", "from workers.data import shakespeare_texts; shakespeare_texts()"],
                   check=True, env=env, timeout=900)
    return shared / "corpora"


def link_corpora(data_dir: Path) -> Path:
    """`data_dir/corpora` → the filled shared cache; returns `data_dir`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "corpora").symlink_to(shared_corpora(), target_is_directory=True)
    return data_dir
