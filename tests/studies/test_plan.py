import pandas as pd
import pytest

from studies import load_catalog
from studies.phases import phases_of
from studies.phases.base import PhaseFailed
from studies.phases.transfer import transfer_trials
from studies.phases.tune import best_hparams
from studies.phases.validate import validate_trials
from studies.phases.verify import verify_trials
from studies.spec import StudySpec


@pytest.fixture
def spec() -> StudySpec:
    return load_catalog("tiny")


def test_verify_samples_stay_in_the_neighbourhood_and_are_reproducible(spec):
    centre = spec.space.defaults() | {"lr": 0.01, "w_H": 2.0}
    trials = verify_trials(spec, centre)
    centres = [t for t in trials if t.is_centre]
    samples = [t for t in trials if not t.is_centre]
    assert len(centres) == spec.verify.centre_seeds and len({t.seed for t in centres}) == len(centres)
    assert len(samples) == spec.verify.n_samples
    for t in samples:
        for h in spec.space.searched():
            assert 0.5 * centre[h] <= t.hparams[h] <= 1.5 * centre[h]
        for h in spec.space.frozen:
            assert t.hparams[h] == centre[h]
    assert verify_trials(spec, centre) == trials  # a restarted phase plans the same samples
    assert len({t.trial_key for t in trials}) == len(trials)


def test_verify_default_n_is_59_and_log_sampling_in_range(spec):
    data = spec.as_dict()
    data["verify"].update(n_samples=None, sampling="log", delta=0.9)
    spec59 = StudySpec.model_validate(data)
    centre = spec59.space.defaults()
    samples = [t for t in verify_trials(spec59, centre) if not t.is_centre]
    assert len(samples) == 59
    assert all(0.1 * centre["lr"] <= t.hparams["lr"] <= 1.9 * centre["lr"] for t in samples)


def test_best_hparams_ignores_stopped_and_diverged(spec):
    rows = [
        {"phase": "tune", "status": "stopped", "eval_loss": 1.0, "lr": 0.1},
        {"phase": "tune", "status": "diverged", "eval_loss": float("nan"), "lr": 5.0},
        {"phase": "tune", "status": "completed", "eval_loss": 3.0, "lr": 0.02},
        {"phase": "tune", "status": "completed", "eval_loss": 2.0, "lr": 0.03},
    ]
    table = pd.DataFrame([{**spec.space.defaults(), **r} for r in rows])
    best = best_hparams(spec, table)
    assert best["lr"] == 0.03 and best["w_topic"] == spec.space.defaults()["w_topic"]
    with pytest.raises(ValueError, match="no tune trial completed"):
        best_hparams(spec, table[table.status != "completed"])


STORAGE = ("RuntimeError: Unable to set up cluster storage with the following settings:")


@pytest.mark.parametrize(("statuses", "messages", "says", "never"), [
    (["failed"] * 6, [STORAGE] * 6, ["(6 failed of 6)", "6 failed: a Ray node cannot reach the study's storage",
                                     "PTCTL_DATA_DIR"], ["space.lr", "max_loss"]),
    (["diverged", "diverged"], ["loss nan at step 3"] * 2, ["(2 diverged of 2)", "lower space.lr's range"],
     ["storage"]),
    (["failed", "diverged"], ["ValueError: bad batch", ""], ["1 failed: the trial raised ValueError: bad batch",
                                                            "raise train.max_loss"], ["storage"]),
    (["failed"], ["ray.exceptions.NodeDiedError: node 1f2e died"], ["a Ray node was lost"], ["space.lr"]),
])
def test_a_tune_phase_without_a_winner_says_what_failed(spec, statuses, messages, says, never):
    """Infrastructure failures are named with their fix; the lr/max_loss advice only where trials diverged."""
    table = pd.DataFrame([{**spec.space.defaults(), "phase": "tune", "status": s, "eval_loss": float("nan"),
                           "message": m} for s, m in zip(statuses, messages, strict=True)])
    with pytest.raises(PhaseFailed) as caught:
        best_hparams(spec, table)
    assert all(text in str(caught.value) for text in says), str(caught.value)
    assert not any(text in str(caught.value) for text in never), str(caught.value)


