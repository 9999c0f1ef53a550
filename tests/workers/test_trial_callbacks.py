"""MlflowTrials and run_phase's restore wiring, without running Ray: a restored phase counts the trials that
had finished before it (the CLI's progress bar), and runs with this run's callback and retry settings."""

import sys
import time
import warnings
from types import SimpleNamespace

import pytest
from ray import tune

from studies import load_catalog
from workers.ray.callback import MlflowTrials, failure_cause
from workers.ray.experiment import _renew, tune_log
from workers.ray.trainable import REPORTS, CheckpointClock, ReportClock
from workers.report import TrialReport, dump_reports


def _callback(uri: str = "sqlite:///unused.db"):
    events = []
    callback = MlflowTrials(load_catalog("tiny"), "s", "tune", "phase-run", uri)
    callback.notify = events.append
    return callback, events


def _final(**report):
    """A Tune trial's last result: the step and its one member's report."""
    return {"step": report.get("steps", 0), REPORTS: dump_reports([TrialReport(**report)])}


def _trial(trial_id, tune_status, **report):
    last = _final(**report) if report else {}
    return SimpleNamespace(trial_id=trial_id, status=tune_status, last_result=last, config={"lr": 1e-2})


def test_a_restored_phase_counts_the_trials_finished_before_it(tmp_path):
    callback, events = _callback(f"sqlite:///{tmp_path / 'mlflow.db'}")
    trials = [_trial("a", "TERMINATED", status="completed", eval_loss=5.1), _trial("b", "TERMINATED"),
              _trial("c", "PENDING"), _trial("d", "RUNNING")]
    callback.on_step_begin(0, trials)
    callback.on_step_begin(1, trials)  # once only
    assert [(e["trial_id"], e["status"], e["eval_loss"]) for e in events] == [("a", "completed", 5.1),
                                                                            ("b", "stopped", None)]
    assert all(e["phase"] == "tune" and e["restored"] for e in events)


def test_a_fresh_phase_counts_nothing_at_its_first_step(tmp_path):
    callback, events = _callback(f"sqlite:///{tmp_path / 'mlflow.db'}")
    callback.on_step_begin(0, [])
    callback.on_step_begin(1, [_trial("a", "TERMINATED")])  # finished during this run: on_trial_complete tells
    assert events == []


def test_a_restored_tuner_gets_this_runs_callback_retry_settings_and_concurrency(tmp_path):
    old, _ = _callback()
    tune.Tuner(lambda config: None, run_config=tune.RunConfig(name="tune", storage_path=str(tmp_path),
                                                               callbacks=[old]))
    restored = tune.Tuner.restore(str(tmp_path / "tune"), lambda config: None)
    new, _ = _callback()
    _renew(restored, {"callbacks": [new], "failure_config": tune.FailureConfig(max_failures=3)}, 2)
    run_config = restored._local_tuner.get_run_config()
    assert run_config.callbacks == [new] and run_config.callbacks[0].notify is not None
    assert run_config.failure_config.max_failures == 3
    assert restored._local_tuner._tune_config.max_concurrent_trials == 2  # a memory squeeze's lowered concurrency


def test_failure_cause_is_one_line():
    text = ("Failure # 1 (occurred at 2025)\nray::ImplicitFunc.train() (pid=1)\n  File \"x.py\", line 3\n"
            "ValueError: data.path: no such file\n")
    assert failure_cause(text) == "ValueError: data.path: no such file"
    assert failure_cause("The actor died unexpectedly before finishing this task.\nmore") == \
        "The actor died unexpectedly before finishing this task."
    assert failure_cause(None) == "unknown error"


class _SlowTracker:
    """Our Tracker's interface, each write taking `delay` seconds (an MLflow store under load)."""

    def __init__(self, delay: float, fail_on: str | None = None) -> None:
        self.delay, self.fail_on, self.calls = delay, fail_on, []

    def _write(self, name, *args):
        time.sleep(self.delay)
        if name == self.fail_on:
            raise ConnectionError(f"{name}: the store is down")
        self.calls.append((name, *args))

    def trial_run(self, study_id, phase, key, phase_run, tags, instance=None, name=None):
        self._write("trial_run", key)
        return f"run-{key}"

    def log_params(self, run, params):
        self._write("log_params", run)

    def last_step(self, run, key):
        return 0

    def log_metrics(self, run, rows):
        self._write("log_metrics", run, rows[0]["step"])

    def set_tags(self, run, tags):
        self._write("set_tags", run, tags.get("status"))

    def finish(self, run, status="FINISHED"):
        self._write("finish", run, status)


