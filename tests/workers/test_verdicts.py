"""The verdicts the MLflow runs carry, built from phase results as state.json keeps them (no MLflow here)."""

from analysis import certify, lr_drift
from studies import load_catalog
from studies.phases import PHASES, StudyState, phases_of
from tests.analysis._tables import paper_like_optimum, sweep_table, verify_table
from workers.verdicts import provenance_tags, study_verdict, trial_run_name, verdict_columns

SPEC = load_catalog("cpu_demo")
TUNE = {"status": "done", "best_hparams": {**SPEC.space.defaults(), "lr": 0.0044}, "best_eval_loss": 5.8,
        "n_trials": 10}


def phase_verdict(spec, phase, record):
    """The phase's verdict of its result as state.json keeps it."""
    return PHASES[phase].verdict(spec, PHASES[phase].result.model_validate(record))


def test_each_phase_verdict():
    tune = phase_verdict(SPEC, "tune", TUNE)
    assert tune.params["best.lr"] == 0.0044 and tune.params["base_width"] == 32
    assert "lr=4.4e-3" in tune.sentence
    transfer = phase_verdict(SPEC, "transfer", {"widths": [{"width": 64, "eval_loss_mean": 5.7},
                                                           {"width": 128, "eval_loss_mean": 5.5}]})
    assert transfer.params["target_widths"] == "64,128"
    assert transfer.metrics == [{"step": 64, "eval_loss": 5.7}, {"step": 128, "eval_loss": 5.5}]
    cert = certify(verify_table([5.0, 5.01], [5.2] * 8))
    verify = phase_verdict(SPEC, "verify", {"certificate": cert.model_dump()})
    assert verify.tags == {"certified": "false"}
    assert {"upper_bound", "n_better", "centre_rank"} <= set(verify.metrics[0])
    assert verify.metrics[0]["noise_better_expected"] == cert.noise_better_expected
    one_seed = certify(verify_table([5.0], [5.2] * 8), tolerance=0.004)  # no seed noise to model
    one_seed_verdict = phase_verdict(SPEC, "verify", {"certificate": one_seed.model_dump()})
    assert "noise_better_expected" not in one_seed_verdict.metrics[0]
    older = {k: v for k, v in cert.model_dump().items() if not k.startswith("noise_")}  # a state.json from before
    assert "noise_better_expected" not in phase_verdict(SPEC, "verify", {"certificate": older}).metrics[0]
    drift = lr_drift(sweep_table(paper_like_optimum))
    validate = phase_verdict(SPEC, "validate", {"lr_drift": drift.model_dump()})
    assert round(validate.metrics[0]["lr_drift.standard"], 6) == -1.0 and validate.tags["lr_drift_passed"] == "true"


def test_study_verdict_merges_the_finished_phases():
    state = StudyState.model_validate({"study_id": "s", "spec_hash": "h",
                                       "phases": {"tune": TUNE, "transfer": {"status": "running"}}})
    verdict = study_verdict(SPEC, state)
    assert "best.lr" in verdict.params and verdict.sentence.startswith("Tuned at width 32")
    assert "Zero-shot" not in verdict.sentence


def test_trial_run_names_and_provenance():
    assert trial_run_name("tune-2c5b1a0e", {"lr": 0.0044}, number=7) == "tune-07 lr=4.4e-3"
    assert trial_run_name("verify-sample003", {"lr": 0.012}) == "verify-sample003 lr=1.2e-2"
    assert trial_run_name("validate-mup-w32-lr0.002-s0", {"lr": 0.002}) == "validate-mup-w32-lr0.002-s0"
    tags = provenance_tags("demo")
    assert tags["mlflow.user"] and tags["mlflow.source.name"]


