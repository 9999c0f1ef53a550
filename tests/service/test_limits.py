"""What a remote client may send: bounds on every size-like field (PTCTL_MAX_*, checked before validation),
strict types, UTF-8 and valid Unicode only, no YAML aliases, a non-empty Idempotency-Key; the API in-process
(no Ray: a fake executor)."""

from __future__ import annotations

import copy
import json
import time

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.limits import FIELDS, Limits
from service.settings import Settings
from studies import load_catalog
from studies.spec import CATALOG_DIR
from tests.service.conftest import FakeExecutor

TINY = load_catalog("tiny").as_dict()
TINY_TAU = load_catalog("tiny_tau").as_dict()
COMPARE = load_catalog("compare_cpu").as_dict()
REFUSED_S = 5.0  # the defects below took 20–45 s; a busy machine adds fractions of a second
BOMB = b"""a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
name: bomb
tune: {base_width: *i}
"""


@pytest.fixture(scope="module")
def api(tmp_path_factory, migrated):
    settings = Settings(data_dir=migrated(tmp_path_factory.mktemp("limits-data")), allow_hf_hub=True)
    app = create_app(settings, FakeExecutor())
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _post(api, body, content_type: str = "application/json", **headers):
    body = json.dumps(body) if isinstance(body, dict) else body
    return api.post("/studies", content=body, headers={"Content-Type": content_type, **headers})


def _with(spec: dict, path: tuple, value) -> dict:
    data = copy.deepcopy(spec)
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return data


def _errors(response) -> list[dict]:
    assert response.status_code == 422, response.text
    return response.json()["detail"]


# ---------------------------------------------------------------------------------- bounds (obs 6)
@pytest.mark.parametrize(("spec", "path", "value", "setting"), [
    (TINY, ("transfer", "widths"), [16, 10**6], "PTCTL_MAX_WIDTH"),
    (TINY, ("tune", "base_width"), 10**6, "PTCTL_MAX_WIDTH"),
    (TINY, ("verify", "n_samples"), 10**9, "PTCTL_MAX_SAMPLES"),
    (TINY, ("tune", "num_trials"), 10**9, "PTCTL_MAX_TRIALS"),
    (TINY, ("train", "steps"), 10**12, "PTCTL_MAX_STEPS"),
    (TINY, ("tune", "steps"), 10**12, "PTCTL_MAX_STEPS"),
    (TINY, ("data", "seq_len"), 10**9, "PTCTL_MAX_SEQ_LEN"),
    (TINY, ("data", "vocab_size"), 10**12, "PTCTL_MAX_VOCAB"),
    (TINY, ("resources", "gpus_per_trial"), 10**6, "PTCTL_MAX_GPUS"),
    (TINY, ("resources", "cpus_per_trial"), 10**6, "PTCTL_MAX_CPUS"),
    (TINY, ("resources", "batch_members"), 10**6, "PTCTL_MAX_MEMBERS"),
    (TINY, ("train", "batch_size"), 10**9, "PTCTL_MAX_BATCH"),
    (TINY, ("tune", "seed"), 2**64, "PTCTL_MAX_SEED"),
    (TINY, ("model", "arch", "n_iter"), 10**6, "PTCTL_MAX_LAYERS"),
    (TINY, ("model", "arch", "n_channels"), 10**8, "PTCTL_MAX_ARCH"),
    (TINY_TAU, ("model", "arch", "n_layers"), 10**6, "PTCTL_MAX_LAYERS"),
    (TINY_TAU, ("model", "arch", "head_dim"), 10**6, "PTCTL_MAX_ARCH"),
    (TINY_TAU, ("model", "arch", "kv_group"), 10**6, "PTCTL_MAX_MULT"),
    (COMPARE, ("compare", "tokens"), 10**15, "PTCTL_MAX_TOKENS"),
    (COMPARE, ("compare", "seeds"), 10**6, "PTCTL_MAX_SEEDS"),
    (COMPARE, ("compare", "baselines", 0, "num_trials"), 10**9, "PTCTL_MAX_TRIALS"),
])
def test_size_fields_over_their_bound_are_422_naming_the_setting(api, spec, path, value, setting):
    if path[:3] == ("compare", "baselines", 0):
        data = copy.deepcopy(spec)
        data["compare"]["baselines"][0][path[-1]] = value
    else:
        data = _with(spec, path, value)
    errors = _errors(_post(api, data))
    loc = ["body", *path, 1] if isinstance(value, list) else ["body", *path]
    assert any(e["loc"] == loc and setting in e["msg"] for e in errors), errors