def test_trial_runs_are_written_off_tunes_loop_in_order():
    callback, events = _callback()
    callback._tracker = _SlowTracker(0.2)
    trial = SimpleNamespace(trial_id="t1", config={}, last_result=_final(status="completed", eval_loss=4.0),
                            num_failures=0, error_file=None)
    callback.on_trial_start(0, [], trial)
    callback.on_trial_result(0, [], trial, _final(status="running", steps=10,
                                                  rows=[{"step": 10, "train_loss": 5.0, "eval_loss": 4.5}]))
    callback.on_trial_complete(0, [], trial)
    assert len(callback._tracker.calls) < 5  # Tune's loop did not wait for the five writes (0.2 s each)
    assert [e["status"] for e in events] == ["completed"]  # the progress bar is told at once
    callback.flush()
    assert [c[0] for c in callback._tracker.calls] == ["trial_run", "log_params", "log_metrics", "set_tags", "finish"]
    assert callback._tracker.calls[-1] == ("finish", "run-tune-t1", "FINISHED")


def test_a_failed_deferred_write_is_raised_by_flush():
    callback, _ = _callback()
    callback._tracker = _SlowTracker(0.0, fail_on="log_metrics")
    trial = SimpleNamespace(trial_id="t1", config={}, last_result={}, num_failures=0, error_file=None)
    callback.on_trial_start(0, [], trial)
    callback.on_trial_result(0, [], trial, _final(status="running", steps=10, rows=[{"step": 10, "train_loss": 5.0}]))
    with pytest.raises(ConnectionError, match="log_metrics"):
        callback.flush()
    callback.flush()  # reported once


def test_checkpoint_clock():
    now = [0.0]
    every_30 = CheckpointClock(max_retries=2, every_s=30, clock=lambda: now[0])
    due = []
    for t in (0.5, 10, 29.9, 30, 31, 60.5):
        now[0] = t
        due.append(every_30())
    assert due == [False, False, False, True, False, True]  # a 6-s trial: no checkpoint at all
    always = CheckpointClock(max_retries=2, every_s=0, clock=lambda: now[0])
    assert always() and always()
    assert not CheckpointClock(max_retries=0, every_s=0, clock=lambda: now[0])()  # no retries: no use for one


def test_report_clock_batches_evaluations_between_rungs():
    now = [0.0]
    clock = ReportClock(rungs=[10, 30, 90], every_s=10, clock=lambda: now[0])
    reported = []
    for step in range(5, 101, 5):  # an evaluation every 5 steps, 0.1 s apart: only ASHA's rungs are reported
        now[0] += 0.1
        reported += [step] if clock(step) else []
    assert reported == [10, 30, 90]
    slow = ReportClock(rungs=[], every_s=10, clock=lambda: now[0])
    now[0] += 10.0
    assert slow(5) and not slow(10)  # live progress at least every 10 s


def test_asha_rungs_cover_rays():
    spec = load_catalog("tiny")  # grace 10, η 3, 30 steps: Ray judges at 10 and 30
    assert spec.asha_rungs() == [10, 30]
    assert spec.model_copy(update={"tune": spec.tune.model_copy(update={"asha": spec.tune.asha.model_copy(
        update={"enabled": False})})}).asha_rungs() == []


def test_batched_rows_are_logged_once_each():
    callback, _ = _callback()
    callback._tracker = tracker = _SlowTracker(0.0)
    logged = []
    tracker.log_metrics = lambda run, rows: logged.extend(r["step"] for r in rows)
    trial = SimpleNamespace(trial_id="t1", config={}, last_result={}, num_failures=0, error_file=None)
    def result(step, rows):
        return {"step": step, REPORTS: dump_reports([TrialReport(status="running", steps=step, rows=rows)])}

    callback.on_trial_result(0, [], trial, result(30, [{"step": 10, "eval_loss": 5.0}, {"step": 20, "eval_loss": 4.5},
                                                       {"step": 30, "eval_loss": 4.0}]))
    callback.on_trial_result(0, [], trial, result(40, [{"step": 20, "eval_loss": 4.5}, {"step": 40, "eval_loss": 3.9}]))
    callback.flush()
    assert logged == [10, 20, 30, 40]


