# SPDX-License-Identifier: Apache-2.0
"""``GET /openapi.json`` (issue 23): an OpenAPI 3.1 document generated from the routes and ``REQUEST_FIELDS``.
It validates with ``openapi-spec-validator``; every route the app serves is a path, every field of the table a
property whose description says implemented or refused; the request bodies' schemas accept what the server
accepts and reject what it answers 400 (checked with ``jsonschema`` against real requests to the real app)."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
validator = pytest.importorskip("openapi_spec_validator")
jsonschema = pytest.importorskip("jsonschema")

from starlette.testclient import TestClient  # noqa: E402

from edgesdk.serve.app import create_app  # noqa: E402
from edgesdk.serve.config import ModelEntry, ServeConfig  # noqa: E402
from edgesdk.serve.fields import MODELS, REQUEST_FIELDS  # noqa: E402
from edgesdk.serve.protocol import APIError, parse  # noqa: E402

ROUTES = {
    "/v1/chat/completions": "post",
    "/v1/completions": "post",
    "/v1/embeddings": "post",
    "/v1/responses": "post",
    "/v1/models": "get",
    "/v1/models/{model}": "get",
    "/health": "get",
    "/metrics": "get",
    "/openapi.json": "get",
    "/tokenize": "post",
    "/detokenize": "post",
    "/apply-template": "post",
    "/props": "get",
    "/slots": "get",
}


@pytest.fixture(scope="module")
def served():
    """The app with no model (the document does not depend on the bundles), behind an API key."""
    app = create_app([], ServeConfig(api_key="k"))
    with TestClient(app, base_url="http://127.0.0.1:8080") as client:
        r = client.get("/openapi.json", headers={"Authorization": "Bearer k"})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert client.get("/openapi.json").status_code == 401  # behind the API key like every route but /health
        yield r.json(), client


def test_the_document_is_valid_openapi_3_1(served):
    doc, _ = served
    assert doc["openapi"] == "3.1.0"
    validator.validate(doc)  # raises on any violation of the OpenAPI 3.1 schema
    broken = {**doc, "paths": {"/x": {"get": {"responses": {"200": {}}}}}}  # a response without description
    with pytest.raises(Exception):  # noqa: B017 - the validator's error class differs between versions
        validator.validate(broken)


def test_every_route_and_every_field_is_there(served):
    doc, _ = served
    assert {p: sorted(ops) for p, ops in doc["paths"].items()} == {p: [m] for p, m in ROUTES.items()}
    schemas = doc["components"]["schemas"]
    for route, fields in REQUEST_FIELDS.items():
        ref = doc["paths"][route]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        body = schemas[ref.rsplit("/", 1)[1]]
        assert set(body["properties"]) == {f.name for f in fields}, route
        assert body["additionalProperties"] is False
        for f in fields:
            prop = body["properties"][f.name]
            assert prop["x-edgesdk-status"] == f.status and f.note in prop["description"]
            start = {"implemented": "implemented", "ignored": "accepted, ignored"}.get(f.status, "refused (400)")
            assert prop["description"].startswith(start)
            if f.status in ("implemented", "ignored"):
                assert {"type", "anyOf", "$ref"} & set(prop), (route, f.name)  # every implemented field is typed


@pytest.mark.parametrize(
    "route,body,ok",
    [
        ("/v1/embeddings", {"model": "m", "input": "hi"}, True),
        ("/v1/embeddings", {"model": "m", "input": [[101, 2023, 102], [101, 102]]}, True),
        ("/v1/embeddings", {"model": "m", "input": [101, 2023, 102], "encoding_format": "base64"}, True),
        ("/v1/embeddings", {"model": "m", "input": []}, False),
        ("/v1/embeddings", {"model": "m", "input": "hi", "truncate": True}, False),
        ("/v1/embeddings", {"model": "m", "input": "hi", "encoding_format": "int8"}, False),
        ("/v1/completions", {"model": "m", "prompt": [1, 2, 3], "max_tokens": 4, "stop": ["\n"]}, True),
        ("/v1/completions", {"model": "m", "prompt": "x", "suffix": "y"}, False),
        ("/v1/completions", {"model": "m", "prompt": "x", "best_of": 1}, True),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0},
            True,
        ),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 3},
            False,
        ),
        ("/v1/chat/completions", {"model": "m"}, False),
    ],
)
def test_request_schemas_agree_with_the_server(served, route, body, ok):
    doc, _ = served
    ref = doc["paths"][route]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    # the body's schema, its $refs (#/components/schemas/...) resolved in the document
    schema = {"$ref": ref, "components": doc["components"], "$schema": "https://json-schema.org/draft/2020-12/schema"}
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(body))
    assert (not errors) == ok, [e.message for e in errors]
    # The server's own parser of that route says the same (400 exactly when the schema says invalid).
    entry = ModelEntry(name="m", session=None, kind="llm", max_tokens_cap=2048, default_max_tokens=256)
    try:
        req = parse(MODELS[route], body)
        if route != "/v1/embeddings":
            req.to_generation_request(entry)
        accepted = True
    except APIError as exc:
        assert exc.status == 400
        accepted = False
    assert accepted == ok