def _demo_verdict(spec=SPEC):
    """The study verdict of a demo-shaped study whose phases all finished: a certificate, a transfer to 64 and 128
    and an lr sweep whose regret is stated where each parametrization was transferred to (mup at 64 and 128,
    standard, carried from 64, at 128 alone)."""
    from analysis import transfer_regret

    sweep = sweep_table(paper_like_optimum)
    regret = transfer_regret(sweep, {"lr": 2.0**-8.5}, [64, 128], proxy_width=64)
    records = {"tune": TUNE, "transfer": {"status": "done", "widths": [{"width": 64, "eval_loss_mean": 5.7},
                                                                       {"width": 128, "eval_loss_mean": 5.5}]},
               "verify": {"status": "done", "certificate": certify(verify_table([5.0, 5.01], [5.2] * 8)).model_dump()},
               "validate": {"status": "done", "lr_drift": lr_drift(sweep).model_dump(),
                            "regret": [r.model_dump() for r in regret]}}
    state = StudyState.model_validate({"study_id": "s", "spec_hash": "h",
                                       "phases": {k: v for k, v in records.items() if k in phases_of(spec)}})
    return study_verdict(spec, state)


def test_verdict_columns_name_every_verdict_the_runs_carry():
    """The saved runs-table view shows what the verdicts log, grouped as the UI groups them (tags, metrics,
    params): the certificate first, each searched hparam's winner (frozen ones are constants), each drift, the
    description last; keys as the MLflow UI writes them."""
    verdict = _demo_verdict()
    columns = verdict_columns(verdict)
    assert columns[:2] == ["tags.`certified`", "tags.`lr_drift_passed`"]
    assert columns[2:5] == ["metrics.`upper_bound`", "metrics.`n_better`", "metrics.`centre_rank`"]
    assert columns[-1] == "attributes.`Description`"
    assert {"params.`best.lr`", "params.`base_width`", "params.`target_widths`", "metrics.`eval_loss`",
            "metrics.`best_eval_loss`", "metrics.`steps_done`", "metrics.`lr_drift.mup`",
            "metrics.`lr_drift.standard`", "tags.`lr_drift_passed`"} <= set(columns)
    assert {f"params.`best.{h}`" for h in SPEC.space.searched()} <= set(columns)
    assert not {f"params.`best.{h}`" for h in SPEC.space.frozen} & set(columns)
    logged = {*(f"params.`{k}`" for k in verdict.params), *(f"tags.`{k}`" for k in verdict.tags),
              *(f"metrics.`{k}`" for row in verdict.metrics for k in row), "metrics.`eval_loss`",
              "metrics.`steps_done`", "attributes.`Description`"}  # the last three: every trial run's
    assert set(columns) <= logged  # a column no run logs is one the UI cannot show
    tiny = load_catalog("tiny")  # no validate phase: no drift column
    tiny_columns = verdict_columns(_demo_verdict(tiny))
    assert not [c for c in tiny_columns if "drift" in c] and "tags.`certified`" in tiny_columns
    only_tune = study_verdict(SPEC, StudyState.model_validate({"study_id": "s", "spec_hash": "h",
                                                                "phases": {"tune": TUNE}}))
    assert not [c for c in verdict_columns(only_tune) if "certified" in c or "drift" in c]


def test_the_validate_verdict_carries_the_transfer_regret():
    from analysis import transfer_regret
    from studies.sweeps.width import regret_widths

    assert regret_widths(SPEC) == [32, 128]  # validate.widths in transfer.widths, and the swept base width
    sweep = sweep_table(paper_like_optimum)
    regret = transfer_regret(sweep, {"lr": 2.0**-8.5}, [128], proxy_width=64)
    validate = phase_verdict(SPEC, "validate", {"lr_drift": lr_drift(sweep).model_dump(),
                                                "regret": [r.model_dump() for r in regret]})
    metrics = validate.metrics[0]
    assert round(metrics["regret.lr.mup.w128"], 6) == 0.0125 and round(metrics["regret.lr.standard.w128"], 6) == 0.05
    assert "regret_pct.lr.mup.w128" in metrics and "Transfer regret in lr at width 128: mup" in validate.sentence
    columns = verdict_columns(_demo_verdict())
    assert {"metrics.`regret_pct.lr.mup.w64`", "metrics.`regret_pct.lr.mup.w128`",
            "metrics.`regret_pct.lr.standard.w128`", "metrics.`best_lead_pct`"} <= set(columns)
    assert "metrics.`regret_pct.lr.standard.w64`" not in columns  # standard was carried from 64: no regret there