def test_transfer_and_validate_grids(spec):
    hp = spec.space.defaults()
    assert [(t.width, t.seed) for t in transfer_trials(spec, hp)] == [(32, 0)]
    data = spec.as_dict()
    data["validate"] = {"widths": [16, 32], "lrs": [0.001, 0.01, 0.1], "steps": 10}
    grid = validate_trials(StudySpec.model_validate(data), hp)
    assert len(grid) == 2 * 2 * 3
    assert {t.parametrization for t in grid} == {"mup", "standard"}
    assert {t.hparams["lr"] for t in grid} == {0.001, 0.01, 0.1}
    assert {t.swept for t in grid} == {"lr"} and "validate-mup-w16-lr0.001-s0" in {t.trial_key for t in grid}


def test_validate_sweeps_an_information_weight_alone_around_the_centre(spec):
    hp = spec.space.defaults() | {"lr": 0.02}
    data = spec.as_dict()
    data["validate"] = {"widths": [16, 32], "lrs": [0.001, 0.01, 0.1], "hparams": {"w_H": [4, 0.5, 1, 2]},
                        "seeds": 2, "steps": 10}
    sweep = StudySpec.model_validate(data)
    grid = validate_trials(sweep, hp)
    assert len(grid) == 2 * 2 * 2 * (3 + 4)
    w_h = [t for t in grid if t.swept == "w_H"]
    assert sorted({t.hparams["w_H"] for t in w_h}) == [0.5, 1, 2, 4]
    assert {t.hparams["lr"] for t in w_h} == {0.02}  # the centre's lr
    assert all(t.hparams == hp | {"w_H": t.hparams["w_H"]} for t in w_h)
    assert len({t.trial_key for t in grid}) == len(grid)


@pytest.mark.parametrize(("hparams", "message"), [
    ({"w_topic": [0.5, 1, 2]}, "validate.hparams.w_topic is not a searched hparam of this study"),
    ({"lr": [0.5, 1, 2]}, "validate.hparams.lr is not a searched hparam"),
    ({"w_H": [0.5, 1]}, "must be >= 3 distinct values > 0"),
    ({"w_H": [0, 1, 2]}, "must be >= 3 distinct values > 0"),
])
def test_validate_hparams_errors_name_the_fix(spec, hparams, message):
    data = spec.as_dict()
    data["space"] = {"frozen": ["w_topic", "w_topic_z"]}
    data["validate"] = {"widths": [16, 32], "lrs": [0.001, 0.01, 0.1], "hparams": hparams}
    with pytest.raises(ValueError, match=message):
        StudySpec.model_validate(data)


def test_the_verify_centre_reuses_the_identical_transfer_run(spec):
    """tiny: transfer trains width 32 seed 0 for 30 steps, the verify centre's first seed is that same run."""
    from studies.phases.verify import reused_centre_seeds, with_reused_centre

    centre = spec.space.defaults()
    assert reused_centre_seeds(spec) == [0]
    planned = verify_trials(spec, centre, skip_centre_seeds=reused_centre_seeds(spec))
    assert [t.seed for t in planned if t.is_centre] == [1]
    transfer = pd.DataFrame([{"trial_id": "transfer-w32-s0", "phase": "transfer", "width": 32, "seed": 0,
                              "status": "completed", "eval_loss": 5.0, "is_centre": False, "message": ""}])
    ran = pd.DataFrame([{"trial_id": "verify-centre-s1", "phase": "verify", "width": 32, "seed": 1,
                         "status": "completed", "eval_loss": 5.1, "is_centre": True, "message": ""}])
    table = with_reused_centre(spec, ran, transfer)
    reused = table[table["trial_id"] == "verify-centre-s0"].iloc[0]
    assert (reused["phase"], bool(reused["is_centre"]), reused["eval_loss"]) == ("verify", True, 5.0)
    assert "transfer-w32-s0" in reused["message"] and len(table) == 2
    # another verify budget or width: nothing to reuse
    assert reused_centre_seeds(StudySpec.model_validate({**spec.as_dict(), "verify": {
        **spec.as_dict()["verify"], "steps": 20}})) == []


