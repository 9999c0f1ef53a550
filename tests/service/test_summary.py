"""The CLI's end-of-study summary for any subset of phases, from a study folder written by hand (no training)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rich.console import Console

from analysis import certify, lr_drift
from service import summary
from studies import load_catalog
from studies.families.pt import HPARAMS
from studies.phases import StudyState
from studies.spec import StudySpec
from studies.sweeps import SWEEPS
from tests.analysis._tables import paper_like_optimum, sweep_table, trials, verify_table
from workers.folder import StudyFolder


def _spec(**sections) -> StudySpec:
    data = {"name": "sum", "model": {"family": "pt", "arch": {"n_channels": 2, "rank": 4}},
            "data": {"source": "shakespeare"}, "tune": {"base_width": 64}, **sections}
    return StudySpec.model_validate(data)


def _study(tmp_path, spec: StudySpec, phases: dict, tables: dict) -> summary.StudyView:
    folder = StudyFolder("sum-1", tmp_path).create()
    for name, table in tables.items():
        table.to_csv(folder.trials(name), index=False)
    folder.report.write_text("# report\n")
    folder.figure("mutransfer").write_bytes(b"png")
    state = StudyState.model_validate({"study_id": "sum-1", "spec_hash": "h", "status": "succeeded", "phases": phases})
    return summary.StudyView(spec=spec, state=state, folder=folder, runs={"t000": "run-abc"},
                             runs_link="http://ui/#/runs")


def _printed(view: summary.StudyView) -> str:
    console = Console(record=True, width=200)
    summary.print_summary(console, view)
    return console.export_text()


TUNE = {"status": "done", "best_hparams": {**dict.fromkeys(HPARAMS, 1.0), "lr": 0.01}, "best_eval_loss": 5.1,
        "n_trials": 4}


def test_tune_and_validate_only(tmp_path):
    sweep = sweep_table(paper_like_optimum)
    drift = lr_drift(sweep)
    w_h = lr_drift(sweep.assign(swept="lr"))  # a second swept hparam's verdict, as validate.hparams gives
    view = _study(tmp_path, _spec(transfer=None, verify=None,
                                  validate={"widths": [64, 128], "lrs": [0.001, 0.01, 0.1]}),
                  {"tune": TUNE, "validate": {"status": "done", "lr_drift": drift.model_dump(),
                                              "hparam_drift": {"w_H": w_h.model_copy(update={"hparam": "w_H"})
                                                               .model_dump()}}},
                  {"tune": trials([{"eval_loss": 5.1}]), "validate": sweep})
    view.folder.figure("mutransfer_w_H").write_bytes(b"png")
    text = _printed(view)
    assert "w_H sweep (validate)" in text and "mutransfer_w_H.png" in text
    assert "lr=0.01" in text
    assert "mup" in text and "standard" in text and "+0.00" in text and "-1.00" in text
    assert "per doubling" in text
    assert "report" in text and "mutransfer.png" in text and "http://ui/#/runs" in text
    assert "tuned (base)" in text and "completed" not in text  # the width table holds the base width only


def test_every_phase(tmp_path):
    transfer = trials([{"width": w, "eval_loss": 5.0 - w / 1000, "params": 10 * w} for w in (128, 256)],
                      phase="transfer")
    verify = verify_table([5.0, 5.01, 5.02], [5.1] * 10)
    cert = certify(verify)
    view = _study(tmp_path, _spec(transfer={"widths": [128, 256]}, verify={"n_samples": 10}),
                  {"tune": TUNE, "transfer": {"status": "done"},
                   "verify": {"status": "done", "certificate": cert.model_dump()}},
                  {"tune": trials([{"eval_loss": 5.1, "width": 64}]), "transfer": transfer, "verify": verify})
    text = _printed(view)
    for width in ("64", "128", "256"):
        assert width in text
    assert "run-abc" in text  # the transfer trial t000's MLflow run
    assert cert.verdict[:40] in text


@pytest.mark.parametrize(("alpha", "noise"), [(0.05, True), (0.5, False)])
def test_an_uncertified_centre_blames_seed_noise_only_when_it_explains_the_count(tmp_path, alpha, noise):
    # 13 of 59 beat the centre (s = 0.02) by 0.03: within the 95% quantile (17) of the count seed noise gives at
    # t = s and 3 seeds, above its median (11); the certificate's alpha must reach the advice
    rows = [{"is_centre": True, "seed": s, "eval_loss": loss} for s, loss in enumerate((5.0, 5.02, 4.98))]
    rows += [{"lr": 0.013, "eval_loss": 4.97}] * 13 + [{"lr": 0.007, "eval_loss": 5.01}] * 46
    verify = trials(rows, phase="verify")
    cert = certify(verify, alpha=alpha)
    view = _study(tmp_path, _spec(transfer={"widths": [128]}, verify={"n_samples": 59, "alpha": alpha}),
                  {"tune": TUNE, "transfer": {"status": "done"},
                   "verify": {"status": "done", "certificate": cert.model_dump()}},
                  {"tune": trials([{"eval_loss": 5.1, "width": 64}]), "verify": verify})
    text = _printed(view)
    assert "≈11.4 of 59" in text
    assert ("not evidence of a better neighbourhood" in text and "verify.centre_seeds" in text) is noise
    assert ("larger lr" in text and "tune.num_trials" in text) is not noise


def test_compare_only(tmp_path):
    """A compare study's summary holds its result: eval loss per family at every budget, the best first."""
    rows = [{"family": f, "budget": b, "role": role, "width": w, "params": p, "n_seeds": 2, "n_diverged": d,
             "eval_loss_mean": m, "eval_loss_std": sd, "rank": r}
            for f, b, role, w, p, d, m, sd, r in [("pt", 5e4, "transferred", 44, 49932, 0, 2.38, 0.004, 1),
                                                  ("bert", 5e4, "tuned", 33, 49002, 1, 2.91, float("nan"), 2),
                                                  ("pt", 1e5, "transferred", 70, 101100, 0, 2.27, 0.025, 1)]]
    compare = {"status": "done", "summary": rows, "tokens": 2_000_000}
    view = _study(tmp_path, load_catalog("compare_cpu_bpe"), {"compare": compare}, {})
    text = _printed(view)
    assert "eval loss per parameter budget (2,000,000 training tokens a run)" in text
    lines = [line for line in text.splitlines() if "transferred" in line or "tuned" in line]
    assert [line.split()[1:4:2] for line in lines] == [["50,000", "pt"], ["50,000", "bert"], ["100,000", "pt"]]
    assert "2.3800 ± 0.0040" in lines[0] and "49,932" in lines[0] and "2.9100" in lines[1]
    assert "1 diverged" in lines[1] and "±" not in lines[1]  # one finished seed: no spread to show


