"""The OpenAPI document tells the truth: each operation lists exactly the errors it answers (with the JSON
error model), and the live app answers them; OPTIONS and 405 carry `Allow` with every method of the path."""

from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from studies import FAMILIES, family_names, load_catalog
from tests.service.conftest import ADMIN, READ, FakeExecutor

EXPECTED = {  # the 4xx/5xx each operation can answer with tokens configured
    ("post", "/studies"): {400, 401, 403, 409, 413, 415, 422, 431, 503},
    ("get", "/studies"): {401, 422, 431},
    ("get", "/studies/{study_id}"): {401, 404, 431},
    ("get", "/studies/{study_id}/trials"): {401, 404, 431},
    ("get", "/studies/{study_id}/report"): {401, 404, 409, 431},
    ("post", "/studies/{study_id}/cancel"): {401, 403, 404, 409, 431},
    ("post", "/studies/{study_id}/resume"): {401, 403, 404, 409, 431, 503},
    ("post", "/plans"): {400, 401, 403, 413, 415, 422, 431, 503},
    ("get", "/healthz"): {431},
    ("get", "/readyz"): {431, 503},
}


def _app(data_dir, tokens: bool) -> TestClient:
    settings = Settings(data_dir=data_dir, api_tokens=f"admin:{ADMIN},read:{READ}" if tokens else None,
                        max_body_bytes=50_000)
    return TestClient(create_app(settings, FakeExecutor()), raise_server_exceptions=False)


def _errors_of(schema: dict) -> dict[tuple[str, str], set[int]]:
    return {(method, path): {int(c) for c in op["responses"] if int(c) >= 400}
            for path, item in schema["paths"].items() for method, op in item.items()}


@pytest.mark.parametrize("tokens", [True, False])
def test_each_operation_documents_exactly_its_errors(tmp_path, migrated, tokens):
    with _app(migrated(tmp_path), tokens) as client:
        schema = client.get("/openapi.json").json()
    expected = {op: codes if tokens else codes - {401, 403} for op, codes in EXPECTED.items()}
    assert _errors_of(schema) == expected
    error = {"$ref": "#/components/schemas/Error"}
    for (method, path), codes in expected.items():
        for code in codes - ({503} if path == "/readyz" else set()):
            assert schema["paths"][path][method]["responses"][str(code)]["content"]["application/json"]["schema"] \
                == error, (method, path, code)
    assert "FieldError" in schema["components"]["schemas"]


def test_the_documented_errors_happen(tmp_path, migrated):
    spec = json.dumps(load_catalog("tiny").as_dict())
    admin, read = {"Authorization": f"Bearer {ADMIN}"}, {"Authorization": f"Bearer {READ}"}
    with _app(migrated(tmp_path), tokens=True) as client:
        assert client.get("/studies").status_code == 401
        assert client.post("/studies/x/cancel", headers=read).status_code == 403
        assert client.get("/studies/x", headers=read).status_code == 404
        assert client.get("/studies", params={"limit": -1}, headers=read).status_code == 422
        post = {**admin, "Content-Type": "application/json"}
        assert client.post("/studies", content=b"{", headers=post).status_code == 400
        assert client.post("/studies", content=b"x" * 60_000, headers=post).status_code == 413
        assert client.post("/studies", content=spec, headers={**admin, "Content-Type": "text/csv"}).status_code == 415
        study = client.post("/studies", content=spec, headers=post).json()["id"]
        assert client.get(f"/studies/{study}/report", headers=read).status_code == 409
        big = {"X-Padding": "p" * 20_000}
        for path in ("/healthz", "/readyz", "/studies"):
            answer = client.get(path, headers={**admin, **big})
            assert answer.status_code == 431 and "PTCTL_MAX_HEADER_BYTES" in answer.json()["detail"]


def descriptions(schema: dict) -> list[tuple[str, str]]:
    """(where, text) of every operation's, query parameter's and schema property's description."""
    found = []
    for path, item in schema["paths"].items():
        for method, op in item.items():
            found.append((f"{method} {path}", op.get("description", "")))
            found += [(f"{method} {path} ?{p['name']}", p.get("description", "")) for p in op.get("parameters", [])]

    def walk(node, where: str) -> None:
        if isinstance(node, dict):
            for name, prop in (node.get("properties") or {}).items():
                if isinstance(prop, dict) and isinstance(prop.get("description"), str):
                    found.append((f"{where}.{name}", prop["description"]))
            for value in node.values():
                walk(value, where)
        elif isinstance(node, list):
            for value in node:
                walk(value, where)

    for name, component in schema["components"]["schemas"].items():
        walk(component, name)
    return found


def long_descriptions(schema: dict) -> dict[str, str]:
    """The descriptions of more than one sentence (a full stop, then a capital) or over 300 characters."""
    return {where: text for where, text in descriptions(schema)
            if re.search(r"[.!?]\s+[A-Z]", text) or len(text) > 300}


def test_every_description_is_one_sentence(tmp_path):
    """What a reader of /docs sees is one sentence each; the reasoning behind it lives in docs/ and comments."""
    settings = Settings(data_dir=tmp_path, api_tokens=f"admin:{ADMIN},read:{READ}")
    schema = create_app(settings, FakeExecutor()).openapi()
    assert len(descriptions(schema)) > 100  # the walk reaches the spec's fields, not just the operations
    assert long_descriptions(schema) == {}


def test_options_and_405_list_every_method_of_the_path(tmp_path, migrated):
    with _app(migrated(tmp_path), tokens=True) as client:
        schema = client.get("/openapi.json").json()
        for path, item in schema["paths"].items():
            url = path.replace("{study_id}", "some-id")
            answer = client.options(url)
            assert answer.status_code == 204, (path, answer.text)
            allowed = {m.strip() for m in answer.headers["allow"].split(",")}
            assert allowed == {m.upper() for m in item} | {"OPTIONS"}, path
            for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - allowed:
                refused = client.request(method, url)
                assert refused.status_code == 405 and refused.headers["allow"] == answer.headers["allow"], \
                    (method, path, refused.headers)
            for method in allowed - {"OPTIONS"}:
                assert client.request(method, url).status_code != 405, (method, path)
        assert client.options("/no-such-path").status_code == 404


def test_the_request_body_is_one_variant_per_family(tmp_path, migrated):
    """`POST /studies`' schema follows `model.family`: each registered family's variant names its own arch and
    space (the classes its validators use), null where they default; compare baselines offer the families a
    compare study takes."""
    with _app(migrated(tmp_path), tokens=False) as client:
        components = client.get("/openapi.json").json()["components"]["schemas"]

    def ref(cls) -> list[dict]:
        return [{"$ref": f"#/components/schemas/{cls.__name__}"}, {"type": "null"}]

    for section, names in (("StudySpec", family_names()), ("BaselineSpec", [n for n in FAMILIES
                                                                           if FAMILIES[n].comparable])):
        variants = components[section]["oneOf"]
        assert [v["properties"]["model"]["properties"]["family"]["const"] for v in variants] == names
        for name, variant in zip(names, variants, strict=True):
            model = variant["properties"]["model"]
            assert model["properties"]["arch"]["anyOf"] == ref(FAMILIES[name].arch)
            assert variant["properties"]["space"]["anyOf"] == ref(FAMILIES[name].space)
            assert ("family" in model.get("required", [])) == (name != "pt")  # an omitted family is PT
