# SPDX-License-Identifier: Apache-2.0
"""The server's OpenAPI 3.1 document (``GET /openapi.json``), generated from the routes the app serves and the
request models (:mod:`edgesdk.serve.schemas`: pydantic's JSON Schema of the same models that check the bodies),
so it cannot drift from what the server does.

Every field a route knows is a property of its request body: ``description`` says ``implemented``, ``accepted,
ignored`` or ``refused (400)`` (with the value that asks for nothing, when there is one) and its note, and
``x-edgesdk-status`` says the same for machines. A refused field accepts only ``null`` or its neutral value (any
other value is a 400 naming it). Any other field is a 400 too: ``additionalProperties: false``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic.json_schema import models_json_schema

from edgesdk import __version__
from edgesdk.serve.fields import MODELS, request_fields, status_text
from edgesdk.serve.schemas import ApplyTemplateRequest, Body, DetokenizeRequest, TokenizeRequest

OPENAPI_VERSION = "3.1.0"
_LLAMA_BODIES: dict[str, type[Body]] = {m.route: m for m in (TokenizeRequest, DetokenizeRequest, ApplyTemplateRequest)}

_OPERATIONS: dict[tuple[str, str], tuple[str, str, str]] = {
    # (path, method) -> (operationId, summary, tag)
    ("/v1/chat/completions", "post"): (
        "createChatCompletion",
        "Chat with an LLM (GGUF) bundle; `stream: true` answers Server-Sent Events",
        "OpenAI",
    ),
    ("/v1/completions", "post"): (
        "createCompletion",
        "Complete a raw prompt with an LLM (GGUF) bundle; `stream: true` answers Server-Sent Events",
        "OpenAI",
    ),
    ("/v1/embeddings", "post"): ("createEmbedding", "Embed texts or token ids with a text-encoder bundle", "OpenAI"),
    ("/v1/responses", "post"): (
        "createResponse",
        "OpenAI's Responses API over an LLM bundle's chat; `stream: true` answers its Server-Sent Events",
        "OpenAI",
    ),
    ("/v1/models", "get"): ("listModels", "The served models", "OpenAI"),
    ("/v1/models/{model}", "get"): ("retrieveModel", "One served model", "OpenAI"),
    ("/health", "get"): (
        "health",
        "Liveness: ok, or 503 while the models load or the server drains; requests waiting or running per model "
        "(no API key needed)",
        "server",
    ),
    ("/metrics", "get"): ("metrics", "Prometheus text exposition format 0.0.4 (docs/serve.md)", "server"),
    ("/openapi.json", "get"): ("openapi", "This document", "server"),
    ("/tokenize", "post"): (
        "tokenize",
        "llama-server's /tokenize: text -> the model's token ids (or ids and pieces)",
        "llama.cpp",
    ),
    ("/detokenize", "post"): ("detokenize", "llama-server's /detokenize: token ids -> text", "llama.cpp"),
    ("/apply-template", "post"): (
        "applyTemplate",
        "llama-server's /apply-template: chat messages -> the prompt text the model is given (no generation)",
        "llama.cpp",
    ),
    ("/props", "get"): ("props", "llama-server's /props: a model's context, slots and default settings", "llama.cpp"),
    ("/slots", "get"): ("slots", "llama-server's /slots: each slot's state (no prompt text)", "llama.cpp"),
}

_QUERY_MODEL = {
    "name": "model",
    "in": "query",
    "required": False,
    "schema": {"type": "string"},
    "description": "a served GGUF model; optional with one LLM served",
}

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def _template(path: str) -> str:
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def _operation(path: str, method: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    op_id, summary, tag = _OPERATIONS.get(
        (path, method), (f"{method}_{path.strip('/').replace('/', '_')}", f"{method.upper()} {path}", "server")
    )
    errors = {
        code: {"description": why, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for code, why in (
            ("400", "a bad request; `param` names the field"),
            ("401", "the API key is missing or wrong (`serve --api-key`)"),
            ("404", "an unknown model"),
            ("429", "the model's queue is full (Retry-After)"),
            ("503", "the server is draining (Retry-After)"),
        )
    }
    op: dict[str, Any] = {"operationId": op_id, "summary": summary, "tags": [tag]}
    if path == "/metrics":
        op["responses"] = {
            "200": {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}}
        }
    elif path in fields:
        op["requestBody"] = _body(path)
        ok: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
        if path != "/v1/embeddings":
            ok["text/event-stream"] = {"schema": {"type": "string"}}
        op["responses"] = {"200": {"description": "the OpenAI response object", "content": ok}, **errors}
    elif path in _LLAMA_BODIES:
        op["requestBody"] = _body(path)
        op["responses"] = {
            "200": {"description": "llama-server's answer", "content": {"application/json": {"schema": {}}}},
            **{k: errors[k] for k in ("400", "401", "404")},
        }
    else:
        shape = {"type": "array"} if path == "/slots" else {"type": "object"}
        op["responses"] = {"200": {"description": "OK", "content": {"application/json": {"schema": shape}}}}
        if path in ("/props", "/slots"):
            op["parameters"] = [_QUERY_MODEL]
            op["responses"].update({k: errors[k] for k in ("400", "401", "404")})
        if path == "/slots":
            op["parameters"].append(
                {
                    "name": "fail_on_no_slot",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "enum": ["0", "1"]},
                }
            )
            op["responses"]["503"] = {
                "description": "fail_on_no_slot=1 and every slot is busy",
                **{"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
            }
        if path == "/health":
            op["responses"]["503"] = {
                "description": 'loading (`{"status": "loading"}`, while the models load) or draining',
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        elif path == "/v1/models/{model}":
            op["responses"]["404"] = errors["404"]
    if path == "/v1/models/{model}":
        op["parameters"] = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
    if path == "/health":
        op["security"] = []  # no API key needed
    return op


def _model(path: str) -> type[Body]:
    return MODELS.get(path) or _LLAMA_BODIES[path]


def _body(path: str) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{_model(path).__name__}"}
    return {"required": True, "content": {"application/json": {"schema": ref}}}


def schemas(bodies: Iterable[type[Body]]) -> dict[str, Any]:
    """The JSON Schemas of the request models ``bodies`` and of what they hold (``#/components/schemas/NAME``),
    each field's description its status and note."""
    bodies = list(bodies)
    _, found = models_json_schema([(m, "validation") for m in bodies], ref_template="#/components/schemas/{model}")
    defs = found.get("$defs", {})
    for m in bodies:
        props = defs[m.__name__]["properties"]
        for f in request_fields(m):
            props[f.name]["description"] = f"{status_text(f)}: {f.note}"
    return defs


def openapi_document(routes: Iterable[tuple[str, Iterable[str]]], fields: Mapping[str, Any] = MODELS) -> dict:
    """The OpenAPI 3.1 document of ``routes`` ((path, methods) pairs, Starlette path syntax allowed); the OpenAI
    routes among ``fields``' keys (:data:`~edgesdk.serve.fields.REQUEST_FIELDS` or
    :data:`~edgesdk.serve.fields.MODELS`) take their request models' schemas, as llama-server's do."""
    paths: dict[str, dict[str, Any]] = {}
    for path, methods in routes:
        template = _template(path)
        for method in sorted(m.lower() for m in methods if m.upper() != "HEAD"):
            paths.setdefault(template, {})[method] = _operation(template, method, fields)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "edgesdk serve",
            "version": __version__,
            "description": "OpenAI-compatible API over edgesdk bundles (docs/serve.md). Every field of a "
            "request body is implemented or answered with 400 naming it.",
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR, **schemas([*(MODELS[r] for r in fields), *_LLAMA_BODIES.values()])},
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "when the server was started with --api-key (or EDGESDK_API_KEY)",
                }
            },
        },
        "security": [{"apiKey": []}, {}],
    }
