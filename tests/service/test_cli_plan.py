"""`ptctl study plan`, `ptctl transfer --dry-run`: the proxy cost share from the spec alone, no torch, Ray, MLflow."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from studies import load_catalog
from studies.cost import plan_cost

ROOT = Path(__file__).parents[2]
GPU_SPEC = ROOT / "studies" / "catalog" / "paper_pt_minipile.yaml"
PROBE = """
import contextlib, io, json, sys
from service.cli import main
done = []
for args in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = main(args)
        except SystemExit as exc:
            rc = exc.code
    done.append([rc, out.getvalue(), sorted({m.split(".")[0] for m in sys.modules} & {"torch", "ray", "mlflow"})])
print(json.dumps(done))
"""
CATALOG = ROOT / "studies" / "catalog"
# the plans the tests read, in one fresh interpreter (each a `ptctl` call, in this order): a plan must not import
# torch, Ray or MLflow, and the modules are read after each call, so the calls that may import them come last
# (`--no-probe`: FLOPs only; the probe's wall-time estimate imports torch, tests/service/test_plan_estimate.py)
CALLS = {
    "dry_run": ["transfer", "--spec", str(GPU_SPEC), "--from-width", "128", "--to", "1024", "--dry-run", "--no-probe"],
    "gpu": ["study", "plan", "--no-probe", str(GPU_SPEC)],
    "compare": ["study", "plan", "--no-probe", str(CATALOG / "compare_cpu.yaml")],
    "batched": ["study", "plan", "--no-probe"],  # and cpu_demo with resources.batch_members = 16, which `plans` writes
    "horizon": ["study", "plan", "--no-probe", str(CATALOG / "horizon_cpu.yaml")],
    "cpu_demo": ["study", "plan", "--no-probe", str(CATALOG / "cpu_demo.yaml")],
    "tau": ["study", "plan", "--no-probe", str(CATALOG / "tau_cpu.yaml")],
    "missing": ["study", "plan", "nope.yaml"],
}


def _ptctl(calls: list[list[str]], columns: str | None = "200") -> list[tuple[int, str, list[str]]]:
    """Each call's exit code, output and the heavy modules imported by then, from one fresh `ptctl` interpreter."""
    env = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"}, "PYTHONPATH": str(ROOT)}
    if columns is not None:
        env["COLUMNS"] = columns
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(calls)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return [(rc, out, heavy) for rc, out, heavy in json.loads(done.stdout)]


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, tuple[int, str, list[str]]]:
    data = load_catalog("cpu_demo").as_dict()
    data["resources"]["batch_members"] = 16
    batched = tmp_path_factory.mktemp("plan") / "batched.yaml"
    batched.write_text(json.dumps(data))
    calls = {**CALLS, "batched": [*CALLS["batched"], str(batched)]}
    return dict(zip(calls, _ptctl(list(calls.values())), strict=True))


def test_transfer_dry_run_prints_the_gpu_specs_cost_share_without_training(plans):
    rc, out, heavy = plans["dry_run"]
    assert rc == 0, out
    assert heavy == []  # no torch, Ray or MLflow: nothing can train
    data = load_catalog("paper_pt_minipile").as_dict()
    data["tune"]["base_width"], data["transfer"]["widths"], data["verify"], data["validate"] = 128, [1024], None, None
    from studies.spec import StudySpec

    plan = plan_cost(StudySpec.model_validate(data))
    share = 100 * plan.share(1024, ("tune",))
    line = re.search(r"proxy cost = ([\d.]+) % of one target run at width 1024", out)
    assert line and float(line.group(1)) == pytest.approx(share, abs=0.05), out
    rows = {m.group(1): int(m.group(2)) for m in re.finditer(r"│ (\w+)\*? +│ +(\d+) │", out)}
    assert rows == {"tune": 64, "transfer": 1}  # no --verify: no verify phase; `transfer` runs no lr sweep
    # 64 trials at width 128 under ASHA (rungs 6k, 18k, 54k of 90k steps), against 90k steps at width 1024
    assert 0 < share < 100


def test_study_plan_lists_every_phase_and_target(plans):
    rc, out, heavy = plans["gpu"]
    assert rc == 0 and heavy == [], out
    for w in (512, 1024, 2048, 3072):
        assert f"of one target run at width {w}" in out
    assert "verify" in out and "65" in out  # 3 centre seeds + 62 samples


def test_study_plan_bad_file_is_one_line(plans):
    rc, out, _ = plans["missing"]
    assert rc == 2 and "no spec file nope.yaml" in out


