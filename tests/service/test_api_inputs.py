"""Bad input never yields a 5xx: the API in-process (no Ray: a fake executor), malformed and invalid
bodies, unknown ids, illegal state changes, and a hypothesis fuzz over the OpenAPI operations.

The fuzz sends 250 requests by default; the reliability run (docs/LOG.md) sends more:
    PTCTL_FUZZ_EXAMPLES=2500 python -m pytest -q -s tests/service/test_api_inputs.py
"""

from __future__ import annotations

import copy
import json
import os
import time

import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from service.app import create_app
from service.settings import Settings
from studies import load_catalog
from tests.service.conftest import FakeExecutor

TINY = load_catalog("tiny").as_dict()
TINY_TAU = load_catalog("tiny_tau").as_dict()
LIMIT = 20_000


@pytest.fixture(scope="module")
def api(tmp_path_factory, migrated):
    executor = FakeExecutor()
    # ray_num_cpus 1: POST /plans times each shape alone, without spawning a companion process per valid body
    app = create_app(Settings(data_dir=migrated(tmp_path_factory.mktemp("api-data")), max_body_bytes=LIMIT,
                              ray_num_cpus=1), executor)
    with TestClient(app, raise_server_exceptions=False) as client:
        client.executor = executor
        yield client


def _post(api, body: bytes | str, content_type: str = "application/json", **headers):
    return api.post("/studies", content=body, headers={"Content-Type": content_type, **headers})


def test_valid_json_and_yaml_are_accepted(api):
    created = _post(api, json.dumps(TINY))
    assert created.status_code == 201 and created.headers["location"] == f"/studies/{created.json()['id']}"
    assert created.json()["status"] == "running" and created.json()["id"] in api.executor.launched
    assert _post(api, load_catalog("tiny").to_yaml(), "application/yaml").status_code == 201


def test_idempotency_key_returns_the_same_study_and_starts_it_once(api):
    first = _post(api, json.dumps(TINY), **{"Idempotency-Key": "retry-me"})
    again = _post(api, json.dumps(TINY), **{"Idempotency-Key": "retry-me"})
    assert (first.status_code, again.status_code) == (201, 200) and first.json()["id"] == again.json()["id"]
    assert api.executor.launched.count(first.json()["id"]) == 1
    other = copy.deepcopy(TINY) | {"description": "changed"}
    clash = _post(api, json.dumps(other), **{"Idempotency-Key": "retry-me"})
    assert clash.status_code == 409 and "another spec" in clash.json()["detail"]


@pytest.mark.parametrize(("body", "content_type", "code", "message"), [
    (b'{"name": "x",', "application/json", 400, "malformed JSON"),
    (b"name: [unclosed", "application/yaml", 400, "malformed YAML"),
    (b"\xff\xfe", "application/yaml", 400, "not UTF-8"),
    (b"[1, 2]", "application/json", 422, "StudySpec object"),
    (b"<spec/>", "application/xml", 415, "application/yaml"),
    (b'{"tune": {"base_width": NaN}}', "application/json", 400, "finite number"),
    (b"tune: {base_width: .inf}", "application/yaml", 422, "finite number"),
    (b"[" * 5000 + b"]" * 5000, "application/json", 400, "malformed"),
])
def test_malformed_bodies_are_4xx_with_a_useful_message(api, body, content_type, code, message):
    response = _post(api, body, content_type)
    assert response.status_code == code and message in json.dumps(response.json()), response.text


def _invalid(path: tuple, value, spec: dict = TINY):
    data = copy.deepcopy(spec)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


@pytest.mark.parametrize(("data", "loc", "words"), [
    (_invalid(("tune", "base_width"), "wide"), ["body", "tune", "base_width"], "valid integer"),
    (_invalid(("train", "unknown_knob"), 1), ["body", "train", "unknown_knob"], "unknown key"),
    (_invalid(("transfer", "widths"), [8]), ["body", "transfer", "widths", 0], "must be > tune.base_width"),
    ({k: v for k, v in TINY.items() if k != "tune"}, ["body", "tune"], "Field required"),
    (_invalid(("model", "arch", "attention"), "flash", TINY_TAU), ["body", "model", "arch", "attention"],
     "'tau', 'dot' or 'uniform'"),
    (_invalid(("transfer", "widths"), [36], TINY_TAU), ["body", "transfer", "widths", 0],
     "multiple of model.arch.head_dim · kv_group"),
    (_invalid(("data", "objective"), "mlm", TINY_TAU), ["body", "data", "objective"], "set data.objective: clm"),
    # schema-valid widths the arch cannot build (were 500s): nanoGPT's heads, TauGPT's head_dim
    ({"name": "r500a", "model": {"family": "nanogpt"}, "tune": {"base_width": 30}, "transfer": None, "verify": None},
     ["body", "tune", "base_width"], "tune.base_width=30 is not a multiple of 4 (model.arch's n_heads)"),
    (_invalid(("verify",), {"p": 5e-324}), ["body", "verify", "p"], "needs N=inf samples"),  # was a 500 of /plans
    ({"name": "r500b", "model": {"family": "tauformer"}, "tune": {"base_width": 16}, "transfer": None,
      "verify": None}, ["body", "tune", "base_width"], "not a multiple of model.arch.head_dim · kv_group = 32"),
])
def test_invalid_specs_are_422_with_the_field_path(api, data, loc, words):
    response = _post(api, json.dumps(data))
    assert response.status_code == 422
    errors = response.json()["detail"]
    assert any(e["loc"] == loc and words in e["msg"] for e in errors), errors


