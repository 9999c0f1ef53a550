"""The OpenAPI document's request schema is the validator's: bodies generated from `POST /studies`' own schema
(valid ones, and mutated ones) never get a 5xx, a body the schema refuses is never accepted, and a body it accepts
is refused only for what a schema cannot say (422: budgets no width meets, widths a paradigm cannot build, ...).

The bodies come from a small strategy builder over the JSON-Schema keywords pydantic emits (an unknown keyword
fails the test, so the builder grows with the schema); hypothesis-jsonschema builds the same bodies at ~0.4 s each
on this schema, too slow for the default suite. Every generated valid body is checked against the schema first.

    PTCTL_SCHEMA_EXAMPLES=2000 python -m pytest -q -s tests/service/test_request_schema.py
"""

from __future__ import annotations

import copy
import json
import os
import time
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.app import create_app
from service.settings import Settings
from studies import family_names, load_catalog
from tests.service.conftest import FakeExecutor

EXAMPLES = int(os.environ.get("PTCTL_SCHEMA_EXAMPLES", "150"))
ANNOTATIONS = {"title", "description", "default", "examples"}
BIG = 1 << 20  # the largest integer or magnitude drawn where the schema sets no bound


@pytest.fixture(scope="module")
def api(tmp_path_factory, migrated):
    app = create_app(Settings(data_dir=migrated(tmp_path_factory.mktemp("schema-data"))), FakeExecutor())
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def request_schema(api) -> dict[str, Any]:
    """`POST /studies`' JSON body schema, with the components its references need."""
    document = api.get("/openapi.json").json()
    body = document["paths"]["/studies"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**body, "components": document["components"]}


