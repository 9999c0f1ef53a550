"""A study's verdicts wherever the API shows it: the phases' typed results (state.json) as `Verdicts`, one line of
them per study in `GET /studies`, all of them in `GET /studies/{id}` (the finished study over HTTP: test_e2e.py)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from analysis import certify, lr_drift, transfer_regret, width_trends
from service.app import create_app
from service.schemas import StudyDetail, StudyPage, Verdicts
from service.settings import Settings
from service.verdicts import brief, study_verdicts, verdict_lines
from studies import load_catalog
from studies.phases import StudyState
from tests.analysis._tables import paper_like_optimum, sweep_table, trials, verify_table
from tests.service.conftest import FakeExecutor
from workers.folder import StudyFolder, write_json

SPEC = {**(tiny := load_catalog("tiny").as_dict()), "validate": {"widths": [16, 32], "lrs": [1e-3, 1e-2, 1e-1]}}


def trends(losses: dict[int, float]) -> list[dict]:
    """`analysis.width_trends` of one transfer run per width, as state.json keeps them."""
    table = trials([{"width": w, "eval_loss": loss} for w, loss in losses.items()], phase="transfer")
    return [t.model_dump() for t in width_trends(table)]


def finished_state(study_id: str = "s") -> StudyState:
    """Every phase's result as the driver keeps it in state.json, judged by the real analysis from synthetic tables:
    a certified centre (0 of 62 samples better) and a flat mup lr optimum (standard's drifts an octave)."""
    sweep = sweep_table(paper_like_optimum)
    cert = certify(verify_table([5.0, 5.01], [5.2] * 62))
    record = {"study_id": study_id, "spec_hash": "h", "status": "succeeded", "phases": {
        "tune": {"status": "done", "best_hparams": {"lr": 2.0**-9}, "best_eval_loss": 5.8, "n_trials": 6,
                 "n_diverged": 1},
        "transfer": {"status": "done", "widths": [{"width": 64, "eval_loss_mean": 5.7},
                                                  {"width": 32, "eval_loss_mean": float("nan")}],
                     "trends": trends({32: 5.9, 64: 5.7, 128: 5.5})},
        "verify": {"status": "done", "certificate": cert.model_dump()},
        "validate": {"status": "done", "lr_drift": lr_drift(sweep).model_dump(),
                     "regret": [r.model_dump() for r in transfer_regret(sweep, {"lr": 2.0**-8.5}, [128],
                                                                         proxy_width=64)]}}}
    return StudyState.model_validate_json(json.dumps(record))  # as read back from the file (NaN included)


def test_the_phase_results_become_the_verdicts():
    state = finished_state()
    cert, drift = state.phases["verify"].certificate, state.phases["validate"].drift()
    verdicts = study_verdicts(state)
    verify, validate = verdicts.verify, verdicts.validate_
    assert verify is not None and validate is not None
    assert (verify.certified, verify.bound, verify.n_better, verify.n_samples) == (True, cert.upper_bound, 0, 62)
    assert verify.bound < verify.p == cert.p and verify.verdict == cert.verdict
    [lr] = validate.drifts
    assert (lr.hparam, lr.axis, lr.parametrization, lr.width, lr.passed) == ("lr", "width", "mup", None, True)
    assert lr.drift == drift.mup_drift and lr.ci95 == drift.drift_ci["mup"] and lr.ci95[0] <= lr.drift <= lr.ci95[1]
    assert (lr.baseline, round(lr.baseline_drift, 6)) == ("standard", -1.0) and validate.passed
    assert {(r.parametrization, r.width, round(r.regret, 6)) for r in validate.regret} == {
        ("mup", 128, 0.0125), ("standard", 128, 0.05)}
    assert verdicts.tune.n_diverged == 1 and verdicts.compare is None
    assert [(p.width, p.eval_loss) for p in verdicts.transfer.widths] == [(32, None), (64, 5.7)]  # NaN: no loss
    [trend] = verdicts.transfer.trends
    assert (trend.parametrization, trend.verdict, trend.warning) == ("mup", "wider is better", False)
    assert trend.slope == pytest.approx(-0.2) and trend.ci95[1] < 0
    assert study_verdicts(None) == Verdicts() and brief(Verdicts()) is None


def test_the_compare_verdict_ranks_every_budget():
    """compare's verdict from `analysis.compare_table`'s rows as state.json keeps them: per budget the winner and the
    transferred model's rank; a budget where no family finished has no winner."""
    row = {"role": "tuned", "eval_loss_mean": 5.0, "rank": 1}
    summary = [{**row, "family": "pt", "role": "transferred", "budget": 1e6, "eval_loss_mean": 4.9},
               {**row, "family": "bert", "budget": 1e6, "rank": 2},
               {**row, "family": "bert", "budget": 4e6, "eval_loss_mean": 4.5},
               {**row, "family": "pt", "role": "transferred", "budget": 4e6, "rank": 2},
               {**row, "family": "pt", "role": "transferred", "budget": 1.6e7, "eval_loss_mean": float("nan")}]
    state = StudyState.model_validate({"study_id": "s", "spec_hash": "h", "phases": {
        "compare": {"status": "done", "summary": summary, "budgets": [1e6, 4e6, 1.6e7]}}})
    compare = study_verdicts(state).compare
    assert [(b.budget, b.winner, b.eval_loss, b.transferred_rank) for b in compare.budgets] == [
        (1e6, "pt", 4.9, 1), (4e6, "bert", 4.5, 2), (1.6e7, None, None, None)]
    assert brief(study_verdicts(state)).line == "transferred model ranks 1,2,— over 3 budgets"
    assert verdict_lines(study_verdicts(state)) == [
        "compare: budget 1e+06: pt first (4.9000), transferred model rank 1; budget 4e+06: bert first (4.5000), "
        "transferred model rank 2; budget 1.6e+07: none finished"]


def test_the_verdicts_in_one_line_and_in_lines():
    verdicts = study_verdicts(finished_state())
    line = brief(verdicts)
    assert (line.certified, line.bound, line.drift_passed) == (True, verdicts.verify.bound, True)
    assert line.line == f"certified (bound {verdicts.verify.bound:.3g} ≤ p 0.05); drift passed (lr +0.00)"
    lines = verdict_lines(verdicts)
    assert [x.split(":")[0] for x in lines if not x.startswith(" ")] == ["tune", "transfer", "verify", "validate"]
    assert any(x.startswith("  lr along width: mup +0.00 [") and "(standard -1.00)" in x for x in lines)
    assert any(x.startswith("  regret of lr at width 128 (standard): 0.05 nats") for x in lines)
    only_tune = StudyState.model_validate({"study_id": "s", "spec_hash": "h", "phases": {
        "tune": finished_state().phases["tune"].model_dump(), "verify": {"status": "running"}}})
    assert brief(study_verdicts(only_tune)).line == "tuned (eval loss 5.8000)"


def test_wider_is_worse_leads_the_brief_and_is_indented_under_transfer():
    state = finished_state()
    state.phases["transfer"] = type(state.phases["transfer"]).model_validate(
        {"status": "done", "widths": [], "trends": trends({32: 5.01, 64: 5.16, 128: 5.33})})
    verdicts = study_verdicts(state)
    [trend] = verdicts.transfer.trends
    assert trend.warning and trend.line.startswith("wider is worse under mup: eval loss 5.010 → 5.160 → 5.330")
    assert brief(verdicts).line.startswith("wider is worse under mup; certified (bound ")
    lines = verdict_lines(verdicts)
    assert lines[lines.index("transfer: eval loss ") + 1] == f"  warning: {trend.line}"


def test_the_verdicts_are_documented_and_round_trip_by_their_json_names():
    verdicts = study_verdicts(finished_state())
    data = json.loads(verdicts.model_dump_json())
    assert set(data) == {"tune", "transfer", "verify", "validate", "compare"}  # `validate`, not `validate_`
    assert Verdicts.model_validate(data) == verdicts
    for model in (Verdicts, type(verdicts.verify), type(verdicts.validate_.drifts[0]), type(verdicts.transfer),
                  type(verdicts.transfer.trends[0])):
        undocumented = [n for n, f in model.model_fields.items() if not f.description]
        assert not undocumented, f"{model.__name__}: {undocumented} have no description for the OpenAPI document"


@pytest.fixture
def api(tmp_path, migrated):
    with TestClient(create_app(Settings(data_dir=migrated(tmp_path)), FakeExecutor())) as client:
        yield client, tmp_path


def test_get_study_and_the_list_carry_the_verdicts(api):
    client, data_dir = api
    study_id = client.post("/studies", json=SPEC).json()["id"]
    before = client.get(f"/studies/{study_id}").json()
    assert before["verdicts"] == dict.fromkeys(("tune", "transfer", "verify", "validate", "compare"))
    assert client.get("/studies").json()["items"][0]["verdict"] is None
    folder = StudyFolder(study_id, data_dir).create()  # the fake executor started no driver to make it
    write_json(folder.state_path, finished_state(study_id).model_dump(mode="json"))
    detail = StudyDetail.model_validate(answer := client.get(f"/studies/{study_id}").json())
    assert answer["verdicts"]["verify"]["certified"] is True and answer["verdicts"]["verify"]["bound"] < 0.05
    drift = answer["verdicts"]["validate"]["drifts"][0]
    assert drift["passed"] is True and len(drift["ci95"]) == 2 and isinstance(drift["drift"], float)
    assert detail.verdicts == study_verdicts(finished_state(study_id))  # the typed client reads them back
    page = StudyPage.model_validate(client.get("/studies").json())
    [item] = page.items
    assert item.verdict == brief(detail.verdicts) and item.verdict.line.startswith("certified (bound 0.0")
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["StudyDetail"]["properties"]["verdicts"]["description"] == "each finished phase's verdict"
    assert schemas["VerifyVerdict"]["properties"]["bound"]["description"].startswith("one-sided (1-alpha)")
    assert "validate" in schemas["Verdicts"]["properties"]


def test_the_lr_forecast_reaches_the_verdicts_and_their_lines(tmp_path):
    from studies.phases.validate import PHASE
    from tests.studies.test_forecast_phase import _ctx, _table
    from tests.studies.test_validate_phase import Folder

    result = PHASE.judge(_ctx(), _table(), Folder(tmp_path))
    f, held = result.forecast, result.forecast.held_out
    state = StudyState.model_validate_json(json.dumps({"study_id": "f", "spec_hash": "h", "phases": {
        "validate": {**result.model_dump(mode="json"), "status": "done"}}}))
    shown = study_verdicts(state).validate_.forecast
    assert (shown.width, shown.steps, shown.batch_size, shown.lr) == (128, 300, 16, pytest.approx(f.lr))
    assert shown.ci95 == pytest.approx((2.0 ** f.interval[0], 2.0 ** f.interval[1]))
    assert shown.held_out_error_log2 == pytest.approx(held.error_log2)
    assert shown.steplaw_held_out_error_log2 == pytest.approx(held.steplaw_error_log2)
    [line] = [x for x in verdict_lines(study_verdicts(state)) if "forecast" in x]
    assert line.strip().startswith(f"optimal lr forecast at width 128, 300 steps, batch 16: {f.lr:.3g} [")
    out = f.leave_out  # forecast_cpu's grid: 3 widths × 2 horizons, each predicted without its width
    assert shown.leave_out_points == len(out.points) == 6 and shown.ci95_scored == 6
    assert (shown.ci95_covered, shown.conformal_covered) == (out.t_covered, out.covered)
    assert shown.leave_out_median_error_log2 == pytest.approx(out.errors.median_log2)
    assert shown.steplaw_leave_out_median_error_log2 == pytest.approx(out.steplaw.median_log2)
    assert f"(covered {out.t_covered}/6 held-out points)" in line
    if f.conformal_interval is not None:
        assert shown.conformal_ci95 == pytest.approx(tuple(2.0**x for x in f.conformal_interval))
        assert shown.conformal_level == pytest.approx(out.level)
        assert f"conformal [{shown.conformal_ci95[0]:.3g}, {shown.conformal_ci95[1]:.3g}] (covered " in line