def test_the_demo_tells_the_whole_story_and_cpu_certify_runs_the_full_n():
    demo, certify = load_catalog("cpu_demo"), load_catalog("cpu_certify")
    assert phases_of(demo) == ["tune", "transfer", "verify", "validate"]
    assert len(demo.transfer.widths) >= 2 and min(demo.transfer.widths) > demo.tune.base_width
    assert set(demo.validate_.parametrizations) == {"mup", "standard"}
    assert demo.validate_.widths[-1] in demo.transfer.widths
    assert reused_centre_seeds_of(demo) and reused_centre_seeds_of(certify)
    assert demo.verify.resolved_n_samples() == certify.verify.resolved_n_samples() == 59  # a certificate it can reach


def reused_centre_seeds_of(spec):
    from studies.phases.verify import reused_centre_seeds

    return reused_centre_seeds(spec)


def test_a_planned_trial_survives_its_trip_through_ray_tunes_config(spec):
    from studies.plan import PlannedTrial

    data = spec.as_dict()
    data["validate"] = {"widths": [16, 32], "lrs": [0.001, 0.01, 0.1], "steps": 10}
    sweep = StudySpec.model_validate(data)
    trial = validate_trials(sweep, spec.space.defaults())[0]
    assert PlannedTrial.from_dict(trial.as_dict()) == trial and "family" not in trial.as_dict()
    assert trial.trial_config(sweep)["steps"] == 10 and trial.columns(sweep)["swept"] == "lr"
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['colour'\]"):
        PlannedTrial.from_dict({**trial.as_dict(), "colour": "red"})


def test_a_phase_without_its_section_names_the_fix():
    from studies.phases.compare import compare_trials

    bare = load_catalog("tiny").model_copy(update={"transfer": None, "verify": None, "validate_": None})
    for plan, fix in ((lambda: transfer_trials(bare, {}), "no transfer section: add one with widths"),
                      (lambda: verify_trials(bare, {}), "no verify section: add verify: {}"),
                      (lambda: validate_trials(bare, {}), "no validate section: add one with widths and lrs"),
                      (lambda: compare_trials(bare, 300, {}), "no compare section: add one with budgets")):
        with pytest.raises(ValueError, match=fix):
            plan()


def test_a_horizon_sweep_plans_lr_at_each_length_with_unique_names(spec):
    hp = spec.space.defaults()
    data = spec.as_dict()
    data["validate"] = {"widths": [16, 32], "lrs": [0.001, 0.01, 0.1], "steps": [20, 40, 80], "seeds": 2,
                        "hparams": {"w_H": [0.5, 1, 2]}}
    sweep = StudySpec.model_validate(data)
    grid = validate_trials(sweep, hp)
    lr = [t for t in grid if t.swept == "lr"]
    assert len(lr) == 2 * 2 * 3 * 3 * 2 and {(t.at or {}).get("horizon") for t in lr} == {20, 40, 80}
    w_h = [t for t in grid if t.swept == "w_H"]
    # the others at the main horizon
    assert len(w_h) == 2 * 2 * 3 * 2 and {(t.at or {}).get("horizon") for t in w_h} == {80}
    assert len({t.trial_key for t in grid}) == len(grid) == len(lr) + len(w_h)
    assert "validate-mup-w16-t40-lr0.01-s1" in {t.trial_key for t in grid}
    assert {t.trial_config(sweep)["steps"] for t in lr} == {20, 40, 80}
    assert all(t.columns(sweep)["horizon"] == (t.at or {}).get("horizon") for t in grid)
    plain = StudySpec.model_validate({**data, "validate": {**data["validate"], "steps": 80}})
    assert all((t.at or {}).get("horizon") is None and "-t" not in t.trial_key for t in validate_trials(plain, hp))


