"""The tracker on the embedded SQLite store: artifacts stay under the data directory, and drivers that
start together share one experiment (real MLflow, no server)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from workers.tracking import Tracker, prepare_store


def _experiment_id(uri: str, name: str, queue) -> None:
    queue.put(Tracker(name, uri).experiment_id)


def test_artifacts_live_under_the_data_dir_not_the_working_dir(tmp_path, monkeypatch):
    data, cwd = tmp_path / "data", tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.setenv("PTCTL_DATA_DIR", str(data))
    monkeypatch.delenv("PTCTL_ARTIFACT_ROOT", raising=False)
    monkeypatch.chdir(cwd)
    tracker = Tracker("artifacts-home", f"sqlite:///{data / 'mlflow.db'}")
    run = tracker.study_run("s-1", {})
    (tmp_path / "report.md").write_text("# report")
    tracker.log_artifacts(run, [tmp_path / "report.md"])
    assert not (cwd / "mlruns").exists() and list(cwd.iterdir()) == []
    stored = list((data / "mlartifacts").rglob("report.md"))
    assert len(stored) == 1 and stored[0].read_text() == "# report"


def test_drivers_starting_together_share_one_experiment(tmp_path, monkeypatch):
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    uri = prepare_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert Path(tmp_path / "mlflow.db").exists()
    ctx, queue = mp.get_context("spawn"), mp.get_context("spawn").Queue()
    procs = [ctx.Process(target=_experiment_id, args=(uri, "together", queue)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    ids = {queue.get(timeout=5) for _ in procs}
    assert len(ids) == 1, ids
