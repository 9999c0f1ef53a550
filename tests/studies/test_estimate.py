"""The wall-time estimate's arithmetic (`studies.estimate`): jobs from the plan, lanes, the schedule, the scaling by
FLOPs and the printed line, from made-up step times (no probe, no clock)."""

from __future__ import annotations

import pytest

from studies import load_catalog
from studies.cost import asha_steps, sequence_flops
from studies.estimate import (
    PHASE_START_S,
    STUDY_START_S,
    TRIAL_OVERHEAD_S,
    TUNE_TRIAL_OVERHEAD_S,
    Job,
    Shape,
    ShapeTime,
    at_once,
    completed,
    duration_text,
    estimate,
    lanes,
    planned_jobs,
    schedule,
    shapes_of,
    tune_steps,
)
from studies.spec import StudySpec


def _with(name: str, **sections: dict) -> StudySpec:
    data = load_catalog(name).as_dict()
    for key, value in sections.items():
        data[key] = {**(data.get(key) or {}), **value}
    return StudySpec.model_validate(data)


def test_schedule_starts_each_job_on_the_lane_that_frees_first():
    assert schedule([], 2) == 0
    assert schedule([3, 3, 3], 1) == 9
    assert schedule([3, 3, 3], 2) == 6  # two side by side, then the third
    assert schedule([5, 1, 1, 1, 1], 2) == 5  # the four short ones share the second lane
    assert schedule([1, 1, 1, 1, 5], 2) == 7  # in plan order: the long one last
    assert schedule([2, 2], 8) == 2


def test_lanes_are_ray_slots_and_tune_is_capped_at_max_concurrent():
    spec = load_catalog("cpu_demo")  # 1 CPU per trial, max_concurrent 2, no GPUs
    assert [lanes(spec, "tune", c, 0) for c in (1, 2, 16)] == [1, 2, 2]
    assert [lanes(spec, "verify", c, 0) for c in (1, 2, 16)] == [1, 2, 16]
    paper = load_catalog("paper_pt_minipile")  # 4 CPUs, a quarter GPU per tune trial, 1 GPU per later trial
    assert lanes(paper, "tune", 64, 2) == 8 and lanes(paper, "tune", 16, 2) == 4  # GPUs, then CPUs, bind
    assert lanes(paper, "transfer", 64, 2) == 2
    assert lanes(paper, "transfer", 2, 0) == 1  # never below one


def test_tune_trials_stop_where_synchronous_halving_stops_them():
    # tiny: 6 trials, rung 10 below the 30-step budget, η 3: 2 pass it (the full budgets first)
    assert tune_steps(load_catalog("tiny")) == [30, 30, 10, 10, 10, 10]
    # cpu_demo: 10 trials, rungs 25 and 75 of 150: round(10/3) = 3 pass 25, round(10/9) = 1 passes 75
    demo = load_catalog("cpu_demo")
    assert tune_steps(demo) == [150, 75, 75] + [25] * 7
    assert sum(tune_steps(demo)) == pytest.approx(10 * asha_steps(150, [25, 75], 3), rel=0.06)  # rounding only
    assert tune_steps(_with("cpu_demo", tune={"num_trials": 2})) == [150, 25]  # at least one full budget
    assert tune_steps(_with("cpu_demo", tune={"asha": {"enabled": False}})) == [150] * 10


def test_jobs_of_the_demo_follow_the_plan():
    spec = load_catalog("cpu_demo")
    jobs = planned_jobs(spec, cpus=2)
    assert {p: len(j) for p, j in jobs.items()} == {"tune": 10, "transfer": 2, "verify": 61, "validate": 20}
    assert [(j.steps, j.evals) for j in jobs["tune"][:4]] == [(150, 6), (75, 3), (75, 3), (25, 1)]
    assert {j.overhead_s for j in jobs["tune"]} == {TUNE_TRIAL_OVERHEAD_S}
    assert {j.shape.width for j in jobs["verify"]} == {64} and {j.steps for j in jobs["verify"]} == {150}
    assert {j.evals for j in jobs["verify"]} == {6}  # every 25 steps
    assert {(j.shape.width, j.steps, j.evals) for j in jobs["validate"]} == {(32, 100, 4), (128, 100, 4)}
    assert [s.label() for s in shapes_of(jobs)] == ["w32", "w64", "w128"]
    assert all(s.device == "cpu" and s.members == 1 for s in shapes_of(jobs))


def test_each_shape_is_timed_beside_the_trials_its_busiest_phase_runs_with_it():
    spec = load_catalog("tiny")  # tune: 6 trials at w16; transfer: 1 at w32; verify: 7 at w32; 2 lanes
    jobs = planned_jobs(spec, cpus=2)
    w16, w32 = shapes_of(jobs)
    assert at_once(spec, jobs, cpus=2, gpus=0) == {w16: 2, w32: 2}  # verify runs two w32 trials at once
    assert at_once(spec, jobs, cpus=1, gpus=0) == {w16: 1, w32: 1}
    only_transfer = {"transfer": jobs["transfer"]}
    assert at_once(spec, only_transfer, cpus=2, gpus=0) == {w32: 1}  # one trial: nothing beside it


def test_batched_members_are_one_job_of_a_stacked_shape():
    spec = _with("cpu_demo", resources={"batch_members": 16})
    jobs = planned_jobs(spec, cpus=2)
    # the 59 samples as the verify phase packs them: the centre's seed 0 is the transfer run's, trained no more
    assert sorted(j.trials for j in jobs["verify"]) == [1, 1, 14, 15, 15, 15]
    assert {j.shape.label() for j in jobs["verify"]} == {"w64 ×15", "w64 ×14", "w64"}


