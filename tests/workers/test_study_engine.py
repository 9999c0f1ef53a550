"""End to end through real Ray Tune (Optuna TPE + ASHA), real MLflow on SQLite, the tiny catalog study."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

import pandas as pd
import pytest

from studies import load_catalog
from studies.spec import StudySpec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(study_data_dir):
    return study_data_dir


def _runs(study_id: str, experiment: str):
    from workers.mlflow_tracker import Tracker

    tracker = Tracker(experiment)
    return {kind: tracker.runs(study_id, kind) for kind in ("study", "phase", "trial")}


@pytest.fixture(scope="module")
def tiny_study(data_dir):
    from workers.driver import run_study

    spec = load_catalog("tiny")
    state = run_study(spec, "e2e")
    return spec, state, data_dir / "studies" / "e2e"


def test_the_local_runner_trains_the_ray_paths_trials_to_the_same_losses(tiny_study, data_dir):
    """`resources.runner: local` (no Ray) on the same spec: its tune and transfer phases are the Ray study's (the
    same phase keys: reused), and its verify phase trains in this process the same planned trials, to the same
    losses, under the same certificate logic."""
    from workers.driver import run_study
    from workers.folder import StudyFolder

    spec, ray_state, _ = tiny_study
    local = spec.model_copy(update={"resources": spec.resources.model_copy(update={"runner": "local"})})
    assert local.content_hash() == spec.content_hash()  # how trials are run is not what they compute
    state = run_study(local, "e2e-local")
    assert state.status == "succeeded" and state.phases["tune"].reused_from == "e2e"
    ray_verify = pd.read_csv(StudyFolder("e2e").trials("verify")).set_index("trial_id").sort_index()
    local_verify = pd.read_csv(StudyFolder("e2e-local").trials("verify")).set_index("trial_id").sort_index()
    assert list(local_verify.index) == list(ray_verify.index)  # the same planned trials
    assert local_verify.eval_loss.to_numpy() == pytest.approx(ray_verify.eval_loss.to_numpy(), rel=1e-4)
    mine, theirs = state.phases["verify"].certificate, ray_state.phases["verify"].certificate
    assert (mine.n_samples, mine.n_better, mine.centre_rank, mine.certified) == \
        (theirs.n_samples, theirs.n_better, theirs.centre_rank, theirs.certified)
    assert mine.upper_bound == pytest.approx(theirs.upper_bound) and \
        mine.centre_loss == pytest.approx(theirs.centre_loss, rel=1e-4)
    journal = data_dir / "studies" / "e2e-local" / "ray" / "e2e-local.verify" / "trials.jsonl"
    assert len(journal.read_text().splitlines()) == sum(~local_verify.message.fillna("").str.startswith("reused"))


def test_all_phases_finish_with_artifacts(tiny_study):
    spec, state, folder = tiny_study
    assert state.status == "succeeded"
    assert [p for p, s in state.phases.items() if s.done] == ["tune", "transfer", "verify"]
    art = folder / "artifacts"
    for name in ("tune_history.png", "transfer.png", "verify.png", "report.md", "report.html", "trials.csv",
                 "spec.yaml"):
        assert (art / name).stat().st_size > 0, name
    cert = json.loads((art / "certificate.json").read_text())
    assert cert["n_samples"] == spec.verify.n_samples and cert["centre_seeds"] == spec.verify.centre_seeds
    for key in ("n_better", "upper_bound", "confidence_if_none_better", "centre_rank", "tolerance", "verdict"):
        assert key in cert
    assert 0 < cert["upper_bound"] <= 1 and 1 <= cert["centre_rank"] <= cert["n_samples"] + 1
    trials = pd.read_csv(art / "trials.csv")
    assert Counter(trials.phase) == {"tune": spec.tune.num_trials, "transfer": 1,
                                     "verify": spec.verify.n_samples + spec.verify.centre_seeds}
    judged = trials[trials.status.isin(["completed", "stopped"])]  # a stopped trial's best and steps, from its report
    assert judged.best_eval_loss.notna().all() and (judged.best_eval_loss <= judged.eval_loss).all()
    assert (judged.steps > 0).all() and (judged.train_loss > 0).all()
    # the winner is applied unchanged at the transfer width
    best = state.phases["tune"].best_hparams
    transfer = trials[trials.phase == "transfer"].iloc[0]
    assert transfer.width == 32 and transfer.lr == pytest.approx(best["lr"])
    assert "centre" in (art / "report.md").read_text()


def test_mlflow_tells_the_study_at_a_glance(tiny_study):
    """The study and phase runs carry the verdicts, figures, tables, dataset and provenance; trial runs are named
    for a reader and carry steps_done and the per-group lr multipliers; the reused verify centre is a run."""
    from mlflow import MlflowClient

    from workers.mlflow_tracker import VIEW_ID, VIEW_TAG, Tracker

    spec, state, _ = tiny_study
    tracker = Tracker(spec.experiment_name())
    client = MlflowClient(tracker.uri)
    assert client.get_experiment(tracker.experiment_id).tags.get("mlflow.experimentKind") == \
        "custom_model_development"
    study = client.get_run(state.runs["study"])
    best = state.phases["tune"].best_hparams
    assert float(study.data.params["best.lr"]) == pytest.approx(best["lr"])
    assert study.data.params["base_width"] == "16" and study.data.params["target_widths"] == "32"
    assert study.data.tags["certified"] in ("true", "false")
    assert {"upper_bound", "n_better", "centre_rank"} <= set(study.data.metrics)
    note = study.data.tags["mlflow.note.content"]
    assert note.startswith("Tuned at width 16") and "Certificate:" in note  # the verdict first: the table shows it
    assert study.data.tags["mlflow.user"] and "mlflow.source.name" in study.data.tags
    assert [d.dataset.name for d in study.inputs.dataset_inputs] == ["shakespeare"]
    artifacts = {a.path for a in client.list_artifacts(study.info.run_id)}
    assert {"report.md", "report.html", "tune_history.png", "transfer.png", "verify.png", "trials.json"} <= artifacts
    # the saved runs-table view `verdicts`, which the printed link opens, shows them
    view = json.loads(json.loads(client.get_experiment(tracker.experiment_id).tags[VIEW_TAG + VIEW_ID])["state"])
    assert {"tags.`certified`", "metrics.`upper_bound`", "params.`best.lr`", "params.`target_widths`"} <= \
        set(view["selectedColumns"])
    assert f"viewStateShareKey={VIEW_ID}" in tracker.runs_link()
    transfer = client.get_run(state.runs["transfer"])
    assert [(m.step, round(m.value, 6)) for m in client.get_metric_history(transfer.info.run_id, "eval_loss")] == \
        [(32, round(state.phases["transfer"].widths[0]["eval_loss_mean"], 6))]
    assert "transfer_trials.json" in {a.path for a in client.list_artifacts(transfer.info.run_id)}
    trials = tracker.runs(state.study_id, "trial", state.instance)
    tune_names = [r.info.run_name for r in trials if r.data.tags["phase"] == "tune"]
    assert all(re.fullmatch(r"tune-\d\d lr=\d\.\de-\d+", n) for n in tune_names), tune_names
    stopped = [r for r in trials if r.data.tags["status"] == "stopped"]
    assert all(r.data.metrics["steps_done"] < spec.train.steps for r in stopped)
    assert all("lr_mult.hidden" in r.data.params for r in trials if r.data.tags["status"] == "completed"
               and "reused_from" not in r.data.tags)
    assert all({"system/cpu_utilization_percentage", "system/peak_rss_megabytes"} <= set(r.data.metrics)
               for r in trials if r.data.tags["status"] == "completed" and "reused_from" not in r.data.tags)
    reused = [r for r in trials if r.data.tags.get("reused_from")]
    assert [r.data.tags["reused_from"] for r in reused] == ["transfer-w32-s0"]


def test_mlflow_ui_in_a_headless_browser(tiny_study, data_dir, tmp_path):
    """The MLflow UI as a user sees it, in headless Chromium (tests/ui/mlflow_ui_check.py): the printed link opens
    the runs table with the verdict columns, the study run's page shows its verdicts, its report its figures."""
    from tests.ui.mlflow_ui_check import check_ui, missing_requirements, mlflow_server
    from workers.mlflow_tracker import Tracker

    missing = missing_requirements()
    if missing:
        pytest.skip(f"no headless browser: {missing}")
    spec, state, _ = tiny_study
    uri = Tracker(spec.experiment_name()).uri
    if uri.startswith("http"):
        result = check_ui(uri.rstrip("/"), tmp_path, state.study_id)
    else:
        with mlflow_server(data_dir) as url:
            result = check_ui(url, tmp_path, state.study_id)
    assert result.problems == []
    table = result.texts["runs_table"]
    assert all(k in table for k in ("verdicts", "certified", "upper_bound", "n_better", "centre_rank", "best.lr",
                                    "base_width", "target_widths", "eval_loss", "steps_done"))
    assert re.search(r"tune-\d\d lr=\d\.\de-\d", table) and "transfer" in table and "verify" in table
    assert "Certificate:" in result.texts["study_run"] and "best.lr" in result.texts["study_run"]
    assert set(result.figures) == {"tune", "transfer", "verify"} and all(result.figures.values())
    assert all(shot.stat().st_size > 10_000 for shot in result.screenshots)