@pytest.mark.parametrize("phases", [{}, {"tune": {"status": "running"}}])
def test_nothing_finished(tmp_path, phases):
    text = _printed(_study(tmp_path, _spec(transfer={"widths": [128]}), phases, {}))
    assert "sum-1" in text


def test_cli_summary_of_a_tune_validate_study(tmp_path, monkeypatch):
    """`ptctl study run`'s summary for a study without a transfer phase (it once exited 2 reading
    transfer_trials.csv) through the CLI's local backend, with a real MLflow store."""
    from service import cli

    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    sweep = sweep_table(paper_like_optimum)
    spec = _spec(transfer=None, verify=None, validate={"widths": [64, 128], "lrs": [0.001, 0.01, 0.1]})
    sweep.to_csv(StudyFolder("sum-1", tmp_path).create().trials("validate"), index=False)
    state = StudyState(study_id="sum-1", spec_hash="hash", status="succeeded", instance="i1",
                       phases={"tune": TUNE, "validate": {"status": "done", "lr_drift": lr_drift(sweep).model_dump()}})
    console = Console(record=True, width=200)
    monkeypatch.setattr(cli, "console", console)
    cli.local().summary(spec, state)
    text = console.export_text()
    assert "-1.00" in text and "#/experiments/" in text
    json.dumps(text)


def test_the_summary_states_the_transfer_regret_in_one_line(tmp_path):
    from analysis.regret import transfer_regret

    sweep = sweep_table(paper_like_optimum)
    regret = transfer_regret(sweep, {"lr": 2.0**-8.5}, [128], proxy_width=64)
    state = {"status": "done", "lr_drift": lr_drift(sweep).model_dump(),
             "regret": [r.model_dump(mode="json") for r in regret]}
    view = _study(tmp_path, _spec(transfer={"widths": [128]}, verify=None,
                                  validate={"widths": [64, 128], "lrs": [0.001, 0.01, 0.1]}),
                  {"tune": TUNE, "validate": state}, {"tune": trials([{"eval_loss": 5.1}]), "validate": sweep})
    lines = [line for line in _printed(view).splitlines() if "Transfer regret" in line]
    assert len(lines) == 1
    assert "at width 128: mup +0.0125 nats (+0.54 %) [95 % CI +0.0125, +0.0125], standard +0.05 nats" in lines[0]


