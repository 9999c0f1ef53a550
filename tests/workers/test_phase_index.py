"""The phase index (`studies/phase_index.json`) under drivers finishing together: no entry is lost."""

from __future__ import annotations

import json
import multiprocessing as mp

from workers.folder import PhaseIndex


def _record_many(data: str, worker: int) -> None:
    from pathlib import Path

    for i in range(25):
        PhaseIndex(Path(data)).record(f"key-{worker}-{i}", f"study-{worker}")


def test_concurrent_drivers_keep_every_entry(tmp_path):
    index = tmp_path / "studies" / "phase_index.json"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_record_many, args=(str(tmp_path), w)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 6
    entries = json.loads(index.read_text())
    assert len(entries) == 6 * 25 and entries["key-3-24"] == "study-3"
    assert not list(index.parent.glob("*.tmp")) and not list(index.parent.glob(".*.tmp"))
    assert PhaseIndex(tmp_path).get("key-5-0") == "study-5" and PhaseIndex(tmp_path).get("nope") is None