def test_every_bound_is_a_setting_and_the_operator_can_raise_or_lower_it(tmp_path, migrated):
    assert set(FIELDS.values()) <= set(Limits.model_fields)
    tight = create_app(Settings(data_dir=migrated(tmp_path), limits=Limits(trials=4)), FakeExecutor())
    with TestClient(tight, raise_server_exceptions=False) as client:
        errors = _errors(_post(client, _with(TINY, ("tune", "num_trials"), 5)))
        assert errors[0]["loc"] == ["body", "tune", "num_trials"] and "PTCTL_MAX_TRIALS" in errors[0]["msg"]
        assert _post(client, _with(TINY, ("tune", "num_trials"), 4)).status_code == 201


def test_huge_compare_budgets_are_refused_at_once(api):
    """Was 20.8 s: every budget's width was solved (a linear scan per family) before any bound was checked."""
    for budgets, setting in (([1e12 * (i + 1) for i in range(60)], "PTCTL_MAX_PARAMS"),
                             ([1e5 * (i + 1) for i in range(100)], "PTCTL_MAX_LIST")):
        start = time.perf_counter()
        errors = _errors(_post(api, _with(COMPARE, ("compare", "budgets"), budgets)))
        assert time.perf_counter() - start < REFUSED_S
        assert errors[0]["loc"][:3] == ["body", "compare", "budgets"] and setting in errors[0]["msg"], errors[0]
    # within the bounds but unreachable by any width: validation itself stays fast (the solver bisects)
    start = time.perf_counter()
    errors = _errors(_post(api, _with(COMPARE, ("compare", "budgets"), [9e10 + i for i in range(60)])))
    assert time.perf_counter() - start < REFUSED_S and "no pt width" in json.dumps(errors)


# ---------------------------------------------------------------------------------- strict input (obs 7)
@pytest.mark.parametrize(("spec", "path", "value"), [
    (TINY, ("tune", "base_width"), "16"),
    (TINY, ("tune", "num_trials"), True),
    (TINY, ("tune", "max_concurrent"), True),
    (TINY, ("train", "weight_decay"), "0.1"),
    (TINY, ("train", "grad_clip"), False),
    (TINY_TAU, ("model", "arch", "n_layers"), "2"),  # nested models (validated inside validators) are strict too
    (TINY, ("space", "lr", "low"), "0.001"),
    (COMPARE, ("compare", "budgets"), ["2e5", "4e5"]),
])
def test_strings_and_booleans_are_not_numbers(api, spec, path, value):
    errors = _errors(_post(api, _with(spec, path, value)))
    assert any(e["loc"][: len(path) + 1] == ["body", *path] for e in errors), errors


def test_every_catalog_yaml_is_accepted(api):
    """Strict JSON numbers, YAML 1.2 floats (`1.7e7`, a string in YAML 1.1) and lists for tuples (betas).
    A catalog spec reading a relative data path is refused by the remote policy (test_policy.py) alone."""
    for path in sorted(CATALOG_DIR.glob("*.yaml")):
        response = _post(api, path.read_bytes(), "application/yaml")
        if response.status_code == 422 and all(e["type"] == "policy" for e in response.json()["detail"]):
            assert path.stem == "taugpt_30m", response.text  # data/train.jsonl
            continue
        assert response.status_code in (200, 201), (path.name, response.text)
        spec = api.get(response.headers["location"]).json()["spec"]
        assert spec == load_catalog(path.stem).as_dict(), path.name
        as_json = _post(api, load_catalog(path.stem).as_dict())
        assert as_json.status_code == 201 and as_json.json()["spec_hash"] == response.json()["spec_hash"], path.name


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "utf-32-be"])
def test_bodies_that_are_not_utf8_are_refused(api, encoding):
    """`json.loads(bytes)` accepts UTF-16/32 silently; the API takes UTF-8 only."""
    response = _post(api, json.dumps(TINY).encode(encoding))
    assert response.status_code == 400 and "UTF-8" in response.json()["detail"], response.text
    charset = _post(api, json.dumps(TINY), f"application/json; charset={encoding}")
    assert charset.status_code == 415 and "UTF-8" in charset.json()["detail"]