# ---------------------------------------------------------------------------------- bodies from a schema
class Bodies:
    """Hypothesis strategies for the instances of a JSON schema (the subset pydantic emits)."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def resolve(self, ref: str) -> dict[str, Any]:
        node: Any = self.root
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        return node

    def of(self, schema: dict[str, Any]) -> st.SearchStrategy[Any]:
        keys = set(schema) - ANNOTATIONS
        if "$ref" in keys:
            return st.deferred(lambda: self.of(self.resolve(schema["$ref"])))
        if "const" in keys:
            return st.just(schema["const"])
        if "enum" in keys:
            return st.sampled_from(schema["enum"])
        for union in ("anyOf", "oneOf"):  # oneOf: pydantic's variants exclude each other (the family's const)
            if union in keys:
                return st.one_of([self.of(s) for s in schema[union]])
        kind = schema.get("type")
        builders = {"object": self.object, "array": self.array, "string": self.string, "integer": self.integer,
                    "number": self.number, "boolean": lambda s: st.booleans(), "null": lambda s: st.none()}
        if kind not in builders:
            raise AssertionError(f"a schema this test cannot generate from: {schema}")
        known = {"type", "properties", "required", "additionalProperties", "maxProperties", "items", "prefixItems",
                 "minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum",
                 "exclusiveMinimum", "exclusiveMaximum"}
        assert keys <= known, f"keywords this test does not generate: {keys - known}"
        return builders[kind](schema)

    def object(self, schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
        properties, required = schema.get("properties", {}), set(schema.get("required", []))
        extra = schema.get("additionalProperties", True)
        if isinstance(extra, dict):  # a map: any keys, each value of the schema
            return st.dictionaries(st.text(min_size=1, max_size=6), self.of(extra),
                                   max_size=min(schema.get("maxProperties", 3), 3))
        fields = {name: self.of(s) for name, s in properties.items()}

        @st.composite
        def build(draw: Any) -> dict[str, Any]:
            chosen = [n for n in fields if n in required or draw(st.booleans())]
            return {name: draw(fields[name]) for name in chosen}

        return build()

    def array(self, schema: dict[str, Any]) -> st.SearchStrategy[list[Any]]:
        if "prefixItems" in schema:
            return st.tuples(*(self.of(s) for s in schema["prefixItems"])).map(list)
        low = schema.get("minItems", 0)
        return st.lists(self.of(schema.get("items", {"type": "null"})), min_size=low,
                        max_size=schema.get("maxItems", low + 3))

    def string(self, schema: dict[str, Any]) -> st.SearchStrategy[str]:
        low, high = schema.get("minLength", 0), schema.get("maxLength", 12)
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= high)
        return st.text(min_size=low, max_size=min(high, 12))

    def integer(self, schema: dict[str, Any]) -> st.SearchStrategy[int]:
        low = schema.get("minimum", schema["exclusiveMinimum"] + 1 if "exclusiveMinimum" in schema else -BIG)
        high = schema.get("maximum", schema["exclusiveMaximum"] - 1 if "exclusiveMaximum" in schema else BIG)
        return st.integers(low, high) | st.integers(low, min(high, low + 64))  # small values too

    def number(self, schema: dict[str, Any]) -> st.SearchStrategy[float]:
        low = schema.get("minimum", schema.get("exclusiveMinimum", -BIG))
        high = schema.get("maximum", schema.get("exclusiveMaximum", BIG))
        return st.floats(low, high, exclude_min="exclusiveMinimum" in schema, exclude_max="exclusiveMaximum" in schema,
                         allow_nan=False, allow_infinity=False)


# ---------------------------------------------------------------------------------- mutations
JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(-1e6, 1e6) | st.text(max_size=6),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                    max_leaves=6)
SEEDS = [load_catalog(name).as_dict() for name in ("tiny", "tiny_tau", "compare_cpu")]


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    paths = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            paths += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            paths += _paths(value, (*prefix, i))
    return paths


@st.composite
def mutated(draw: Any, valid: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """A valid body (generated, or a catalog study) with one change: a value replaced (by any JSON, null, {} or
    another family's name), a key removed or an unknown key added."""
    body = copy.deepcopy(draw(valid | st.sampled_from(SEEDS)))
    paths = _paths(body)
    if not paths:
        return body
    path = draw(st.sampled_from(paths))
    node = body
    for key in path[:-1]:
        node = node[key]
    kind = draw(st.sampled_from(["replace", "null", "empty", "family", "remove", "add"]))
    if kind == "replace":
        node[path[-1]] = draw(JSON)
    elif kind in ("null", "empty"):
        node[path[-1]] = None if kind == "null" else {}
    elif kind == "family":
        node[path[-1]] = draw(st.sampled_from(family_names()))
    elif kind == "remove" and isinstance(node, dict):
        del node[path[-1]]
    elif isinstance(node, dict):
        node[draw(st.sampled_from(["validate_", "space", "x", "data", path[-1] + "_"]))] = draw(JSON)
    return body


# ---------------------------------------------------------------------------------- the property
def test_generated_valid_bodies_are_valid(request_schema):
    """The builder's bodies are what the schema accepts (so the property below tests the schema, not the builder);
    every family's variant is drawn (derandomized: a random draw of 60 missed BERT's about one run in four; 100 for
    six families)."""
    validator = jsonschema.Draft202012Validator(request_schema)
    families: set[str] = set()

    @settings(max_examples=100, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(Bodies(request_schema).of(request_schema))
    def check(body):
        assert validator.is_valid(body), [e.message for e in validator.iter_errors(body)][:3]
        families.add((body.get("model") or {}).get("family", "pt"))

    check()
    assert families == set(family_names())


def test_the_api_accepts_no_body_its_openapi_schema_refuses(api, request_schema):
    validator = jsonschema.Draft202012Validator(request_schema)
    for seed in SEEDS:  # the catalog's studies: valid on both sides
        assert validator.is_valid(seed), [e.message for e in validator.iter_errors(seed)][:3]
        answer = api.post("/studies", content=json.dumps(seed), headers={"Content-Type": "application/json"})
        assert answer.status_code < 300, answer.text
    valid = Bodies(request_schema).of(request_schema)
    counts: dict[tuple[bool, int], int] = {}
    start = time.perf_counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(valid, mutated(valid), mutated(valid)))  # two in three bodies mutated
    def check(body):
        answer = api.post("/studies", content=json.dumps(body), headers={"Content-Type": "application/json"})
        ok = validator.is_valid(body)
        counts[ok, answer.status_code] = counts.get((ok, answer.status_code), 0) + 1
        assert answer.status_code < 500, (body, answer.text)
        if answer.status_code < 300:
            assert ok, ("accepted, but the OpenAPI schema refuses it", body,
                        [e.message for e in validator.iter_errors(body)][:3])
        elif ok:  # schema-valid JSON: refused only as invalid (what the schema cannot express)
            assert answer.status_code == 422, (body, answer.text)

    check()
    print(f"schema fuzz: {sum(counts.values())} bodies in {time.perf_counter() - start:.1f} s; "
          f"(schema-valid, status): {dict(sorted(counts.items()))}")


@pytest.mark.parametrize(("change", "where"), [
    ({"space": {}}, None), ({"space": None}, None), ({"model": {"family": "bert", "arch": None}, "space": None}, None),
    ({"data": None}, "data"), ({"validate_": None}, "validate_"),
    ({"model": {"family": "bert"}, "space": {"w_H": {"low": 0.5, "high": 2}}}, "space"),
    ({"model": {"family": "tauformer"}, "compare": {"budgets": [1e6], "tokens": 1000,
                                                    "baselines": [{"model": {"family": "bert"}}]}}, None),
])
def test_the_schema_and_the_api_agree_on_the_fuzz_findings(api, request_schema, change, where):
    """The bodies an earlier fuzz found the schema and the API disagreeing on: `space: {}` and `data: null`
    were accepted against the schema (whose space union did not follow the family), a BERT space given PT's
    hparams was schema-valid; now each side says the same."""
    body = {**SEEDS[0], **change}
    answer = api.post("/studies", content=json.dumps(body), headers={"Content-Type": "application/json"})
    ok = jsonschema.Draft202012Validator(request_schema).is_valid(body)
    assert ok == (answer.status_code < 300), (ok, answer.status_code, answer.text)
    if where is not None:
        assert any(e["loc"][:2] == ["body", where] for e in answer.json()["detail"]), answer.text