def test_a_misspelt_key_is_422_naming_the_nearest_and_the_valid_ones(api):
    """The 422 keeps its shape (loc, msg, type) and says what the CLI says: the nearest key and the valid ones."""
    response = _post(api, json.dumps(_invalid(("train", "batchsize"), 8)))
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "train", "batchsize"] and error["type"] == "extra_forbidden", error
    assert "did you mean batch_size?" in error["msg"] and "valid keys here: steps, batch_size" in error["msg"]
    arch = _post(api, json.dumps(_invalid(("model", "arch", "n_layer"), 2, TINY_TAU))).json()["detail"]
    assert [e["loc"] for e in arch] == [["body", "model", "arch", "n_layer"]] and "n_layers?" in arch[0]["msg"]


def test_messages_do_not_repeat_pydantic_prefixes(api):
    """No "Value error, " before a validator's message; each cross-field problem is one entry at its field."""
    data = _invalid(("verify", "width"), 8, _invalid(("transfer", "widths"), [8]))
    errors = _post(api, json.dumps(data)).json()["detail"]
    assert [e["loc"] for e in errors] == [["body", "transfer", "widths", 0], ["body", "verify", "width"]], errors
    assert all(not e["msg"].startswith("Value error") and ";" not in e["msg"].split(":")[0] for e in errors), errors
    bound = _post(api, json.dumps(_invalid(("verify",), {"delta": 1.5}))).json()["detail"]
    assert bound == [{"loc": ["body", "verify", "delta"], "msg": "must be less than 1 (allowed: 0 < delta < 1)",
                      "type": "less_than"}]


def test_a_bad_query_is_422_in_the_same_shape(api):
    [error] = api.get("/studies", params={"limit": 0}).json()["detail"]
    assert error == {"loc": ["query", "limit"], "msg": "must be greater than or equal to 1",
                     "type": "greater_than_equal"}


def test_oversized_bodies_are_413(api):
    big = json.dumps(TINY | {"description": "x" * LIMIT})
    assert _post(api, big).status_code == 413
    streamed = api.post("/studies", content=(big[i:i + 1000].encode() for i in range(0, len(big), 1000)),
                        headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413, streamed.text


def test_unknown_ids_404_and_illegal_changes_409(api):
    for method, path in (("GET", "/studies/nope"), ("GET", "/studies/nope/trials"), ("GET", "/studies/nope/report"),
                         ("POST", "/studies/nope/cancel"), ("POST", "/studies/nope/resume")):
        response = api.request(method, path)
        assert response.status_code == 404 and "nope" in response.json()["detail"]
    study = _post(api, json.dumps(TINY)).json()["id"]
    assert api.post(f"/studies/{study}/resume").status_code == 409  # running: nothing to resume
    assert api.get(f"/studies/{study}/report").status_code == 409  # not finished
    assert api.post(f"/studies/{study}/cancel").json()["status"] == "cancelled"
    conflict = api.post(f"/studies/{study}/cancel")
    assert conflict.status_code == 409 and "is cancelled" in conflict.json()["detail"]
    assert api.get("/studies", params={"status": "finished"}).status_code == 422
    assert api.get("/studies", params={"limit": 0}).status_code == 422


# ---------------------------------------------------------------------------------- fuzz
TEXT = st.text(max_size=8) | st.sampled_from(["\ud800", "16", "true", "", "\x00", "1e6", "*a", "&a x"])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
                    max_leaves=8)


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, (*prefix, k))


SPEC_PATHS = [p for p in _paths(TINY) if p]


@st.composite
def spec_bodies(draw):
    """Valid tiny spec with one field replaced, removed, or an unknown one added; or any JSON."""
    kind = draw(st.sampled_from(["replace", "remove", "add", "any"]))
    if kind == "any":
        return draw(JSON)
    data = copy.deepcopy(TINY)
    path = draw(st.sampled_from(SPEC_PATHS))
    node = data
    for key in path[:-1]:
        node = node[key]
    if kind == "replace":
        node[path[-1]] = draw(JSON)
    elif kind == "remove":
        del node[path[-1]]
    elif isinstance(node[path[-1]], dict):
        node[path[-1]][draw(st.text(min_size=1, max_size=8))] = draw(JSON)
    return data