def test_verify_cli_reuses_tune_and_transfer(tiny_study, capsys):
    from service.cli import main

    assert main(["verify", "e2e", "--samples", "3", "--delta", "0.2", "--centre-seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "reused from e2e" in out and "of 3 samples beat it" in out


def test_identical_tune_phase_is_reused(tiny_study):
    from workers.driver import run_study

    spec, first, _ = tiny_study
    data = spec.as_dict()
    data["transfer"]["widths"] = [48]
    data["verify"] = None
    state = run_study(StudySpec.model_validate(data), "reuse")
    assert state.phases["tune"].reused_from == "e2e"
    assert state.phases["tune"].best_hparams == first.phases["tune"].best_hparams
    tune_runs = [r for r in _runs("reuse", spec.experiment_name())["trial"] if r.data.tags["phase"] == "tune"]
    assert tune_runs == []  # nothing retrained


def test_mlflow_hierarchy(tiny_study):
    spec, state, _ = tiny_study
    runs = _runs("e2e", spec.experiment_name())
    assert len(runs["study"]) == 1
    study_run = runs["study"][0].info.run_id
    phases = {r.data.tags["phase"]: r for r in runs["phase"]}
    assert set(phases) == {"tune", "transfer", "verify"}
    assert all(r.data.tags["mlflow.parentRunId"] == study_run for r in phases.values())
    trials = pd.read_csv(tiny_study[2] / "artifacts" / "trials.csv")
    assert len(runs["trial"]) == len(trials) == trials.trial_id.nunique()
    for run in runs["trial"]:
        tags, params = run.data.tags, run.data.params
        assert tags["mlflow.parentRunId"] == phases[tags["phase"]].info.run_id
        assert {"width", "seed", "status", "study_id"} <= set(tags)
        assert float(params["lr"]) > 0 and params["model_hp.width"] == tags["width"]
        assert tags["status"] in ("completed", "stopped")
    completed = [r for r in runs["trial"] if r.data.tags["status"] == "completed"]
    assert all("eval_loss" in r.data.metrics for r in completed)
    # a reused verify centre run holds the final eval loss and names the transfer run whose curves it is
    assert all("lr_hidden" in r.data.metrics for r in completed if "reused_from" not in r.data.tags)
    assert "tune" in phases and any(a.path == "tune_trials.csv" for a in
                                    __import__("mlflow").MlflowClient(os.environ.get("MLFLOW_TRACKING_URI") or
                                    f"sqlite:///{tiny_study[2].parents[1] / 'mlflow.db'}")
                                    .list_artifacts(phases["tune"].info.run_id))


def test_diverging_trial_is_recorded_and_study_completes(data_dir):
    from workers.driver import run_study

    data = load_catalog("tiny").as_dict()
    data["name"] = "tiny-diverge"
    # the first TPE point is the space's default: an absurd learning rate that must diverge
    data["space"]["lr"] = {"low": 1e-3, "high": 1e6, "log": True, "default": 1e6}
    data["verify"] = None
    data["validate"] = {"widths": [16, 32], "lrs": [1e-3, 1e-2, 1e-1], "steps": 10, "hparams": {"w_H": [0.5, 1, 2]}}
    spec = StudySpec.model_validate(data)
    state = run_study(spec, "diverge")
    assert state.status == "succeeded"
    drift = state.phases["validate"].drift()  # the μTransfer sweep ran under both parametrizations
    assert {o.parametrization for o in drift.optima} == {"mup", "standard"}
    w_h = state.phases["validate"].drift(hparam="w_H")  # and w_H's, alone around the centre
    assert w_h.hparam == "w_H" and {o.lr for o in w_h.optima} <= {0.5, 1.0, 2.0}
    art = data_dir / "studies" / "diverge" / "artifacts"
    assert (art / "mutransfer.png").stat().st_size > 0 and (art / "mutransfer_w_H.png").stat().st_size > 0
    assert "mup's optimal w_H drifts" in (art / "report.md").read_text()
    validate_run = [r for r in _runs("diverge", spec.experiment_name())["phase"] if r.data.tags["phase"] == "validate"]
    assert {"lr_drift_passed", "w_H_drift_passed"} <= set(validate_run[0].data.tags)
    trials = pd.read_csv(data_dir / "studies" / "diverge" / "artifacts" / "tune_trials.csv")
    assert (trials.status == "diverged").any()
    diverged = _runs("diverge", spec.experiment_name())["trial"]
    assert any(r.data.tags["status"] == "diverged" for r in diverged)
    assert state.phases["tune"].best_hparams["lr"] < 1e6


DRIVER = """
import sys
from studies import load_catalog
from studies.spec import StudySpec
from workers.driver import run_study
data = load_catalog("tiny").as_dict()
data["verify"] = None
data["tune"].update(seed=int(sys.argv[2]), num_trials=8)  # not the e2e study's tune phase, which would be reused
# every trial to its full 200 steps (≈ 1.5 s each on a quiet core): the phase outlasts the test's poll for the kill
data["tune"]["asha"]["enabled"], data["train"]["steps"] = False, 200
run_study(StudySpec.model_validate(data), sys.argv[1])
"""
RESUME_TRIALS = 8


@pytest.mark.parametrize(("study_id", "seed", "sig"), [("resume", 1, signal.SIGKILL), ("ctrl-c", 2, signal.SIGINT)])
def test_a_killed_or_interrupted_driver_resumes_without_duplicates(data_dir, study_id, seed, sig):
    """SIGKILL (a crash) or SIGINT (Ctrl-C: Tune stops and returns the trials it ran) mid-tune, then the same
    command again: every planned trial once, in the table and in MLflow."""
    env = {**os.environ, "PTCTL_DATA_DIR": str(data_dir), "RAY_ADDRESS": ""}
    from workers.mlflow_tracker import Tracker

    tracker = Tracker("tiny", f"sqlite:///{data_dir / 'mlflow.db'}")
    command = [sys.executable, "-c", DRIVER, study_id, str(seed)]
    log = open(data_dir / f"{study_id}-driver.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(command, env=env, start_new_session=True, stdout=log, stderr=log)
    deadline = time.time() + 240
    while time.time() < deadline:  # kill it once some tune trials have finished and others run
        runs = tracker.runs(study_id, "trial") if (data_dir / "mlflow.db").exists() else []
        if sum(r.data.tags.get("status") in ("completed", "stopped") for r in runs) >= 2:
            break
        time.sleep(0.5)
    else:
        proc.kill()
        log_text = (data_dir / f"{study_id}-driver.log").read_text()
        pytest.fail(f"the tune phase did not finish two trials in time:\n{log_text}")
    os.killpg(proc.pid, sig)
    proc.wait(120)
    state = json.loads((data_dir / "studies" / study_id / "state.json").read_text())
    assert "tune" not in state["phases"]  # stopped during tune
    if sig == signal.SIGINT:
        assert state["status"] == "interrupted" and "re-run" in state["error"], state.get("error")

    subprocess.run(command, env=env, check=True, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spec = load_catalog("tiny")
    trials = pd.read_csv(data_dir / "studies" / study_id / "artifacts" / "trials.csv")
    runs = _runs(study_id, spec.experiment_name())
    tune_runs = [r for r in runs["trial"] if r.data.tags["phase"] == "tune"]
    assert len(trials[trials.phase == "tune"]) == RESUME_TRIALS
    assert len(tune_runs) == len({r.data.tags["trial_key"] for r in tune_runs}) == RESUME_TRIALS
    assert all(r.data.tags["status"] in ("completed", "stopped", "diverged") for r in tune_runs)
    assert len(runs["study"]) == 1 and len(runs["phase"]) == 2


def test_cost_in_report_summary_and_study_run(tiny_study, capsys):
    """The report, the CLI summary and the study's MLflow run give the proxy's share of one target run."""
    from service.cli import local
    from studies.cost import sequence_flops

    spec, state, folder = tiny_study
    art = folder / "artifacts"
    trials = pd.read_csv(art / "trials.csv")
    tune = trials[trials.phase == "tune"]
    batch = spec.train.batch_size
    tune_flops = sum(s * batch * sequence_flops(spec, w) for w, s in zip(tune.width, tune.steps, strict=True))
    target = spec.train.steps * spec.train.batch_size * sequence_flops(spec, 32)
    study_run = _runs("e2e", spec.experiment_name())["study"][0]
    assert study_run.data.metrics["cost.proxy_pct.w32"] == pytest.approx(100 * tune_flops / target)
    assert {"cost.checks_pct.w32", "cost.proxy_wall_pct.w32", "cost.verify.flops"} <= set(study_run.data.metrics)
    assert all(state.phases[p].wall_s > 0 for p in ("tune", "transfer", "verify"))
    report = (art / "report.md").read_text()
    assert f"**proxy cost = {100 * tune_flops / target:.1f} % FLOPs" in report
    local().summary(spec, state)
    assert "cost: the tune phase (the proxy) took " in capsys.readouterr().out
