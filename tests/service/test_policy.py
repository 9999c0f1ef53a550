"""What a remote spec may name (service/policy.py): data only under the data roots, no hub download, no
tracking URI but the service's own; and errors over the API carry no bytes a remote server sent.

In-process: the API with a fake executor (nothing trains), a data directory with a corpus, links out of it
and a directory outside. One test puts a real HTTP listener on 127.0.0.1 behind a spec's tracking_uri; one
runs the driver actor's method (not on Ray) against a real listener that answers with a secret body.
"""

from __future__ import annotations

import copy
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
import requests
from fastapi.testclient import TestClient

from service.app import create_app
from service.policy import normalise_uri, public_error
from service.settings import Settings
from studies import load_catalog
from tests.service.conftest import FakeExecutor

TINY = load_catalog("tiny").as_dict()
TINY_TAU = load_catalog("tiny_tau").as_dict()
SECRET = "S3CRET-BODY-of-the-remote-server"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict[str, Path]:
    """data/ (the data dir: a corpus, a JSONL folder, a Laplacian, a link out, a folder with a linked file,
    the Ray head's token) and outside/ (a secret, a JSONL file)."""
    base = tmp_path_factory.mktemp("policy")
    data, outside = base / "data", base / "outside"
    for d in (data / "corpus" / "sub", data / "docs", data / "linked", data / "ray", outside):
        d.mkdir(parents=True)
    (data / "corpus" / "a.txt").write_text("some text\n\nmore text\n")
    (data / "corpus" / "sub" / "b.txt").write_text("nested text\n")
    (data / "docs" / "d.jsonl").write_text('{"text": "a document"}\n')
    (data / "ray" / "auth_token").write_text("ray-token")
    (outside / "secret.txt").write_text("root:x:0:0\n")
    (outside / "x.jsonl").write_text('{"text": "outside"}\n')
    (data / "escape").symlink_to(outside, target_is_directory=True)
    (data / "linked" / "ok.txt").write_text("fine\n")
    (data / "linked" / "evil.txt").symlink_to(outside / "secret.txt")
    lap = np.diag([1.0, *[2.0] * 6, 1.0]) - np.eye(8, k=1) - np.eye(8, k=-1)
    np.save(data / "lap.npy", lap)
    np.save(outside / "lap.npy", lap)
    return {"base": base, "data": data, "outside": outside}


def _api(settings: Settings) -> TestClient:
    return TestClient(create_app(settings, FakeExecutor()), raise_server_exceptions=False)


@pytest.fixture(scope="module")
def api(tree):
    with _api(Settings(data_dir=tree["data"])) as client:
        yield client


def _data_spec(source: str, path: str) -> dict:
    spec = copy.deepcopy(TINY)
    spec["data"] = {**spec["data"], "source": source, "path": path}
    return spec


def _tau_spec(path: str) -> dict:
    spec = copy.deepcopy(TINY_TAU)
    spec["model"]["arch"] = {**spec["model"]["arch"], "laplacian": "file", "laplacian_path": path}
    return spec


def _tracking_spec(uri: str) -> dict:
    spec = copy.deepcopy(TINY)
    spec["resources"]["tracking"]["tracking_uri"] = uri
    return spec


def _submit(api, spec: dict):
    return api.post("/studies", content=json.dumps(spec), headers={"Content-Type": "application/json"})


def _refused(response, loc: list, *words: str) -> str:
    assert response.status_code == 422, response.text
    errors = [e for e in response.json()["detail"] if e["loc"] == loc]
    assert errors, response.json()
    msg = errors[0]["msg"]
    assert all(w in msg for w in words), msg
    return msg


DATA = ["body", "data", "path"]


# ---------------------------------------------------------------------------------- data paths
@pytest.mark.parametrize(("source", "path"), [
    ("text", "/etc/passwd"), ("text", "/etc"), ("text", "/etc/**"), ("jsonl", "/etc/**/*.jsonl"),
    ("text", "/*"), ("hf", "/etc/hosts"), ("hf", "/etc"),
])
def test_observed_paths_outside_the_roots_are_refused(api, source, path):
    """Observation 4: data.path made workers read /etc/passwd, walk /etc and glob /etc/**."""
    _refused(_submit(api, _data_spec(source, path)), DATA, "PTCTL_DATA_ROOTS")