def test_a_restored_phase_writes_the_runs_its_interrupted_driver_never_wrote(tmp_path):
    """A driver cancelled after Tune recorded a trial finished but before the deferred MLflow writes ran: the
    restored phase still gives that trial its run, finished with its status and last step, exactly once."""
    from workers.mlflow_tracker import Tracker

    spec = load_catalog("tiny")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(spec.experiment_name(), uri)
    phase_run = tracker.phase_run("s1", "tune", tracker.study_run("s1", {}))
    finished = SimpleNamespace(trial_id="t1", status="TERMINATED", config={"lr": 3e-3}, experiment_tag="1_lr=0.003",
                               last_result=_final(status="completed", eval_loss=6.0, steps=30,
                                                  rows=[{"step": 30, "train_loss": 6.2, "eval_loss": 6.0}]))
    for _ in range(2):  # restored twice: the second finds the run and writes nothing new
        callback = MlflowTrials(spec, "s1", "tune", phase_run, uri)
        callback.on_step_begin(0, [finished, SimpleNamespace(trial_id="t2", status="PENDING", last_result={})])
        callback.flush()
    (run,) = tracker.runs("s1", "trial")
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "completed"
    assert run.data.metrics["eval_loss"] == 6.0 and run.data.metrics["steps_done"] == 30
    assert [m.step for m in tracker.client.get_metric_history(run.info.run_id, "eval_loss")] == [30]


def test_each_study_phase_registers_its_trainable_under_its_own_name():
    """Ray Tune's trainable registry is shared by a Ray job, and the service's drivers are actors of one job: two
    studies registering the same name replaced each other's spec (trials of one ran with the other's, or failed
    with OwnerDiedError once its driver had exited)."""
    from ray.tune.experiment import Experiment

    from workers.ray.trainable import study_trainable
    from workers.runner import experiment_name

    spec = load_catalog("tiny")
    names = {Experiment.get_trainable_name(study_trainable(spec, phase, experiment_name(study, phase), 0.0))
             for study in ("tiny-a1", "tiny-b2") for phase in ("tune", "transfer")}
    assert len(names) == 4
    again = Experiment.get_trainable_name(study_trainable(spec, "tune", experiment_name("tiny-a1", "tune"), 0.0))
    assert again in names  # a restore registers the same name


def test_storage_root_is_the_study_folder_unless_shared_storage_is_set(tmp_path, monkeypatch):
    from workers.ray.experiment import storage_root

    local = tmp_path / "studies" / "s-1" / "ray"
    spec = load_catalog("tiny")
    monkeypatch.delenv("PTCTL_STORAGE", raising=False)
    assert storage_root(spec, local) == str(local)
    monkeypatch.setenv("PTCTL_STORAGE", "s3://lab/ptctl/")
    assert storage_root(spec, local) == "s3://lab/ptctl/s-1"
    nfs = spec.model_copy(update={"resources": spec.resources.model_copy(update={"storage": "/mnt/nfs"})})
    assert storage_root(nfs, local) == "/mnt/nfs/s-1"  # the spec's own first


def test_a_trial_asking_for_gpus_the_cluster_lacks_fails_naming_the_fix():
    from workers.errors import StudyFailed
    from workers.ray.cluster import check_gpus

    check_gpus("tune", 0.5, 1.0)  # a fraction of the one GPU there is
    check_gpus("tune", 0.0, 0.0)
    with pytest.raises(StudyFailed, match=r"ask for 0.25 GPU each \(resources.gpus_per_trial\) but the Ray cluster "
                                          r"has 0: add a node with GPUs .* or set resources.gpus_per_trial to 0"):
        check_gpus("tune", 0.25, 0.0)
    with pytest.raises(StudyFailed, match="resources.transfer_gpus"):
        check_gpus("verify", 2, 1)


def test_warnings_shown_during_a_phase_go_to_its_log_file_not_the_terminal(tmp_path, capfd):
    """What a library warns while a phase runs is chatter like Tune's logs (Optuna warns when a retried trial
    reports a step again): it lands in the phase's log file with its source, and the terminal stays ptctl's. The
    filters and the display are as before once the phase ends."""

    def terminal(message, category, filename, lineno, file=None, line=None):  # Python's display, not pytest's record
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = terminal
        with tune_log(tmp_path / "phase.log"):
            warnings.warn_explicit("The reported value is ignored because this `step=2` is already reported.",
                                   UserWarning, "optuna/trial/_trial.py", 505)
        assert warnings.showwarning is terminal
    out, err = capfd.readouterr()
    assert "step=2" not in out + err
    logged = (tmp_path / "phase.log").read_text()
    assert "optuna/trial/_trial.py:505: UserWarning: The reported value is ignored" in logged, logged