def test_piped_output_keeps_long_lines_whole():
    """Without a terminal (a pipe, a log file, CI) lines are not cut at rich's 80 columns."""
    [(rc, out, _)] = _ptctl([CALLS["gpu"]], columns=None)
    assert rc == 0, out
    whole = (r"^proxy cost = [\d.]+ % of one target run at width \d+ \([\d.e+]+ FLOPs\); "
             r"tune \+ verify \+ validate = [\d.]+ %$")
    assert re.search(whole, out, re.M), out


def test_study_plan_of_a_compare_study_lists_its_runs(plans):
    """A compare study's plan: each family's solved width, tune trials and final runs at every budget (it was a
    traceback: plan_cost has no transfer widths to measure a compare study against)."""
    from studies.phases.compare import compare_widths

    spec = load_catalog("compare_cpu")
    rc, out, heavy = plans["compare"]
    assert rc == 0 and heavy == [], out
    assert "Traceback" not in out
    c = spec.compare
    rows = re.findall(r"│ (\w+) +│ (\w+) +│ +([\d,]+) │ +(\d+) │ +([\d,]+) │ +(\d+) │ +(\d+) │ +([\d,]+) │", out)
    widths = compare_widths(spec, spec.data.vocab_size)
    assert [(f, int(b.replace(",", "")), int(w)) for f, _, b, w, *_ in rows] == [
        (f, b, w) for f, info in widths.items() for b, w in zip(c.budgets, info["widths"], strict=True)]
    tune = {b.model.family: b.num_trials for b in c.baselines} | {spec.model.family: spec.tune.num_trials}
    for family, role, budget, _, _, trials, finals, steps in rows:
        assert role == widths[family]["role"]
        assert int(finals) == c.seeds and int(steps.replace(",", "")) == spec.steps_for("compare")
        once = role == "tuned" or int(budget.replace(",", "")) == c.proxy_budget  # PT: tuned once, at the proxy
        assert int(trials) == (tune[family] if once else 0)
    assert f"tuned once at width {widths[spec.model.family]['proxy_width']}" in out


def test_study_plan_prints_the_batches_each_grid_phase_will_run(plans):
    """With resources.batch_members = 16, cpu_demo's 59 verify samples (one seed) pack into 4 batches beside the
    centre's two other seeds; its validate sweep packs per (parametrization, width, seed)."""
    rc, out, heavy = plans["batched"]
    assert rc == 0 and heavy == [], out
    assert "batches: verify: 62 trials in 6 processes (15, 15, 15, 15, 1, 1 members)" in out
    assert "batches: validate: 20 trials in 4 processes (5, 5, 5, 5 members)" in out
    rc, out, _ = plans["cpu_demo"]
    assert "batch_members is auto: each trial alone on CPU" in out


def test_study_plan_of_a_family_without_flop_counts_lists_trials_and_steps(plans):
    """TauGPT registers no FLOP counts: the plan still lists each phase's trials, widths and steps, and says why
    there are no FLOPs (it used to end in a traceback calling the family unknown)."""
    rc, out, _ = plans["tau"]
    assert rc == 0, out
    assert "Traceback" not in out and "unknown model family" not in out
    assert re.search(r"tune\W+12\W+32\W+600\b", out), out  # 12 trials at width 32, ASHA's expected 600 steps
    assert "tauformer registers no FLOP counts" in out, out


def test_the_plan_of_a_horizon_sweep_counts_every_length_and_flags_the_short_proxy(plans):
    rc, out, heavy = plans["horizon"]
    assert rc == 0, out
    assert heavy == []
    assert re.search(r"validate\s*│\s*36\s*│\s*64\s*│\s*12,600", out), out  # 6 lrs × 2 seeds × (150+300+600)
    assert "horizon: tune trains 150 steps, the target 600 (train.steps; 2 doublings longer)" in out
    rc, out, _ = plans["cpu_demo"]
    assert rc == 0 and "horizon:" not in out  # tune trains train.steps: nothing to flag


def test_the_plan_says_each_built_ins_context_against_the_data(plans):
    """PT takes sequences of any length; TauGPT's declared context is its max_len (`studies.arch.context_line`)."""
    demo, tau = load_catalog("cpu_demo"), load_catalog("tau_cpu")
    rc, out, _ = plans["cpu_demo"]
    assert rc == 0 and f"context: data.seq_len {demo.data.seq_len}; model family 'pt' takes sequences of any " \
                       "length" in out, out
    rc, out, _ = plans["tau"]
    max_len = tau.model.arch.max_len  # type: ignore[attr-defined]
    assert rc == 0 and f"context: data.seq_len {tau.data.seq_len} within model.arch.max_len {max_len}" in out, out