def test_a_refused_study_is_neither_stored_nor_started(tree):
    with _api(Settings(data_dir=tree["base"] / "fresh")) as client:
        _refused(_submit(client, _data_spec("text", "/etc/passwd")), DATA, "PTCTL_DATA_ROOTS")
        assert client.get("/studies").json()["total"] == 0 and client.app.state.control.executor.launched == []


@pytest.mark.parametrize("rel", ["corpus/a.txt", "corpus/*.txt", "./corpus", "sub/../corpus/a.txt"])
def test_relative_paths_are_refused(api, rel):
    """Relative to what? The Ray worker's working directory, which the service does not choose: refused."""
    _refused(_submit(api, _data_spec("text", rel)), DATA, "relative", "absolute path")


@pytest.mark.parametrize("tail", ["corpus/../../outside/secret.txt", "corpus/../corpus/a.txt", "corpus/*/../../../**"])
def test_dotdot_is_refused_even_when_it_stays_inside(api, tree, tail):
    _refused(_submit(api, _data_spec("text", f"{tree['data']}/{tail}")), DATA, "'..'")


@pytest.mark.parametrize(("source", "tail"), [
    ("text", "escape/secret.txt"),  # a file below a linked directory
    ("text", "escape"),  # the linked directory itself
    ("jsonl", "escape/*.jsonl"),  # a glob whose fixed part is the link
    ("text", "linked/*.txt"),  # a glob matching a linked file
    ("text", "linked"),  # a directory holding a linked file
    ("text", "linked/evil.txt"),  # the linked file itself
    ("text", "**/*.txt"),  # `**` follows the linked directory out of the root
    ("hf", "escape/x.jsonl"),  # hf's local file
    ("hf", "linked"),  # hf's local dataset folder
])
def test_symlinks_out_of_a_root_are_refused(api, tree, source, tail):
    value = f"{tree['data']}/{tail}"
    msg = _refused(_submit(api, _data_spec(source, value)), DATA, "symlink", "PTCTL_DATA_ROOTS")
    rest = msg.replace(repr(value), "")  # but for the client's own words, nothing about what lies outside
    assert "secret" not in rest and str(tree["outside"]) not in rest


@pytest.mark.parametrize("tail", ["ray/auth_token", "ray", "ptctl.db"])
def test_the_services_own_files_are_refused(api, tree, tail):
    _refused(_submit(api, _data_spec("text", f"{tree['data']}/{tail}")), DATA, "service's own files")


@pytest.mark.parametrize(("source", "tail"), [
    ("text", "corpus/a.txt"), ("text", "corpus"), ("text", "corpus/*.txt"), ("text", "corpus/**/*.txt"),
    ("jsonl", "docs"), ("jsonl", "docs/*.jsonl"), ("hf", "docs/d.jsonl"), ("hf", "docs"),
])
def test_paths_inside_a_root_are_accepted(api, tree, source, tail):
    response = _submit(api, _data_spec(source, f"{tree['data']}/{tail}"))
    assert response.status_code == 201, response.text


def test_home_relative_paths_resolve_like_the_workers(api, tree, monkeypatch):
    monkeypatch.setenv("HOME", str(tree["base"]))  # the workers expanduser the same way
    assert _submit(api, _data_spec("text", "~/data/corpus/a.txt")).status_code == 201
    _refused(_submit(api, _data_spec("text", "~/outside/secret.txt")), DATA, "PTCTL_DATA_ROOTS")


def test_a_path_inside_a_root_that_matches_nothing_says_so(api, tree):
    _refused(_submit(api, _data_spec("text", f"{tree['data']}/corpus/*.md")), DATA, "no .txt files")


def test_odd_strings_are_refused_not_a_500(api, tree):
    _refused(_submit(api, _data_spec("text", f"{tree['data']}/corpus/a\x00.txt")), DATA, "PTCTL_DATA_ROOTS")


