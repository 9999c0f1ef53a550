"""A service several people share: a real `ptctl serve` on a fresh data directory with the embedded
SQLite MLflow store and its own embedded Ray head (not the session's server: these tests kill things).

In order: first studies submitted together on a fresh store all run; submit-then-cancel races and
cancel/resume storms always end as the last answered request says; no Ray process sees the API's
tokens; losing the Ray head interrupts a study and resume finishes it; a driver never told to run is
replaced and run by the next API; SIGTERM stops the API cleanly while its drivers keep running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from service import ray_head
from studies import load_catalog
from tests.conftest import DEFAULT_DATA
from tests.service.conftest import ADMIN, EVENT_S, READ, Server, ray_work, wait_for

pytestmark = pytest.mark.slow
TERMINAL = ("succeeded", "failed", "cancelled")
GCS_TIMEOUT_S = 15  # Ray's wait for a lost head before a connected process exits (default 60 s: idle time here)
STOP_S = 300  # the longest a cancelled study's drivers and trials may take to stop: 20 drivers starting at once on 2
# busy cores take minutes to be scheduled and killed (60 s failed there, on this tree and the one before)


def _spec(name: str, trials: int = 2, seed: int = 0, steps: int = 20) -> str:
    data = load_catalog("tiny").as_dict()
    data["name"] = name
    data["train"] |= {"steps": steps}
    data["tune"] |= {"num_trials": trials, "seed": seed, "asha": {"enabled": False}}
    data["verify"] = None
    return yaml.safe_dump(data)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`ptctl serve` on an empty data directory (only the corpus cache linked), MLflow on SQLite there."""
    data = tmp_path_factory.mktemp("ptctl-fresh")
    (DEFAULT_DATA / "corpora").mkdir(parents=True, exist_ok=True)
    (data / "corpora").symlink_to(DEFAULT_DATA / "corpora")
    env = {**os.environ, "PTCTL_DATA_DIR": str(data), "MLFLOW_TRACKING_URI": "", "RAY_ADDRESS": "",
           "PTCTL_API_TOKENS": f"admin:{ADMIN},read:{READ}", "PTCTL_RAY_NUM_CPUS": "2", "PTCTL_RECONCILE_S": "1",
           "PTCTL_TOKEN": "", "PTCTL_SERVER": "", "RAY_gcs_rpc_server_reconnect_timeout_s": str(GCS_TIMEOUT_S)}
    srv = Server(env, data / "api.log")
    srv.data = data
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()
        ray_head.stop(data)


@pytest.fixture
def fresh(served):
    """The module's server; started again first when a test before stopped it and failed before starting it again
    (its failure alone, not every test after it)."""
    if served.proc.poll() is not None:
        served.start()
    return served