@st.composite
def requests(draw, operations, known_ids):
    method, path, op = draw(st.sampled_from(operations))
    any_id = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="/?#%"), min_size=1,
                     max_size=12)
    url = path.replace("{study_id}", draw(st.sampled_from(known_ids) | any_id))
    params = {p["name"]: draw(st.one_of(st.integers(-5, 10**12), st.text(max_size=6)))
              for p in op.get("parameters", []) if p["in"] == "query" and draw(st.booleans())}
    headers = {"Idempotency-Key": draw(st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=300))}
    if draw(st.booleans()):
        headers["X-Padding"] = "p" * draw(st.sampled_from([10, 20_000]))  # over PTCTL_MAX_HEADER_BYTES: 431
    body, content_type = None, None
    if "requestBody" in op:
        content_type = draw(st.sampled_from(["application/json", "application/yaml", "text/plain",
                                             "application/json; charset=utf-16"]))
        data = draw(spec_bodies())
        dump = json.dumps(data) if content_type != "application/yaml" else yaml.safe_dump(data)
        text = draw(st.sampled_from([dump, dump[: len(dump) // 2]]))
        body = text.encode(draw(st.sampled_from(["utf-8", "utf-8", "utf-16", "utf-32-le"])), "surrogatepass")
        headers["Content-Type"] = content_type
    return method.upper(), url, params, headers, body


def test_fuzzed_requests_never_get_a_5xx(api):
    schema = api.get("/openapi.json").json()
    operations = [(m, p, op) for p, item in schema["paths"].items() for m, op in item.items()]
    assert {("post", "/studies"), ("get", "/studies/{study_id}")} <= {(m, p) for m, p, _ in operations}

    known = [s["id"] for s in api.get("/studies").json()["items"]]  # the earlier tests' studies
    assert known

    sent, start = [], time.perf_counter()

    @settings(max_examples=int(os.environ.get("PTCTL_FUZZ_EXAMPLES", "250")), deadline=None,
              suppress_health_check=list(HealthCheck), database=None)
    @given(requests(operations, known))
    def check(request):
        method, url, params, headers, body = request
        response = api.request(method, url, params=params, headers=headers, content=body)
        sent.append(response.status_code)
        assert response.status_code < 500, (method, url, params, body, response.text)

    check()
    codes = {code: sent.count(code) for code in sorted(set(sent))}
    print(f"fuzz: {len(sent)} requests in {time.perf_counter() - start:.1f} s, "
          f"{sum(c >= 500 for c in sent)} x 5xx; status counts {codes}")


# ---------------------------------------------------------------------------------- schema-valid bodies
def _variants(schema: dict) -> dict[str, dict[str, dict]]:
    """StudySpec's variants (one per family) → their top-level sections, each a JSON schema of its own (the
    OpenAPI's refs made local)."""
    defs = json.loads(json.dumps(schema["components"]["schemas"]).replace("#/components/schemas/", "#/definitions/"))
    return {v["properties"]["model"]["properties"]["family"]["const"]:
            {name: {**prop, "definitions": defs} for name, prop in v["properties"].items()}
            for v in defs["StudySpec"]["oneOf"]}


def _body(family: str, section: str, value) -> dict:
    """The tiny spec as a study of `family` (its arch, space and objective the family's defaults), with `section`
    replaced by `value`."""
    body = {k: v for k, v in copy.deepcopy(TINY).items() if k != "space"}
    body["model"] = {"family": family}
    body["data"].pop("objective")
    return {**body, section: value}


@pytest.mark.slow  # the schema's strategies are slow to draw, and each new model shape is checked in the door's child
def test_schema_valid_bodies_never_get_a_5xx(api):
    """Bodies drawn from the OpenAPI's own StudySpec schema (schemathesis' way): the tiny spec as a study of any
    family with one section replaced by any value that family's schema admits, sent to POST /studies and POST
    /plans. Every answer is a 2xx or a 4xx; a 422 names its field."""
    variants = _variants(api.get("/openapi.json").json())
    assert {"pt", "tauformer", "hf", "nanogpt"} <= set(variants)
    pairs = st.sampled_from([(f, name) for f, sections in sorted(variants.items()) for name in sorted(sections)])
    bodies = pairs.flatmap(lambda fn: from_schema(variants[fn[0]][fn[1]]).map(lambda value: _body(*fn, value)))
    sent: list[int] = []

    @settings(max_examples=int(os.environ.get("PTCTL_FUZZ_EXAMPLES", "60")), deadline=None,
              suppress_health_check=list(HealthCheck), database=None)
    @given(bodies)
    def check(body):
        for path in ("/studies", "/plans?probe=false"):
            response = api.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
            sent.append(response.status_code)
            assert response.status_code < 500, (path, body, response.text)
            if response.status_code == 422:
                assert all(e["loc"][0] == "body" and e["msg"] for e in response.json()["detail"]), response.text

    check()
    codes = {code: sent.count(code) for code in sorted(set(sent))}
    print(f"schema fuzz: {len(sent)} requests; status counts {codes}")
    assert any(code < 300 for code in sent), codes  # the draws reach past validation, into the model check


def test_a_hugging_face_spec_is_accepted_and_its_config_must_be_a_mapping(api):
    arch = {"model_type": "gpt2", "config": {"n_positions": 64, "layer_norm_epsilon": 1e-6}}
    body = _body("hf", "model", {"family": "hf", "parametrization": "mup", "arch": arch})
    created = _post(api, json.dumps(body))
    assert created.status_code == 201, created.text
    body["model"]["arch"]["config"] = "/etc/passwd"
    [error] = _post(api, json.dumps(body)).json()["detail"]
    assert error["loc"][:4] == ["body", "model", "arch", "config"] and "does not read on its host" in error["msg"]
    body["model"]["arch"]["config"] = {"n_positions": 64, "activation_function": "no_such"}
    refused = _post(api, json.dumps(body))
    assert refused.status_code == 422 and "transformers cannot build a gpt2" in refused.text, refused.text


# ---------------------------------------------------------------------------------- the smaller answers
@pytest.mark.parametrize("depth", [33, 900, 1000, 2500])  # 2500 maps: the largest under LIMIT bytes
@pytest.mark.parametrize(("make", "content_type"), [
    (lambda d: "[" * d + "]" * d, "application/json"),
    (lambda d: '{"a": ' * d + "1" + "}" * d, "application/json"),
    (lambda d: "- " * d + "1", "application/yaml"),
    (lambda d: "[" * d + "]" * d, "application/yaml"),
])
def test_a_body_nested_too_deep_is_one_400_at_every_depth(api, depth, make, content_type):
    response = _post(api, make(depth), content_type)
    assert response.status_code == 400, response.text
    assert response.json()["detail"].startswith(f"malformed body: lists and maps nest {depth} levels deep, over "
                                                "PTCTL_MAX_DEPTH=32"), response.text


def test_a_yaml_spec_nested_by_indentation_past_the_bound_is_the_same_400(api):
    text = "".join(f"{'  ' * i}a{i}:\n" for i in range(40)) + "  " * 40 + "1\n"
    response = _post(api, text, "application/yaml")
    assert response.status_code == 400 and "nest 40 levels deep" in response.json()["detail"], response.text


@pytest.mark.parametrize("content_type", ["application/json", "application/yaml"])
def test_a_number_past_pythons_digit_guard_is_a_400_that_gives_no_interpreter_advice(api, content_type):
    body = '{"name": "x", "tune": {"base_width": ' + "9" * 5000 + "}}"
    response = _post(api, body, content_type)
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert "over 4300 digits" in detail and "sys." not in detail, detail


def test_a_file_uri_is_refused_as_a_uri_not_as_relative(api):
    data = copy.deepcopy(TINY)
    data["data"] |= {"source": "text", "path": "file:///etc/passwd"}
    [error] = _post(api, json.dumps(data)).json()["detail"]
    assert error["loc"] == ["body", "data", "path"] and "is a URI, not a path" in error["msg"], error


def test_readyz_shows_no_path_of_the_tracking_database(api):
    answer = api.get("/readyz").json()["checks"]["mlflow"]["detail"]
    assert answer in ("SQLite store (exists)", "SQLite store (made on first study)"), answer


def test_the_plans_expected_steps_are_rounded_to_the_thousandth(api):
    response = api.post("/plans", params={"probe": "false"}, content=json.dumps(TINY),
                        headers={"Content-Type": "application/json"})
    tune = response.json()["phases"]["tune"]["steps"]
    assert tune == round(tune, 3) and "00000000001" not in response.text, response.text


def test_the_schema_states_the_cross_field_rules_it_cannot_express(api):
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    assert "the model family's own" in schemas["DataSpec"]["properties"]["objective"]["description"]
    assert "max_len" in schemas["DataSpec"]["properties"]["seq_len"]["description"]
    assert "head_dim · kv_group" in schemas["TuneSpec"]["properties"]["base_width"]["description"]
    verify = schemas["StudySpec"]["oneOf"][0]["properties"]["verify"]["description"]
    assert "one is needed" in verify, verify
    cpus = schemas["ResourcesSpec"]["properties"]["cpus_per_trial"]
    assert cpus["minimum"] == 0.25, cpus