def test_data_roots_widen_and_replace_the_default(tree, monkeypatch):
    monkeypatch.setenv("PTCTL_DATA_ROOTS", f"{tree['outside']}{os.pathsep}{tree['base'] / 'none'}")
    settings = Settings(data_dir=tree["data"])
    assert settings.data_roots == [tree["outside"], tree["base"] / "none"]
    with _api(settings) as client:
        assert _submit(client, _data_spec("text", f"{tree['outside']}/secret.txt")).status_code == 201
        assert _submit(client, _data_spec("jsonl", f"{tree['outside']}/*.jsonl")).status_code == 201
        _refused(_submit(client, _data_spec("text", f"{tree['data']}/corpus/a.txt")), DATA, "PTCTL_DATA_ROOTS")
    both = Settings(data_dir=tree["data"], data_roots=f"{tree['data']},{tree['outside']}")
    with _api(both) as client:  # the link's target is a root now: the link is fine
        assert _submit(client, _data_spec("text", f"{tree['data']}/escape/secret.txt")).status_code == 201


# ---------------------------------------------------------------------------------- hub datasets
def test_hub_datasets_need_the_operators_consent(tree, api):
    _refused(_submit(api, _data_spec("hf", "JeanKaddour/minipile")), DATA, "PTCTL_ALLOW_HF_HUB=true")
    _refused(_submit(api, _data_spec("hf", "some/file.jsonl")), DATA, "hub dataset name")
    with _api(Settings(data_dir=tree["data"], allow_hf_hub=True)) as client:
        assert _submit(client, _data_spec("hf", "JeanKaddour/minipile")).status_code == 201
        _refused(_submit(client, _data_spec("hf", "/etc/hosts")), DATA, "PTCTL_DATA_ROOTS")


# ---------------------------------------------------------------------------------- TauGPT's Laplacian
def test_laplacian_files_follow_the_roots(api, tree):
    loc = ["body", "model", "arch", "laplacian_path"]
    _refused(_submit(api, _tau_spec("/etc/passwd")), loc, "PTCTL_DATA_ROOTS")
    _refused(_submit(api, _tau_spec(f"{tree['data']}/escape/lap.npy")), loc, "symlink")
    _refused(_submit(api, _tau_spec(f"{tree['data']}/none.npy")), loc, "no such file")
    assert _submit(api, _tau_spec(f"{tree['data']}/lap.npy")).status_code == 201


# ---------------------------------------------------------------------------------- tracking URIs
TRACKING = ["body", "resources", "tracking", "tracking_uri"]


def test_a_tracking_uri_of_the_clients_choice_is_refused(api, tree):
    """Observation 4: sqlite:////any/path made a database anywhere; http://host/... made the driver call it."""
    target = tree["base"] / "anywhere" / "x.db"
    _refused(_submit(api, _tracking_spec(f"sqlite:///{target}")), TRACKING, "PTCTL_TRACKING_URIS")
    _refused(_submit(api, _tracking_spec("http://169.254.169.254/latest")), TRACKING, "PTCTL_TRACKING_URIS")
    _refused(_submit(api, _tracking_spec("file:///tmp/mlruns")), TRACKING, "PTCTL_TRACKING_URIS")
    assert not target.parent.exists()


def test_the_services_own_tracking_uri_in_any_spelling_is_accepted(api, tree):
    own = api.app.state.settings.tracking_uri
    assert own == f"sqlite:///{tree['data'] / 'mlflow.db'}"
    for uri in (own, f"SQLite:///{tree['data']}//mlflow.db", f"sqlite:///{tree['data']}/./mlflow.db", ""):
        assert _submit(api, _tracking_spec(uri)).status_code == 201, uri


