"""The phase index (`studies/phase_index.json`) under drivers finishing together: no entry is lost."""

from __future__ import annotations

import json
import multiprocessing as mp

from workers.driver import record_phase


def _record_many(index: str, worker: int) -> None:
    from pathlib import Path

    for i in range(25):
        record_phase(Path(index), f"key-{worker}-{i}", f"study-{worker}")


def test_concurrent_drivers_keep_every_entry(tmp_path):
    index = tmp_path / "phase_index.json"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_record_many, args=(str(index), w)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 6
    entries = json.loads(index.read_text())
    assert len(entries) == 6 * 25 and entries["key-3-24"] == "study-3"
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))
