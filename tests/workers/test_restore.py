"""A phase whose driver died before Tune first saved its experiment state resumes its own plan.

Tune writes `tuner.pkl` when the Tuner is made and the experiment state only once `fit` runs, and `tuner.pkl`
keeps no `param_space`. A driver killed between the two left a restorable experiment whose restore found no
state, restarted, and ran one trial with an empty config: the trainable took it for a tune trial at the base
width with the space's defaults, so a cancelled-then-resumed study's transfer phase held a tune row (observed
through the API: the resumed study failed with "no rows with phase='transfer'")."""

from __future__ import annotations

import pytest
from ray import tune

from studies import load_catalog
from studies.phases.transfer import transfer_trials
from studies.spec import StudySpec
from workers.mlflow_tracker import Tracker
from workers.ray.callback import MlflowTrials
from workers.ray.experiment import _param_space, run_phase
from workers.ray.trainable import planned_trial, study_trainable

pytestmark = pytest.mark.slow


def _spec() -> StudySpec:
    data = load_catalog("tiny").as_dict()
    data["name"] = "tiny-restore"
    data["train"] |= {"steps": 10, "eval_every": 5, "warmup_steps": 1}
    data["transfer"] = {"widths": [24, 32], "seeds": 1}
    data["verify"] = None
    return StudySpec.model_validate(data)


def test_a_phase_killed_before_its_first_state_save_resumes_its_plan(study_data_dir, tmp_path):
    spec, uri = _spec(), f"sqlite:///{study_data_dir / 'mlflow.db'}"
    centre = {**spec.space.defaults(), "lr": 0.02}
    planned = [t.as_dict() for t in transfer_trials(spec, centre)]
    storage, experiment = tmp_path / "ray", "restore-probe.transfer"
    # what the dead driver left: the Tuner made (tuner.pkl written), fit never reached
    tune.Tuner(study_trainable(spec, "transfer", experiment, 0.0), param_space=_param_space(planned),
               run_config=tune.RunConfig(name=experiment, storage_path=str(storage)))
    assert tune.Tuner.can_restore(storage / experiment)

    tracker = Tracker(spec.experiment_name(), uri)
    study = tracker.study_run("restore-probe", {})
    callback = MlflowTrials(spec, "restore-probe", "transfer", tracker.phase_run("restore-probe", "transfer", study),
                            uri)
    table = run_phase(spec, "transfer", storage, callback, planned, experiment=experiment)

    assert list(table.phase) == ["transfer", "transfer"]
    assert sorted(table.width) == [24, 32] and (table.lr == 0.02).all()
    assert sorted(table.trial_id) == ["transfer-w24-s0", "transfer-w32-s0"]


def test_a_grid_phase_config_without_its_planned_trial_is_refused():
    spec = _spec()
    with pytest.raises(ValueError, match="transfer trial's Tune config holds no planned trial"):
        planned_trial(spec, "transfer", {}, "abc")
    assert planned_trial(spec, "tune", {}, "abc").phase == "tune"  # a TPE suggestion: the space's defaults
