"""`FinishedTrials`: the driver's ledger of a phase's finished trials, each known by what it trains (`content_key`)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from studies.plan import ledger_form


def content_key(config: dict[str, Any]) -> str:
    """A Tune trial's identity by what it trains: its config (a planned trial, a batch, or TPE's suggestion) in the
    ledger's form (`studies.plan.ledger_form`)."""
    return json.dumps(ledger_form(config), sort_keys=True, default=str)


class FinishedTrials:
    """The driver's ledger of a phase's finished Tune trials (`<experiment>.finished.jsonl` in the study folder),
    appended and synced when a trial completes, before its run is written.

    Tune saves its experiment state every few seconds, not when a trial completes: a driver killed just after a
    trial finished restores an experiment that holds the trial as still running, or not at all (TPE then suggests
    its configuration again, under a new trial id). Read back on restore, the ledger makes such a trial report its
    recorded results again instead of training (`_trainable`), under its first trial id and number (`original`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, dict[str, Any]]:
        """content key → {"trial_id", "number", "results"} of each finished trial."""
        if not self.path.exists():
            return {}
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        records = []
        for line in lines:
            with contextlib.suppress(json.JSONDecodeError):  # a line cut by the kill itself
                records.append(json.loads(line))
        return {r["content"]: r for r in records}

    def add(self, config: dict[str, Any], trial_id: str, number: int | None, results: list[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"content": content_key(config), "trial_id": trial_id, "number": number, "results": results}
        with open(self.path, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
