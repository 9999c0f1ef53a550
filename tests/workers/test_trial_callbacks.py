"""MlflowTrials and run_phase's restore wiring, without running Ray: a restored phase counts the trials that
had finished before it (the CLI's progress bar), and runs with this run's callback and retry settings."""

from types import SimpleNamespace

from ray import tune

from studies import load_catalog
from workers.ray_runner import MlflowTrials, _renew, failure_cause


def _callback():
    events = []
    callback = MlflowTrials(load_catalog("tiny"), "s", "tune", "phase-run", "sqlite:///unused.db")
    callback.notify = events.append
    return callback, events


def _trial(trial_id, tune_status, **last):
    return SimpleNamespace(trial_id=trial_id, status=tune_status, last_result=last)


def test_a_restored_phase_counts_the_trials_finished_before_it():
    callback, events = _callback()
    trials = [_trial("a", "TERMINATED", status="completed", eval_loss=5.1), _trial("b", "TERMINATED"),
              _trial("c", "PENDING"), _trial("d", "RUNNING")]
    callback.on_step_begin(0, trials)
    callback.on_step_begin(1, trials)  # once only
    assert [(e["trial_id"], e["status"], e["eval_loss"]) for e in events] == [("a", "completed", 5.1),
                                                                            ("b", "stopped", None)]
    assert all(e["phase"] == "tune" and e["restored"] for e in events)


def test_a_fresh_phase_counts_nothing_at_its_first_step():
    callback, events = _callback()
    callback.on_step_begin(0, [])
    callback.on_step_begin(1, [_trial("a", "TERMINATED")])  # finished during this run: on_trial_complete tells
    assert events == []


def test_a_restored_tuner_gets_this_runs_callback_and_retry_settings(tmp_path):
    old, _ = _callback()
    tune.Tuner(lambda config: None, run_config=tune.RunConfig(name="tune", storage_path=str(tmp_path),
                                                               callbacks=[old]))
    restored = tune.Tuner.restore(str(tmp_path / "tune"), lambda config: None)
    new, _ = _callback()
    _renew(restored, {"callbacks": [new], "failure_config": tune.FailureConfig(max_failures=3)})
    run_config = restored._local_tuner.get_run_config()
    assert run_config.callbacks == [new] and run_config.callbacks[0].notify is not None
    assert run_config.failure_config.max_failures == 3


def test_failure_cause_is_one_line():
    text = ("Failure # 1 (occurred at 2025)\nray::ImplicitFunc.train() (pid=1)\n  File \"x.py\", line 3\n"
            "ValueError: data.path: no such file\n")
    assert failure_cause(text) == "ValueError: data.path: no such file"
    assert failure_cause("The actor died unexpectedly before finishing this task.\nmore") == \
        "The actor died unexpectedly before finishing this task."
    assert failure_cause(None) == "unknown error"