def _submit(api, name: str, **kw) -> str:
    response = api.post("/studies", content=_spec(name, **kw), headers={"Content-Type": "application/yaml"})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _submitting(api, n: int, prefix: str, **kw) -> tuple[list[threading.Thread], list[str], list[str]]:
    """`n` submits at once, a started thread each: the threads, the ids answered 201 and the other answers (a
    failed submit fails the test, not only its thread)."""
    ids: list[str] = []
    failed: list[str] = []

    def one(i: int) -> None:
        try:
            ids.append(_submit(api, f"{prefix}-{i}", seed=i, **kw))
        except AssertionError as exc:
            failed.append(str(exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, ids, failed


def _status(api, study_id: str) -> dict:
    return api.get(f"/studies/{study_id}").json()


def _drivers(data: Path) -> list[int]:
    return [pid for pid, title in ray_work(data).items() if title.startswith("ray::StudyDriverActor")]


def test_first_studies_submitted_together_all_run(fresh):
    """Four studies at once on a fresh data directory: none fails creating the MLflow store."""
    assert (fresh.data / "mlflow.db").exists(), "the API did not create the MLflow store at start-up"
    with fresh.client() as api:
        # one tune trial each: what can fail here is the drivers' first use of the store, not the trials
        threads, ids, failed = _submitting(api, 4, "first", trials=1)
        for t in threads:
            t.join()
        assert not failed, failed
        finals = [wait_for(lambda s=s: (d := _status(api, s))["status"] in TERMINAL and d, 420,
                           f"study {s} to finish", interval=2) for s in ids]
    assert [f["status"] for f in finals] == ["succeeded"] * 4, [(f["id"], f["error"]) for f in finals]
    assert not (Path.cwd() / "mlruns").exists()
    assert list((fresh.data / "mlartifacts").rglob("report.md")), "artifacts are not under the data directory"


def test_a_cancel_answered_200_always_ends_cancelled(fresh):
    """20 submits at once while a second client cancels every study it sees `pending` (their submits still in
    flight), then every other one. Each ends cancelled, with no driver and no trial left running."""
    with fresh.client() as api, fresh.client() as other:
        submits, ids, failed = _submitting(api, 20, "race")
        answered = {}
        while any(t.is_alive() for t in submits):
            for study in other.get("/studies", params={"status": "pending", "limit": 100}).json()["items"]:
                answered.setdefault(study["id"], other.post(f"/studies/{study['id']}/cancel"))
        for t in submits:
            t.join()
        assert not failed, failed  # a submit whose study a cancel stopped answers 201 with the cancelled study
        for study_id in ids:
            answered.setdefault(study_id, other.post(f"/studies/{study_id}/cancel"))
        assert all(r.status_code == 200 for r in answered.values()), {s: r.text for s, r in answered.items()}
        wait_for(lambda: not ray_work(fresh.data), STOP_S, "every driver and trial to stop")
        time.sleep(5)  # a driver that was still starting would have begun training by now
        late = ray_work(fresh.data)  # drivers whose actor creation a cancel's kill overtook start, and are ended
        assert all(title == "ray::StudyDriverActor" for title in late.values()), late  # none trains
        wait_for(lambda: not ray_work(fresh.data), STOP_S, "the drivers a cancel overtook in creation to end",
                 seen=lambda: ray_work(fresh.data))
        print(f"{len(late)} driver processes came up after the cancels and ended")
        final = {s: _status(api, s) for s in ids}
    assert {d["status"] for d in final.values()} == {"cancelled"}, {s: d["status"] for s, d in final.items()}
    before_start = sum(d["attempts"] == 0 for d in final.values())  # cancelled before the submit's move to running
    print(f"{before_start} of 20 cancels landed before their submit started the driver")


def test_cancel_resume_storm_ends_as_the_last_answer_says(fresh):
    with fresh.client() as api:
        study_id = _submit(api, "storm", trials=4, steps=40)
        answers: list[tuple[float, str, int]] = []
        lock = threading.Lock()

        def hit(verb: str) -> None:
            for _ in range(6):
                code = api.post(f"/studies/{study_id}/{verb}").status_code
                with lock:
                    answers.append((time.monotonic(), verb, code))

        threads = [threading.Thread(target=hit, args=(v,)) for v in ("cancel", "resume", "cancel", "resume")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(code in (200, 409, 503) for _, _, code in answers), answers
        if _status(api, study_id)["status"] != "cancelled":
            assert api.post(f"/studies/{study_id}/cancel").status_code == 200
        wait_for(lambda: not ray_work(fresh.data), STOP_S, "the storm's drivers and trials to stop",
                 seen=lambda: ray_work(fresh.data))
        time.sleep(3)
        assert not ray_work(fresh.data) and _status(api, study_id)["status"] == "cancelled"
        resumed = api.post(f"/studies/{study_id}/resume")
        assert resumed.status_code == 200 and resumed.json()["status"] == "running"
        final = wait_for(lambda: (d := _status(api, study_id))["status"] in TERMINAL and d, 300,
                         "the resumed study to finish", interval=2)
    assert final["status"] == "succeeded", final["error"]
    assert len([p for p in (fresh.data / "studies").iterdir() if p.name == study_id]) == 1


def test_api_tokens_never_reach_a_ray_process(fresh):
    with fresh.client() as api:
        study_id = _submit(api, "secrets", trials=2, steps=400)
        wait_for(lambda: len(ray_work(fresh.data)) >= 2, 120, "a driver and a trial to run")
        leaks = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ, cmdline = (entry / "environ").read_bytes(), (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"service.cli\x00serve" in cmdline:  # an API process (this one or the session's) holds them
                continue
            if ADMIN.encode() in environ or READ.encode() in environ:
                leaks.append((entry.name, cmdline[:80]))
        assert api.post(f"/studies/{study_id}/cancel").status_code == 200  # scanned: its 400 steps need not run
        wait_for(lambda: not ray_work(fresh.data), STOP_S, "the study's driver and trials to stop")
    assert not leaks, f"processes with the API tokens in their environment: {leaks}"


def test_losing_the_ray_head_interrupts_and_resume_finishes(fresh):
    with fresh.client() as api:
        # 100 steps: after the first of 4 trials (2 at a time) the tune phase has at least a trial's time left
        study_id = _submit(api, "headless", trials=4, steps=100)
        wait_for(lambda: _status(api, study_id)["progress"]["tune"]["done"] >= 1, 240, "a finished tune trial")
        head = ray_head.running(fresh.data)
        os.killpg(head.pgid, signal.SIGKILL)  # the whole head: GCS, raylet, the driver and its trials
        killed = time.monotonic()
        lost = wait_for(lambda: (d := _status(api, study_id))["status"] == "interrupted" and d, EVENT_S,
                        "the study to be marked interrupted",
                        seen=lambda: {k: _status(api, study_id)[k] for k in ("status", "phase", "progress")})
        assert "Ray head stopped" in lost["error"] and "resume" in lost["error"]
        assert fresh.proc.poll() is None, "the API died with the Ray head"
        # past Ray's GCS timeout, which ends a client still connected to a dead head (measured: it exits at the timeout)
        time.sleep(max(0.0, killed + GCS_TIMEOUT_S + 10 - time.monotonic()))
        assert fresh.proc.poll() is None, "the API died after losing the Ray head"
        resumed = wait_for(lambda: (r := api.post(f"/studies/{study_id}/resume")).status_code != 503 and r, 120,
                           "the lost connection to be dropped", interval=2)
        assert resumed.status_code == 200, resumed.text
        final = wait_for(lambda: (d := _status(api, study_id))["status"] in TERMINAL and d, 300,
                         "the resumed study to finish", interval=2)
    assert final["status"] == "succeeded", final["error"]
    assert final["attempts"] == 2


# The API's half of a submit, cut between its two Ray steps: the driver actor exists and the study is
# `running`, but the API died before telling the driver to run (an idle driver, alive but never started).
_HALF_SUBMIT = """
import sys
from service.execution import RayExecutor
from service.settings import Settings
from service.store import Store
from studies.spec import StudySpec
import yaml
settings = Settings()
store = Store(settings.db_url)
spec = StudySpec.model_validate(yaml.safe_load(sys.stdin.read()))
study, _ = store.create("half-submitted", spec.as_dict(), spec.content_hash())
RayExecutor(settings).start(study.id)
store.transition(study.id, "running", expect=["pending"])
"""


def test_a_driver_never_told_to_run_is_started_at_start_up(fresh):
    """The next API replaces the idle driver with one that runs (attempt 2); the study finishes without a resume
    (before: start-up left it `interrupted`, "the API stopped before its driver began")."""
    fresh.proc.send_signal(signal.SIGTERM)
    fresh.proc.wait(30)
    subprocess.run([sys.executable, "-c", _HALF_SUBMIT], input=_spec("half", trials=2), text=True,
                   env=fresh.env, check=True, timeout=120)
    # the submit returns once Ray has the named actor, before its process has started
    idle = wait_for(lambda: _drivers(fresh.data), EVENT_S, "the half submit's idle driver")
    fresh.start()
    with fresh.client() as api:
        started = _status(api, "half-submitted")  # start-up started it before the API answered
        assert started["status"] in ("running", "succeeded") and started["attempts"] == 2, started
        assert not set(idle) & set(_drivers(fresh.data)), "the idle driver was not replaced"
        final = wait_for(lambda: (d := _status(api, "half-submitted"))["status"] not in ("running",) and d, 300,
                         "the started study to end", interval=2)
    assert final["status"] == "succeeded" and final["attempts"] == 2, final["error"]


def test_sigterm_stops_the_api_cleanly_and_drivers_keep_running(fresh):
    """SIGTERM right after a submit's answer: the driver has its order (a submit answers only once its driver
    has started), so the study finishes while the API is down or after it restarts."""
    with fresh.client() as api:
        study_id = _submit(api, "outlives", trials=4, steps=120)
    start = fresh.log.stat().st_size
    fresh.proc.send_signal(signal.SIGTERM)
    assert fresh.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its graceful stop
    log = fresh.log.read_text()[start:]
    assert "Finished server process" in log and "Traceback" not in log and "SIGTERM received" not in log, log[-3000:]
    assert _drivers(fresh.data), "the driver died with the API"
    fresh.start()
    with fresh.client() as api:
        final = wait_for(lambda: (d := _status(api, study_id))["status"] != "running" and d, 600,
                         "the study to finish after the restart", interval=2)
    assert final["status"] == "succeeded", final["error"]
