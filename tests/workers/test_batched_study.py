"""A study whose grid phases train batched (`resources.batch_members`) reads as the same study trained one trial at
a time: the same trials, statuses and eval losses (float32 rounding apart), and each member its own run with the
same name, tags, params and metrics as a solo trial's, but for a `batch` tag. In process, through the driver."""

from __future__ import annotations

from typing import Any

import pytest

from studies import load_catalog
from workers.driver import run_study
from workers.folder import StudyFolder
from workers.runner import InProcessRunner
from workers.tracker import NullTracker


def _data_dir(folder, monkeypatch):
    """A fresh data directory sharing the downloaded corpora (each study its own: nothing is reused)."""
    from tests.conftest import DEFAULT_DATA

    (DEFAULT_DATA / "corpora").mkdir(parents=True, exist_ok=True)
    folder.mkdir()
    (folder / "corpora").symlink_to(DEFAULT_DATA / "corpora")
    monkeypatch.setenv("PTCTL_DATA_DIR", str(folder))


class Recorder(NullTracker):
    """The trial runs as a reader of MLflow would see them: name, tags, params and metric keys per trial."""

    def __init__(self) -> None:
        super().__init__()
        self.trials: dict[str, dict[str, Any]] = {}

    def trial_run(self, study_id, phase, trial_key, parent, tags, instance=None, name=None):
        run = super().trial_run(study_id, phase, trial_key, parent, tags, instance=instance, name=name)
        self.trials[run] = {"key": trial_key, "name": name, "tags": dict(tags), "params": {}, "metrics": set()}
        return run

    def set_tags(self, run_id, tags):
        if run_id in self.trials:
            self.trials[run_id]["tags"].update({k: str(v) for k, v in tags.items()})

    def log_params(self, run_id, params):
        if run_id in self.trials:
            self.trials[run_id]["params"].update(params)

    def log_metrics(self, run_id, rows):
        if run_id in self.trials:
            self.trials[run_id]["metrics"] |= {(r["step"], k) for r in rows for k in r if not k.startswith("system/")
                                               and k != "tokens_per_s"}


def _study(members: int | str, folder, monkeypatch):
    _data_dir(folder, monkeypatch)
    data = load_catalog("tiny").as_dict()
    data["resources"]["batch_members"] = members
    data["tune"]["num_trials"] = 2
    from studies.spec import StudySpec

    spec = StudySpec.model_validate(data)
    tracker = Recorder()
    state = run_study(spec, f"batched-{members}", runner=InProcessRunner(), tracker=tracker)
    return state, tracker


@pytest.mark.slow
def test_a_batched_study_reads_as_the_same_study_trained_one_trial_at_a_time(tmp_path, monkeypatch):
    alone_state, alone = _study(1, tmp_path / "alone", monkeypatch)
    batched_state, batched = _study(8, tmp_path / "batched", monkeypatch)
    assert alone_state.status == batched_state.status == "succeeded"
    one = {r["key"]: r for r in alone.trials.values()}
    other = {r["key"]: r for r in batched.trials.values()}
    assert set(one) == set(other), (sorted(set(one) - set(other)), sorted(set(other) - set(one)))
    tags = {k: v["tags"].get("batch") for k, v in other.items()}
    samples = [k for k in tags if k.startswith("verify-sample")]
    assert {tags[k] for k in samples} == {"2/2 (6 members)"}  # the 6 samples share verify.seed: one batch
    assert tags["verify-centre-s1"] is None  # the other centre seed trains alone (seed 0 is transfer's run)
    for key, solo in one.items():
        mine = other[key]
        assert mine["name"] == solo["name"], key
        assert {k: v for k, v in mine["tags"].items() if k not in ("batch", "log")} == {
            k: v for k, v in solo["tags"].items() if k != "log"}, key  # log: the trial's log file, per study
        assert mine["params"] == solo["params"], key
        assert mine["metrics"] == solo["metrics"], key
    a, b = _table("batched-1", tmp_path / "alone"), _table("batched-8", tmp_path / "batched")
    assert list(a.trial_id) == list(b.trial_id) and list(a.status) == list(b.status)
    assert b.eval_loss.to_numpy() == pytest.approx(a.eval_loss.to_numpy(), rel=1e-3)
    report = _report("batched-8", tmp_path / "batched")
    assert "batched trials:** verify: 6 of 8 trials in 1 batched process (6 members)" in report


def _table(study_id, data):
    import pandas as pd

    path = StudyFolder(study_id, data).artifacts / "trials.csv"
    return pd.read_csv(path).sort_values("trial_id").reset_index(drop=True)


def _report(study_id, data):
    return (StudyFolder(study_id, data).artifacts / "report.md").read_text()


def test_a_resumed_phase_re_forms_its_batches_from_the_members_not_finished(tmp_path, monkeypatch):
    """The in-process runner's journal holds each finished member; run again, the phase trains only the others,
    as one batch (the grouping is a function of the plan), and returns every row."""
    import json

    import workers.train
    from studies.phases.verify import verify_trials
    from workers.runner import PhaseJob

    _data_dir(tmp_path / "data", monkeypatch)
    data = load_catalog("tiny").as_dict()
    data["resources"]["batch_members"] = 8
    data["train"].update(steps=10, eval_every=5, log_every=5, warmup_steps=2)  # the grouping, not the training
    data["verify"]["steps"] = 10
    from studies.spec import StudySpec

    spec = StudySpec.model_validate(data)
    planned = verify_trials(spec, spec.space.defaults())
    job = PhaseJob(spec, "verify", planned, "s1", None, "s1/verify", NullTracker(), tmp_path / "ray", "s1.verify")
    first = InProcessRunner().run_phase(job)
    journal = tmp_path / "ray" / "s1.verify" / "trials.jsonl"
    rows = [json.loads(line) for line in journal.read_text().splitlines()]
    journal.write_text("".join(json.dumps(r) + "\n" for r in rows if r["trial_id"] not in
                               ("verify-sample001", "verify-sample004")))
    trained: list[list[str]] = []
    real = workers.train.train
    monkeypatch.setattr(workers.train, "train",
                        lambda cfgs, **kw: trained.append([c.lr for c in cfgs]) or real(cfgs, **kw))
    again = InProcessRunner().run_phase(job)
    lrs = {t.trial_key: t.hparams["lr"] for t in planned}
    assert trained == [[lrs["verify-sample001"], lrs["verify-sample004"]]]  # one batch of the two left
    assert list(again.trial_id) == list(first.trial_id)
    assert again.set_index("trial_id").loc["verify-sample000", "eval_loss"] == \
        first.set_index("trial_id").loc["verify-sample000", "eval_loss"]