def test_the_summary_shows_the_lr_optimum_per_depth_and_its_drift(tmp_path):
    from tests.analysis.test_transfer import _depth_table, depth_sweep

    table = _depth_table(lambda dp, depth, seed: -8.0 - (0.8 * np.log2(depth / 2) if dp == "none" else 0.0))
    drift = lr_drift(depth_sweep(table), axis=SWEEPS["depth"].axis)
    spec = load_catalog("depth_cpu")
    view = _study(tmp_path, spec, {"tune": {**TUNE, "best_hparams": spec.space.defaults()},
                                   "validate": {"status": "done", "depth_drift": drift.model_dump()}},
                  {"tune": trials([{"eval_loss": 5.1}]), "validate": table})
    view.folder.figure("depth").write_bytes(b"png")
    text = _printed(view)
    assert "lr sweep (validate) at width 32: optimal lr per depth" in text
    assert "lr drift at width 32, completep: +0.00 log2(lr) per doubling of depth" in text
    assert "lr drift at width 32, none: -0.80 log2(lr) per doubling of depth" in text
    assert "completep's optimal lr at width 32 drifts +0.00" in text and "depth.png" in text


def test_a_winner_at_the_starting_point_says_how_the_other_trials_fared(tmp_path):
    """The demo's usual story: TPE's first trial (the space's defaults) won; the summary says so, and that none of
    the others beat it, how many ASHA stopped early and how many diverged."""
    rows = [{"eval_loss": 5.1}, {"eval_loss": 5.3, "lr": 0.05}, {"status": "stopped", "eval_loss": 6.0},
            {"status": "stopped", "eval_loss": 6.2}, {"status": "diverged"}]
    spec = _spec(transfer={"widths": [128]}, verify=None)
    view = _study(tmp_path, spec, {"tune": {**TUNE, "best_hparams": spec.space.defaults(), "n_trials": 5}},
                  {"tune": trials(rows)})
    text = " ".join(_printed(view).split())
    assert ("the tune phase's winner is its starting point (the search space's defaults, its first trial): none of "
            "the other 4 trials beat it (1 completed with a higher eval loss, 2 stopped early by ASHA, 1 diverged)"
            ) in text


def test_a_winner_away_from_the_starting_point_is_not_called_the_start(tmp_path):
    spec = _spec(transfer={"widths": [128]}, verify=None)
    moved = {**spec.space.defaults(), "lr": 0.03}
    view = _study(tmp_path, spec, {"tune": {**TUNE, "best_hparams": moved}}, {"tune": trials([{"eval_loss": 5.1}])})
    assert "starting point" not in _printed(view)


@pytest.mark.parametrize(("tune_wall", "words"), [
    (3.0, "the tune phase (the proxy) took 75.0 % of the wall time and 7.0 % of the FLOPs of one training run at "
          "the target width 64 (its 6 trials' wall times summed); tune + verify together took 3.75× its wall time "
          "and 37.0 % of its FLOPs"),
    (6.96, "the tune phase (the proxy) took 1.74× the wall time and 7.0 % of the FLOPs of one training run at the "
           "target width 64"),
])
def test_the_cost_line_says_what_it_compares(tmp_path, tune_wall, words):
    cost = {"rows": [{"phase": "tune", "trials": 6, "steps": 100, "flops": 7.0e9, "trial_wall_s": tune_wall,
                      "phase_wall_s": 9.0},
                     {"phase": "transfer", "trials": 2, "steps": 60, "flops": 2.0e11, "trial_wall_s": 8.0,
                      "phase_wall_s": None},
                     {"phase": "verify", "trials": 8, "steps": 240, "flops": 3.0e10, "trial_wall_s": 12.0,
                      "phase_wall_s": 20.0}],
            "targets": {"32": {"flops": 1.0e10, "wall_s": 4.0}, "64": {"flops": 1.0e11, "wall_s": 4.0}}}
    view = _study(tmp_path, _spec(transfer={"widths": [128]}, verify=None), {"tune": TUNE}, {})
    view.folder.cost.write_text(json.dumps(cost))
    text = " ".join(_printed(view).split())
    assert f"cost: {words}" in text and "% wall time of one target run" not in text


def test_the_cost_line_without_a_target_width(tmp_path):
    view = _study(tmp_path, _spec(transfer=None, verify=None), {"tune": TUNE}, {})
    view.folder.cost.write_text(json.dumps({"rows": [], "targets": {}}))
    assert "cost: no transfer width: no training run at a target width" in _printed(view)
