"""End to end over HTTP: a real `ptctl serve`, a real MLflow server, the real embedded Ray head.

The tiny catalog study is submitted as YAML, the API process is SIGKILLed mid-study and started
again; the study must end `succeeded` with each trial logged to MLflow exactly once. Auth and the
CLI client are checked against the same server, and at the end every log is searched for tokens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from mlflow import MlflowClient

from service import ray_head
from service.cli import main as ptctl
from service.terminal import console
from studies import load_catalog
from studies.spec import StudySpec
from tests.service.conftest import ADMIN, READ, wait_for

pytestmark = pytest.mark.slow
# the tiny study with every tune trial trained in full (150 steps, ≈ 1 s a trial on a quiet core): long enough for
# the polls below to see a trial running and for the API's kill to land mid-study
TINY = StudySpec.model_validate({**(tiny := load_catalog("tiny").as_dict()), "train": {**tiny["train"], "steps": 150},
                                 "tune": {**tiny["tune"], "asha": {**tiny["tune"]["asha"], "enabled": False}}})
PLANNED = {"tune": TINY.tune.num_trials, "transfer": len(TINY.transfer.widths) * TINY.transfer.seeds,
           "verify": TINY.verify.n_samples + TINY.verify.centre_seeds}


def _finished_runs(mlflow_url: str, study_id: str) -> int:
    """Trial runs of the study that MLflow shows finished (the driver logs them, not the API)."""
    client = MlflowClient(tracking_uri=mlflow_url)
    experiment = client.get_experiment_by_name("tiny")
    query = f"tags.study_id = '{study_id}' and tags.kind = 'trial'"
    runs = client.search_runs([experiment.experiment_id], filter_string=query, max_results=1000) if experiment else []
    return sum(r.data.tags.get("status") in ("completed", "stopped", "diverged", "failed") for r in runs)


@pytest.fixture(scope="module")
def study(server, service_dir, mlflow_server):
    """Submit tiny, kill the API while tune runs, restart it, wait for the end; returns what was seen."""
    seen: dict = {"max_running": 0}
    with server.client() as api:
        headers = {"Content-Type": "application/yaml", "Idempotency-Key": "e2e-tiny"}
        first = api.post("/studies", content=TINY.to_yaml(), headers=headers)
        again = api.post("/studies", content=TINY.to_yaml(), headers=headers)
        assert (first.status_code, again.status_code) == (201, 200), (first.text, again.text)
        study_id = first.json()["id"]
        assert again.json()["id"] == study_id and first.headers["location"] == f"/studies/{study_id}"
        folder = service_dir / "studies" / study_id

        def a_tune_trial_done() -> bool:
            detail = api.get(f"/studies/{study_id}").json()
            seen["max_running"] = max(seen["max_running"], detail["progress"]["tune"]["running"])
            return detail["progress"]["tune"]["done"] >= 1

        wait_for(a_tune_trial_done, 240, "a finished tune trial")
    server.kill()
    seen["done_at_kill"] = _finished_runs(mlflow_server[0], study_id)
    seen["state_at_kill"] = json.loads((folder / "state.json").read_text())
    wait_for(lambda: _finished_runs(mlflow_server[0], study_id) > seen["done_at_kill"], 120,
             "a trial finishing while the API is down")
    server.start()
    with server.client() as api:
        seen["after_restart"] = api.get(f"/studies/{study_id}").json()
        final = wait_for(lambda: (d := api.get(f"/studies/{study_id}").json())["status"] != "running" and d, 300,
                         "the study to finish after the restart", interval=2)
    return study_id, final, seen


def test_mutating_endpoints_need_an_admin_token(server):
    for path in ("/studies", "/studies/any-id/cancel", "/studies/any-id/resume"):
        for token, code in ((None, 401), ("not-a-token", 401), (READ, 403)):
            with server.client(token) as api:
                response = api.post(path, content=b"{}", headers={"Content-Type": "application/json"})
            assert response.status_code == code, (path, token, response.text)
            assert (code != 401) or response.headers["www-authenticate"] == "Bearer"
    with server.client(ADMIN) as api:
        assert api.post("/studies/any-id/cancel").status_code == 404  # admin gets through to the lookup


def test_reads_need_a_token_and_health_does_not(server):
    with server.client(None) as anonymous:
        assert anonymous.get("/studies").status_code == 401
        assert anonymous.get("/healthz").status_code == 200
        ready = anonymous.get("/readyz").json()
        assert ready["ready"] and set(ready["checks"]) == {"store", "ray", "mlflow"}
    with server.client(READ) as reader:
        assert reader.get("/studies").status_code == 200


def test_study_succeeds_across_an_api_restart(study):
    study_id, final, seen = study
    assert final["status"] == "succeeded", final
    at_kill = seen["state_at_kill"]
    assert at_kill["status"] == "running" and "verify" not in at_kill["phases"], "the API was not killed mid-study"
    assert seen["after_restart"]["status"] == "running"  # reattached to the live driver, not interrupted
    assert final["attempts"] == 1  # the same driver ran the study from start to end
    assert seen["max_running"] >= 1
    assert {p: (v["status"], v["planned"], v["done"] + v["diverged"]) for p, v in final["progress"].items()} == {
        p: ("done", n, n) for p, n in PLANNED.items()}
    assert set(final["best_hparams"]) >= {"lr", "w_H"}


def test_trials_report_and_certificate(server, study):
    study_id, _, _ = study
    with server.client(READ) as api:
        trials = api.get(f"/studies/{study_id}/trials").json()["trials"]
        report = api.get(f"/studies/{study_id}/report").json()
    assert len(trials) == len({t["trial_id"] for t in trials}) == sum(PLANNED.values())
    assert all(t["mlflow_run_id"] for t in trials)
    assert study_id in report["markdown"] and "centre" in report["markdown"]
    assert {"n_samples", "n_better", "upper_bound", "verdict"} <= set(report["certificate"])


def test_the_finished_study_shows_its_verdicts(server, study):
    """GET /studies/{id} carries each finished phase's verdict, the same certificate the report has; GET /studies
    one line of them (tiny has no validate phase: its drifts are tests/service/test_verdicts.py's)."""
    study_id, final, _ = study
    with server.client(READ) as api:
        cert = api.get(f"/studies/{study_id}/report").json()["certificate"]
        [item] = [i for i in api.get("/studies").json()["items"] if i["id"] == study_id]
    verdicts = final["verdicts"]
    assert {k: verdicts["verify"][k] for k in ("certified", "bound", "n_better", "n_samples")} == {
        "certified": cert["certified"], "bound": cert["upper_bound"], "n_better": cert["n_better"],
        "n_samples": cert["n_samples"]}
    assert verdicts["tune"]["n_trials"] == PLANNED["tune"] and [p["width"] for p in verdicts["transfer"]["widths"]] \
        == TINY.transfer.widths
    assert verdicts["validate"] is None and verdicts["compare"] is None
    assert (item["verdict"]["certified"], item["verdict"]["bound"]) == (cert["certified"], cert["upper_bound"])
    assert item["verdict"]["line"].startswith(f"{'' if cert['certified'] else 'not '}certified (bound ")


def test_mlflow_server_has_every_trial_run_exactly_once(server, study, mlflow_server):
    study_id, final, _ = study
    client = MlflowClient(tracking_uri=mlflow_server[0])
    experiment = client.get_experiment_by_name("tiny")
    assert final["mlflow"]["experiment_id"] == experiment.experiment_id

    def runs(kind: str):
        query = f"tags.study_id = '{study_id}' and tags.kind = '{kind}'"
        return client.search_runs([experiment.experiment_id], filter_string=query, max_results=1000)

    trial_runs = runs("trial")
    keys = [r.data.tags["trial_key"] for r in trial_runs]
    with server.client(READ) as api:
        table = api.get(f"/studies/{study_id}/trials").json()["trials"]
    assert sorted(keys) == sorted(t["trial_id"] for t in table)  # none missing, none twice
    assert all(r.info.status == "FINISHED" for r in trial_runs)
    assert [r.info.run_id for r in runs("study")] == [final["mlflow"]["runs"]["study"]]
    assert {r.data.tags["phase"] for r in runs("phase")} == {"tune", "transfer", "verify"}


def test_cli_client_commands(server, study, monkeypatch, capsys):
    study_id, _, _ = study
    monkeypatch.setenv("PTCTL_TOKEN", READ)
    monkeypatch.setattr(console, "width", 200)  # a terminal's width, not a pipe's 80 columns that wrap the table
    assert ptctl(["study", "list", "--server", server.url, "--status", "succeeded"]) == 0
    out = capsys.readouterr().out
    assert study_id in out and "verdict" in out and "certified (bound " in out, out  # the compact verdict column
    assert ptctl(["study", "show", study_id, "--server", server.url]) == 0
    out = capsys.readouterr().out
    assert "succeeded" in out and "verdicts:" in out, out
    assert re.search(r"^  https?://\S+/#/experiments/\d+/runs/\w+", out, re.M), out  # the study run's link opens
    assert re.search(r"verify: (not )?certified \(bound [\d.]+ [≤>] p [\d.]+\), \d+ of \d+ samples better", out), out
    assert ptctl(["study", "trials", study_id, "--server", server.url]) == 0
    assert f"{sum(PLANNED.values())} trials" in capsys.readouterr().out
    assert ptctl(["study", "report", study_id, "--server", server.url]) == 0
    assert f"`{study_id}`" in capsys.readouterr().out
    assert ptctl(["study", "cancel", study_id, "--server", server.url]) == 2
    assert "403" in capsys.readouterr().out  # a read token may not cancel; one line, no traceback
    monkeypatch.setenv("PTCTL_TOKEN", ADMIN)
    assert ptctl(["study", "cancel", study_id, "--server", server.url]) == 2
    out = capsys.readouterr().out
    assert "409" in out and "succeeded" in out


def test_transfer_with_server_submits_the_derived_spec(server, study, service_dir, monkeypatch, capsys, tmp_path):
    """`ptctl transfer --server` posts the spec it derives and follows it (its phases are reused from the study
    above: the spec file is its spec, so no trial trains again)."""
    monkeypatch.setenv("PTCTL_TOKEN", ADMIN)
    (spec_file := tmp_path / "tiny.yaml").write_text(TINY.to_yaml())
    code = ptctl(["transfer", "--spec", str(spec_file), "--from-width", "16", "--to", "32", "--server", server.url])
    out = capsys.readouterr().out
    assert code == 0, out
    study_id = re.search(r"submitted study (\S+)", out).group(1)
    with server.client(READ) as api:
        detail = api.get(f"/studies/{study_id}").json()
    assert detail["status"] == "succeeded" and study_id != study[0]
    assert detail["spec"]["verify"] is None and detail["spec"]["transfer"]["widths"] == [32]
    phases = json.loads((service_dir / "studies" / study_id / "state.json").read_text())["phases"]
    assert {p: phases[p]["reused_from"] for p in ("tune", "transfer")} == {"tune": study[0], "transfer": study[0]}


def test_no_token_in_any_log_or_mlflow(server, study, service_dir, mlflow_server):
    study_id, _, _ = study
    with server.client(ADMIN) as api:  # a careless client puts the token in the URL: the log must hide it
        api.get("/studies", params={"token": ADMIN})
    api_log = server.log.read_text()
    assert "***" in api_log, "the redaction filter did not run"
    head = ray_head.running(service_dir)
    logs = {"api": api_log, "mlflow": Path(mlflow_server[1]).read_text()}
    logs |= {str(p): p.read_text(errors="replace") for p in Path(head.temp_dir).rglob("*")
             if p.is_file() and p.suffix in (".log", ".out", ".err")}
    client = MlflowClient(tracking_uri=mlflow_server[0])
    for run in client.search_runs([client.get_experiment_by_name("tiny").experiment_id],
                                  filter_string=f"tags.study_id = '{study_id}'", max_results=1000):
        logs[run.info.run_id] = json.dumps({**run.data.params, **run.data.tags})
    leaks = [name for name, text in logs.items() if ADMIN in text or READ in text]
    assert not leaks, f"a token appears in {leaks}"
    assert httpx.get(f"{server.url}/healthz").status_code == 200