def test_tracking_uris_widen_the_allow_list(tree, monkeypatch):
    monkeypatch.setenv("PTCTL_TRACKING_URIS", "http://mlflow.internal:5000/,https://mlflow.example.org/team")
    with _api(Settings(data_dir=tree["data"])) as client:
        for uri in ("http://MLflow.internal:5000", "HTTP://mlflow.internal:5000/", "https://mlflow.example.org:443/team/"):
            assert _submit(client, _tracking_spec(uri)).status_code == 201, uri
        _refused(_submit(client, _tracking_spec("http://mlflow.internal:5001")), TRACKING, "PTCTL_TRACKING_URIS")
    with _api(Settings(data_dir=tree["data"], tracking_uris="*")) as client:
        assert _submit(client, _tracking_spec("http://anything.example:1/")).status_code == 201


def _storage_spec(where: str) -> dict:
    spec = _tracking_spec("")
    spec["resources"]["storage"] = where
    return spec


def test_only_the_services_own_storage_may_be_named(tree):
    """A remote spec cannot make the workers write checkpoints where the client chooses."""
    loc = ["body", "resources", "storage"]
    with _api(Settings(data_dir=tree["data"])) as client:
        _refused(_submit(client, _storage_spec("s3://someone-elses-bucket/x")), loc, "PTCTL_STORAGE")
        _refused(_submit(client, _storage_spec("/etc")), loc, "PTCTL_STORAGE")
    with _api(Settings(data_dir=tree["data"], storage="s3://lab/ptctl")) as client:
        assert _submit(client, _storage_spec("s3://lab/ptctl")).status_code == 201
        _refused(_submit(client, _storage_spec("s3://lab/other")), loc, "PTCTL_STORAGE")


@pytest.mark.parametrize(("a", "b"), [
    ("HTTP://Host:80/a/", "http://host/a"), ("https://h:443", "https://h/"), ("sqlite:////x//y.db", "sqlite:////x/y.db"),
    ("http://[::1]:5000/", "http://[::1]:5000"),
])
def test_normalised_uris_compare_equal(a, b):
    assert normalise_uri(a) == normalise_uri(b)


@pytest.mark.parametrize(("a", "b"), [
    ("http://h:5000", "http://h:5001"), ("http://h/a", "http://h/b"), ("http://h", "https://h"),
    ("sqlite:////x/y.db", "sqlite:////x/z.db"), ("http://u:p@h", "http://h"), ("http://h:99999", "http://h"),
])
def test_different_uris_stay_different(a, b):
    assert normalise_uri(a) != normalise_uri(b)


class _Listener:
    """A real HTTP server on 127.0.0.1 in a thread: counts requests, answers `status` with a secret body."""

    def __init__(self, status: int = 200, body: str = SECRET) -> None:
        listener = self
        self.requests: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                listener.requests.append(f"{self.command} {self.path}")
                payload = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Listener:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_listener_named_as_tracking_uri_gets_no_request(api):
    with _Listener() as listener:
        assert httpx.get(listener.url).text == SECRET and listener.requests == ["GET /"]  # it answers
        response = _submit(api, _tracking_spec(f"{listener.url}/api"))
        _refused(response, TRACKING, "PTCTL_TRACKING_URIS")
        assert api.get("/studies").status_code == 200 and api.get("/readyz").status_code in (200, 503)
        assert listener.requests == ["GET /"]  # nothing from the service


# ---------------------------------------------------------------------------------- resume
def test_resume_applies_the_policy_of_now(tree):
    wide = Settings(data_dir=tree["base"] / "resume", data_roots=[tree["outside"]])
    with _api(wide) as client:
        study = _submit(client, _data_spec("text", f"{tree['outside']}/secret.txt")).json()
        assert client.post(f"/studies/{study['id']}/cancel").status_code == 200
    with _api(Settings(data_dir=tree["base"] / "resume")) as client:  # the operator narrowed the roots
        _refused(client.post(f"/studies/{study['id']}/resume"), ["spec", "data", "path"], "PTCTL_DATA_ROOTS")
        assert client.get(f"/studies/{study['id']}").json()["status"] == "cancelled"
        assert client.app.state.control.executor.launched == []