def test_a_lone_surrogate_is_refused_and_no_study_becomes_unreadable(api):
    """It used to be stored, and that study's GET answered 500 forever."""
    for body in (json.dumps(TINY | {"description": "\ud800"}), json.dumps(TINY | {"space": {"lr\udfff": {}}})):
        errors = _errors(_post(api, body))
        assert any("lone surrogate" in e["msg"] for e in errors), errors
    escaped = _post(api, 'name: x\ndescription: "\\ud800"\ntune: {base_width: 8}\n', "application/yaml")
    assert escaped.status_code == 400 and "malformed YAML" in escaped.json()["detail"]  # PyYAML refuses it
    listed = api.get("/studies", params={"limit": 500})
    assert listed.status_code == 200
    for study in listed.json()["items"]:
        assert api.get(f"/studies/{study['id']}").status_code == 200


def test_yaml_aliases_are_refused_at_once(api):
    """A 505-byte alias bomb took 44.8 s to refuse, with the event loop frozen meanwhile."""
    assert len(BOMB) < 600
    start = time.perf_counter()
    response = _post(api, BOMB, "application/yaml")
    assert time.perf_counter() - start < REFUSED_S
    assert response.status_code == 400 and "anchors and aliases" in response.json()["detail"], response.text


def test_an_empty_idempotency_key_is_422(api):
    response = _post(api, TINY, **{"Idempotency-Key": ""})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["header", "idempotency-key"]


def test_a_slow_parse_answers_422_and_holds_its_slot_until_its_thread_ends(tmp_path, monkeypatch, migrated):
    """The time limit: a parse past PTCTL_MAX_PARSE_S is answered; its thread keeps its slot until it ends, so
    hostile bodies cannot pile threads up (the next request waits for a slot, then gets 503)."""
    import service.intake as intake

    real = intake.parse_spec
    monkeypatch.setattr(intake, "parse_spec", lambda body, media, limits: (time.sleep(1.0), real(body, media,
                                                                                                  limits))[1])
    app = create_app(Settings(data_dir=migrated(tmp_path), limits=Limits(parses=1, parse_s=0.3)), FakeExecutor())
    with TestClient(app, raise_server_exceptions=False) as client:
        slow = _post(client, TINY)
        assert slow.status_code == 422 and "PTCTL_MAX_PARSE_S" in slow.json()["detail"]
        busy = _post(client, TINY)  # the first thread still runs for ~0.4 s more
        assert busy.status_code == 503 and "PTCTL_MAX_PARSES" in busy.json()["detail"] and busy.headers["retry-after"]


def test_each_step_count_of_a_horizon_sweep_is_bounded_like_train_steps():
    from service.limits import check

    body = {"validate": {"widths": [64], "steps": [150, 300, 20_000_000]}, "train": {"steps": 600}}
    [error] = check(body, Limits())
    assert error["loc"] == ["body", "validate", "steps", 2] and "PTCTL_MAX_STEPS" in error["msg"]
    assert check({"validate": {"steps": 300}}, Limits()) == []


def test_each_depth_of_a_depth_sweep_is_bounded_like_n_layers():
    from service.limits import check

    body = {"validate": {"widths": [64], "depths": [2, 4, 512]}, "model": {"arch": {"n_layers": 2}}}
    [error] = check(body, Limits())
    assert error["loc"] == ["body", "validate", "depths", 2] and "PTCTL_MAX_LAYERS" in error["msg"]
    assert check(body, Limits(layers=1024)) == []