def test_the_plan_counts_each_horizons_steps_and_flags_a_short_proxy(spec):
    from studies.cost import planned_runs
    from studies.sweeps import SWEEPS

    horizon_flag = SWEEPS["horizon"].flag

    data = spec.as_dict()
    data["validate"] = {"widths": [16, 32], "lrs": [0.001, 0.01, 0.1], "steps": [20, 40], "parametrizations": ["mup"]}
    sweep = StudySpec.model_validate(data)
    assert sum(s for _, s in planned_runs(sweep)["validate"]) == 2 * 3 * (20 + 40)
    assert horizon_flag(sweep) is None  # tune trains train.steps: nothing measured, nothing to flag
    short = StudySpec.model_validate({**data, "tune": {**data["tune"], "steps": 20}})
    assert short.steps_for("tune") < short.train.steps
    assert f"tune trains 20 steps, the target {short.train.steps}" in (horizon_flag(short) or "")
    assert "validate horizon sweep (validate.steps) will measure" in (horizon_flag(short) or "")


def test_a_depth_sweep_plans_lr_at_each_depth_under_completep_and_none():
    deep = load_catalog("depth_cpu")
    hp = deep.space.defaults()
    grid = validate_trials(deep, hp)
    v = deep.validate_
    assert len(grid) == 2 * 3 * len(v.lrs) * v.seeds  # one width: the depth sweep alone
    assert len({t.trial_key for t in grid}) == len(grid)
    assert "validate-completep-w32-L8-lr0.04-s1" in {t.trial_key for t in grid}
    assert {((t.at or {}).get("depth_parametrization"), t.depth) for t in grid} == {(d, L) for d in ("completep",
                                                                                                      "none")
                                                                  for L in (2, 4, 8)}
    assert all(t.width == 32 and t.swept == "lr" and t.parametrization is None for t in grid)
    arch = {t.trial_key: t.trial_config(deep)["model_hp"] for t in grid}
    at8 = arch["validate-completep-w32-L8-lr0.04-s1"]
    assert (at8["n_layers"], at8["base_depth"], at8["depth_parametrization"]) == (8, 2, "completep")
    none = arch["validate-none-w32-L4-lr0.04-s0"]
    assert none["n_layers"] == 4 and "base_depth" not in none and "depth_parametrization" not in none
    columns = grid[0].columns(deep)
    assert (columns["depth"], columns["depth_parametrization"], columns["parametrization"]) == (2, "completep", "mup")
    from studies.plan import PlannedTrial
    assert PlannedTrial.from_dict(grid[-1].as_dict()) == grid[-1]  # Ray Tune carries it as a dict


def test_a_depth_sweep_beside_a_width_sweep_runs_at_the_first_width_and_ut_sweeps_its_steps():
    data = load_catalog("depth_cpu").as_dict()
    data["validate"] = {**data["validate"], "widths": [32, 64], "depths": [2, 4],
                        "parametrizations": ["mup", "standard"]}
    both = StudySpec.model_validate(data)
    grid = validate_trials(both, both.space.defaults())
    deep = [t for t in grid if t.depth is not None]
    assert len(grid) == 2 * 2 * 6 * 2 + 2 * 2 * 6 * 2
    assert {t.width for t in deep} == {32} and all(t.trial_key.startswith(("validate-completep-", "validate-none-"))
                                                   for t in deep)
    ut = load_catalog("tiny").as_dict()
    ut["model"] = {"family": "ut", "parametrization": "mup",
                   "arch": {"n_steps": 3, "depth_parametrization": "completep", "head_dim": 8}}
    ut["space"] = None
    ut["validate"] = {"widths": [16], "lrs": [0.001, 0.01, 0.1], "depths": [3, 6]}
    spec = StudySpec.model_validate(ut)
    [hp] = {t.trial_config(spec)["model_hp"]["n_steps"]: t.trial_config(spec)["model_hp"]
            for t in validate_trials(spec, spec.space.defaults())
            if t.at == {"depth": 6, "depth_parametrization": "completep"}}.values()
    assert hp["n_steps"] == 6 and hp["base_depth"] == 3  # base_depth omitted: the arch's own depth