# ---------------------------------------------------------------------------------- errors over the API
def _mlflow_errors():
    from mlflow.exceptions import MlflowException, RestException

    return [RestException({"error_code": "INTERNAL_ERROR", "message": SECRET}),
            RestException({"error_code": SECRET, "message": "x"}),
            MlflowException(f"API request to endpoint /api/2.0/mlflow/runs/get failed with error code 403 != 200. "
                            f"Response body: '{SECRET}'")]


def _http_errors():
    response = requests.models.Response()
    response.status_code, response._content = 502, SECRET.encode()
    request = httpx.Request("GET", "http://h/x")
    return [requests.HTTPError(f"502 Server Error: {SECRET} for url: http://h/x", response=response),
            httpx.HTTPStatusError(f"Server error '502 {SECRET}'", request=request,
                                  response=httpx.Response(502, text=SECRET, request=request)),
            httpx.ConnectError(f"refused {SECRET}")]


@pytest.mark.parametrize("exc", [*_mlflow_errors(), *_http_errors()], ids=lambda e: type(e).__name__)
def test_public_error_withholds_what_a_server_sent(exc):
    text = public_error(exc)
    assert SECRET not in text and text.startswith(f"{type(exc).__name__}: ") and "driver's log" in text


def test_public_error_keeps_the_status_and_mlflows_code():
    rest, _, _ = _mlflow_errors()
    assert "INTERNAL_ERROR" in public_error(rest)
    assert "HTTP 502" in public_error(_http_errors()[0]) and "HTTP 502" in public_error(_http_errors()[1])


def test_public_error_cuts_a_wrapped_servers_text_from_our_message():
    inner = _mlflow_errors()[0]
    try:
        try:
            raise inner
        except Exception as err:
            raise RuntimeError(f"MLflow unreachable after 3 tries: {err}") from err
    except RuntimeError as outer:
        text = public_error(outer)
    assert text.startswith("RuntimeError: MLflow unreachable after 3 tries: ") and SECRET not in text
    truncated = RuntimeError(f"logging failed ({str(inner)[:40]})")
    truncated.__cause__ = inner
    assert SECRET[:16] not in public_error(truncated)


def test_public_error_sees_through_a_ray_task_error():
    from ray.exceptions import RayTaskError

    cause = _mlflow_errors()[2]
    wrapped = RayTaskError("run", f"Traceback (most recent call last):\n  ...\n{cause}", cause)
    text = public_error(wrapped)
    assert SECRET not in text and "RayTaskError" in text


def test_public_error_keeps_our_own_errors_and_their_limit():
    assert public_error(ValueError("transfer.widths[0]=8 must be > tune.base_width=16")) == \
        "ValueError: transfer.widths[0]=8 must be > tune.base_width=16"
    assert len(public_error(ValueError("x" * 5000))) == 2000 and len(public_error(ValueError("x" * 50), 20)) == 20


def test_the_driver_records_a_remote_servers_error_without_its_body(tree, monkeypatch):
    """Observation 4: the response body came back in the study's `error`. The driver actor's own method,
    in-process (Ray not started), its study logging to a real listener that answers 403 with a secret."""
    from mlflow import MlflowClient

    import workers.driver
    from service.execution import StudyDriverActor
    from service.store import Store

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setattr("ray.actor.exit_actor", lambda: None)  # outside an actor: nothing to exit
    store = Store(f"sqlite:///{tree['base'] / 'driver.db'}")
    store.migrate()
    store.create("tiny-0001", TINY, "hash", None)
    store.transition("tiny-0001", "running")
    with _Listener(status=403) as listener:
        def run_study(spec, study_id, on_event):  # what the driver does first: find its experiment
            MlflowClient(tracking_uri=listener.url).get_experiment_by_name(spec.name)

        monkeypatch.setattr(workers.driver, "run_study", run_study)
        actor = StudyDriverActor.__ray_metadata__.modified_class()
        assert actor.run(TINY, "tiny-0001", store.url, 1) == "failed"
        assert listener.requests  # the server was asked and answered
    study = store.get("tiny-0001")
    assert study.status == "failed" and SECRET not in study.error and study.error.startswith("MlflowException: ")
