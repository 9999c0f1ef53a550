"""The wall-time estimate where users read it: `ptctl study plan` / `ptctl transfer --dry-run` (a probe of each
trial shape, or none with `--no-probe`), `POST /plans` (the plan, nothing stored or started), and the progress
bars' time left. No assertion reads a wall clock: only that the figures are there, positive and consistent."""

from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.cli import main
from service.settings import Settings
from service.terminal import progress_bar
from studies import load_catalog
from tests.service.conftest import FakeExecutor

CATALOG = "studies/catalog"
ESTIMATE = re.compile(r"^estimate: (.+) · total ≈ (.+) \(±25 %\)$", re.M)


def _phases(line: str) -> dict[str, str]:
    return dict(part.split(" ", 1) for part in line.split(" · "))


@pytest.mark.slow  # ≈ 9 s: a companion process (torch's import) trains beside each shape, as tiny's 2 lanes will
def test_study_plan_prints_an_estimate_per_phase_and_its_assumptions(capsys):
    assert main(["study", "plan", f"{CATALOG}/tiny.yaml"]) == 0
    out = capsys.readouterr().out
    found = ESTIMATE.search(out)
    assert found, out
    phases = _phases(found.group(1))
    assert list(phases) == ["tune", "transfer", "verify"], out  # tiny's phases, in order
    assert all(re.fullmatch(r"(\d+ min )?\d+ s|\d+ min", text) for text in phases.values()), phases
    assumes = next(line for line in out.splitlines() if line.startswith("assumes: "))
    for words in ("probe: 5 steps per shape", "up to 2 at a time", "w16 ", "w32 ", "trials at a time", "ASHA's stops",
                  "Ray's costs"):
        assert words in assumes, assumes


def test_no_probe_prints_flops_only(capsys):
    assert main(["study", "plan", "--no-probe", f"{CATALOG}/tiny.yaml"]) == 0
    out = capsys.readouterr().out
    assert "proxy cost = " in out and "estimate:" not in out and "assumes:" not in out


def test_transfer_dry_run_estimates_the_transfer_it_would_run(capsys):
    """One tune trial and one transfer trial: each alone, so no companion process starts (fast)."""
    args = ["transfer", "--spec", f"{CATALOG}/tiny.yaml", "--from-width", "16", "--to", "32", "--trials", "1",
            "--dry-run"]
    assert main(args) == 0
    found = ESTIMATE.search(capsys.readouterr().out)
    assert found and list(_phases(found.group(1))) == ["tune", "transfer"]


def test_a_compare_study_says_it_is_not_estimated(capsys):
    assert main(["study", "plan", f"{CATALOG}/compare_cpu.yaml"]) == 0
    assert "estimate: not made for a compare study" in capsys.readouterr().out


@pytest.fixture(scope="module")
def api(tmp_path_factory, migrated):
    executor = FakeExecutor()
    data = migrated(tmp_path_factory.mktemp("plan-data"))
    app = create_app(Settings(data_dir=data, ray_num_cpus=1), executor)  # one lane: no companion process, fast
    with TestClient(app, raise_server_exceptions=False) as client:
        client.executor = executor
        yield client


def test_post_plans_answers_the_estimate_and_stores_nothing(api):
    body = json.dumps(load_catalog("tiny").as_dict())
    answer = api.post("/plans", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    plan = answer.json()
    assert plan["name"] == "tiny" and list(plan["phases"]) == ["tune", "transfer", "verify"]
    for phase in plan["phases"].values():
        assert phase["seconds"] > 0 and phase["lanes"] >= 1 and phase["trials"] >= 1 and phase["flops"] > 0
    assert plan["total_s"] > sum(p["seconds"] for p in plan["phases"].values())  # and the study's start
    assert plan["uncertainty"] == 0.25 and plan["line"].startswith("estimate: tune ")
    assert "probe:" in plan["assumptions"]
    assert plan["proxy_pct"] == {"32": pytest.approx(116.3, abs=0.05)}
    assert api.get("/studies").json()["total"] == 0 and api.executor.launched == []


def test_post_plans_without_the_probe_and_of_a_compare_study(api):
    yaml_body = load_catalog("tiny").to_yaml()
    answer = api.post("/plans", params={"probe": "false"}, content=yaml_body,
                      headers={"Content-Type": "application/yaml"})
    assert answer.status_code == 200, answer.text
    plan = answer.json()
    assert plan["total_s"] is None and plan["line"] == ""
    assert all(p["seconds"] is None and p["lanes"] is None for p in plan["phases"].values())
    assert plan["phases"]["verify"]["trials"] == 8
    compare = api.post("/plans", content=json.dumps(load_catalog("compare_cpu").as_dict()),
                       headers={"Content-Type": "application/json"})
    assert compare.status_code == 422 and "compare study" in compare.json()["detail"][0]["msg"]
    assert api.get("/studies").json()["total"] == 0


def test_the_progress_bar_shows_the_time_left_from_the_trials_done(tmp_path):
    from rich.console import Console

    clock = [0.0]
    bar = progress_bar(Console(file=(tmp_path / "out").open("w"), width=200))
    bar.get_time = lambda: clock[0]  # the tasks read this clock
    task = bar.add_task("verify", total=10, note="")
    left = bar.columns[4]
    assert left.render(bar.tasks[0]).plain == "left -:--:--"  # nothing done yet: no rate
    clock[0] = 60.0
    bar.update(task, advance=4)
    assert left.render(bar.tasks[0]).plain == "left 0:01:30"  # 60 s for 4 trials, 6 to go
    bar.update(task, completed=10)
    assert left.render(bar.tasks[0]).plain == "left 0:00:00"