def test_a_gpu_phase_is_timed_on_the_gpu():
    spec = load_catalog("paper_pt_minipile")
    jobs = planned_jobs(spec, cpus=64, gpus=2, gpu_memory=140e9)
    assert {s.device for s in shapes_of(jobs)} == {"cuda"}
    auto = _with("cpu_demo", train={"device": "auto"})  # no GPUs for tune trials, one for each later trial
    assert {(s.width, s.device) for s in shapes_of(planned_jobs(auto, cpus=2, gpus=1))} == {
        (32, "cpu"), (32, "cuda"), (64, "cuda"), (128, "cuda")}
    assert {s.device for s in shapes_of(planned_jobs(load_catalog("cpu_demo"), cpus=2, gpus=1))} == {"cpu"}


def test_estimate_adds_steps_evals_builds_and_ray_costs():
    spec = load_catalog("tiny")  # tune 6 trials at w16 (2 at a time), transfer 1 at w32, verify 7 at w32 (2 at a time)
    jobs = planned_jobs(spec, cpus=2)
    w16, w32 = (s for s in shapes_of(jobs))
    times = {w16: ShapeTime(step_s=0.1, eval_s=0.5, build_s=0.2), w32: ShapeTime(step_s=0.2, eval_s=1.0, build_s=0.3)}
    made = estimate(spec, jobs, times, cpus=2, gpus=0, assumptions="made up")
    full, stopped = (0.2 + n * 0.1 + n / 10 * 0.5 + TUNE_TRIAL_OVERHEAD_S for n in (30, 10))  # 2 full, then 4 stopped
    w32_trial = 0.3 + 30 * 0.2 + 3 * 1.0 + TRIAL_OVERHEAD_S
    seconds = {p.phase: p.seconds for p in made.phases}
    assert seconds["tune"] == pytest.approx(PHASE_START_S + full + 2 * stopped)  # 6 trials in 2 lanes
    assert seconds["transfer"] == pytest.approx(PHASE_START_S + w32_trial)
    assert seconds["verify"] == pytest.approx(PHASE_START_S + 4 * w32_trial)  # 7 trials (one seed reused) in 2 lanes
    assert made.total_s == pytest.approx(STUDY_START_S + sum(seconds.values()))
    assert [(p.phase, p.trials, p.lanes) for p in made.phases] == [("tune", 6, 2), ("transfer", 1, 1), ("verify", 7, 2)]
    busy = estimate(spec, jobs, times, cpus=2, gpus=0, assumptions="made up", busy=2.0)  # load 2 on 2 cores
    assert [b.seconds - p.seconds for b, p in zip(busy.phases, made.phases, strict=True)] == pytest.approx(
        [PHASE_START_S] * 3)  # a start takes twice as long, the trials' steps as long as probed
    assert busy.total_s == pytest.approx(made.total_s + STUDY_START_S + 3 * PHASE_START_S)
    line = made.line()
    assert line.startswith("estimate: tune ") and " · transfer " in line and " · verify " in line
    assert line.endswith("(±25 %)") and "total ≈ " in line


def test_a_shape_not_timed_leaves_its_phase_and_the_total_unknown():
    spec = load_catalog("tiny_tau")  # TauGPT: no FLOP counts to scale by
    jobs = planned_jobs(spec, cpus=2)
    first = shapes_of(jobs)[0]
    times = completed(spec, shapes_of(jobs), {first: ShapeTime(0.1, 0.1, 0.1)})
    made = estimate(spec, jobs, times, cpus=2, gpus=0, assumptions="")
    assert made.total_s is None and any(p.seconds is None for p in made.phases)
    assert "total unknown" in made.line() and "?" in made.line()


def test_unprobed_shapes_are_scaled_by_flops_from_a_probed_one():
    spec = load_catalog("tiny")
    jobs = planned_jobs(spec, cpus=2)
    w16, w32 = shapes_of(jobs)
    times = completed(spec, [w16, w32], {w16: ShapeTime(0.1, 0.2, 0.3)})
    ratio = sequence_flops(spec, 32) / sequence_flops(spec, 16)
    assert times[w32].step_s == pytest.approx(0.1 * ratio) and times[w32].eval_s == pytest.approx(0.2 * ratio)
    assert times[w32].source == "w32 scaled from w16 by FLOPs" and times[w16].source == "probed"
    down = completed(spec, [w16, w32], {w32: ShapeTime(1.0, 1.0, 1.0)})  # nothing smaller: from the larger one
    assert down[w16].step_s == pytest.approx(1 / ratio)


def test_job_seconds():
    job = Job(Shape("pt", 32, None, 16, 64, "cpu"), steps=100, evals=4)
    assert job.seconds(ShapeTime(0.05, 0.5, 1.0)) == pytest.approx(1.0 + 5 + 2 + TRIAL_OVERHEAD_S)


@pytest.mark.parametrize(("seconds", "rough", "text"), [
    (0.4, False, "0 s"), (40.4, False, "40 s"), (60, False, "1 min"), (190, False, "3 min 10 s"),
    (3900, False, "1 h 5 min"), (7200, False, "2 h"), (187, True, "3 min 10 s"), (1234, True, "21 min")])
def test_duration_text(seconds, rough, text):
    assert duration_text(seconds, rough) == text


def test_a_compare_study_is_not_estimated():
    with pytest.raises(ValueError, match="compare study"):
        planned_jobs(load_catalog("compare_cpu"), cpus=2)
