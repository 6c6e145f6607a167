# SPDX-License-Identifier: Apache-2.0
"""The server's OpenAPI 3.1 document (``GET /openapi.json``), generated from the routes the app serves and the
request-field table (:data:`edgesdk.serve.fields.REQUEST_FIELDS`), so it cannot drift from what the server does.

Every field a route knows is a property of its request body: ``description`` says ``implemented`` or
``refused (400)`` (with the value that asks for nothing, when there is one) and the note of the table, and
``x-edgesdk-status`` says the same for machines. An implemented field has its JSON Schema type; a refused one
accepts only ``null`` or its neutral value (any other value is a 400 naming it). Any other field is a 400 too:
``additionalProperties: false``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from edgesdk import __version__
from edgesdk.serve.fields import PROMPT_CACHE_RETENTIONS, REASONING_EFFORTS, VERBOSITIES

OPENAPI_VERSION = "3.1.0"

_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_STRINGS = {"type": "array", "items": {"type": "string"}, "minItems": 1}

# JSON Schema of each implemented field (None: any route; else the route's own).
_TYPES: dict[str, dict[str | None, dict[str, Any]]] = {
    "model": {None: {"type": "string", "minLength": 1}},
    "max_tokens": {None: {"type": "integer", "minimum": 1}},
    "max_completion_tokens": {None: {"type": "integer", "minimum": 1}},
    "temperature": {None: {"type": "number", "minimum": 0, "maximum": 2}},
    "top_p": {None: {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
    "seed": {None: {"type": "integer", "minimum": 0}},
    "stop": {None: {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 16}]}},
    "stream": {None: {"type": "boolean"}},
    "stream_options": {
        None: {
            "type": "object",
            "properties": {"include_usage": {"type": "boolean"}, "include_obfuscation": {"type": "boolean"}},
            "additionalProperties": False,
        }
    },
    # accepted and ignored (fields.py): typed all the same
    "metadata": {
        None: {
            "type": "object",
            "maxProperties": 16,
            "propertyNames": {"maxLength": 64},
            "additionalProperties": {"type": "string", "maxLength": 512},
        }
    },
    "prompt_cache_key": {None: {"type": "string"}},
    "safety_identifier": {None: {"type": "string"}},
    "prompt_cache_options": {
        None: {
            "type": "object",
            "properties": {
                "mode": {"type": "string", "enum": ["implicit", "explicit"]},
                "ttl": {"type": "string", "enum": ["30m"]},
            },
            "additionalProperties": False,
        }
    },
    "prompt_cache_retention": {None: {"type": "string", "enum": list(PROMPT_CACHE_RETENTIONS)}},
    "reasoning_effort": {None: {"type": "string", "enum": list(REASONING_EFFORTS)}},
    "verbosity": {None: {"type": "string", "enum": list(VERBOSITIES)}},
    "frequency_penalty": {None: {"type": "number", "minimum": -2, "maximum": 2}},
    "presence_penalty": {None: {"type": "number", "minimum": -2, "maximum": 2}},
    "logit_bias": {
        None: {"type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}
    },
    "n": {None: {"type": "integer", "const": 1}},
    "user": {None: {"type": "string"}},
    "top_k": {None: {"type": "integer", "minimum": 0}},
    "min_p": {None: {"type": "number", "minimum": 0, "maximum": 1}},
    "repeat_penalty": {None: {"type": "number", "exclusiveMinimum": 0}},
    "messages": {
        None: {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"type": "string", "minLength": 1},
                    "content": {
                        "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}, {"type": "null"}]
                    },
                },
            },
        }
    },
    "prompt": {None: {"oneOf": [{"type": "string"}, _STRINGS, _IDS, {"type": "array", "items": _IDS}]}},
    "input": {
        None: {
            "oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
                _IDS,
                {"type": "array", "items": _IDS, "minItems": 1},
            ]
        }
    },
    "encoding_format": {None: {"type": "string", "enum": ["float", "base64"]}},
    "dimensions": {None: {"type": "integer", "minimum": 1}},
    "response_format": {
        None: {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"type": "string", "enum": ["text", "json_object", "json_schema"]}},
        }
    },
    "tools": {None: {"type": "array", "items": {"type": "object"}}},
    "tool_choice": {None: {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}]}},
    "parallel_tool_calls": {None: {"type": "boolean"}},
    "logprobs": {
        "/v1/chat/completions": {"type": "boolean"},
        "/v1/completions": {"type": "integer", "minimum": 0, "maximum": 20},
    },
    "top_logprobs": {None: {"type": "integer", "minimum": 0, "maximum": 20}},
    # the Responses API (serve/responses.py)
    "instructions": {None: {"type": "string"}},
    "max_output_tokens": {None: {"type": "integer", "minimum": 1}},
    "text": {
        None: {
            "type": "object",
            "properties": {
                "format": {
                    "type": "object",
                    "required": ["type"],
                    "properties": {"type": {"type": "string", "enum": ["text", "json_object", "json_schema"]}},
                },
                "verbosity": {"type": "string", "enum": list(VERBOSITIES)},
            },
            "additionalProperties": False,
        }
    },
    "reasoning": {None: {"type": "object"}},
    "store": {None: {"type": "boolean"}},
    "max_tool_calls": {None: {"type": "integer", "minimum": 1}},
}
_TYPES["input"]["/v1/responses"] = {
    "oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "object"}}]
}
_TYPES["stream_options"]["/v1/responses"] = {
    "type": "object",
    "properties": {"include_obfuscation": {"type": "boolean"}},
    "additionalProperties": False,
}
_TYPES["tool_choice"]["/v1/responses"] = {
    "oneOf": [
        {"type": "string", "enum": ["none", "auto", "required"]},
        {
            "type": "object",
            "required": ["type", "name"],
            "properties": {"type": {"const": "function"}, "name": {"type": "string"}},
        },
    ]
}

_REQUIRED = {
    "/v1/chat/completions": ["model", "messages"],
    "/v1/completions": ["model", "prompt"],
    "/v1/embeddings": ["model", "input"],
    "/v1/responses": ["model", "input"],
}

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

_MODEL = {"type": "string", "minLength": 1, "description": "a served GGUF model; optional with one LLM served"}
# Request bodies of llama-server's endpoints (serve/operational.py): every other field is a 400.
_LLAMA_BODIES: dict[str, dict[str, Any]] = {
    "/tokenize": {
        "type": "object",
        "required": ["content"],
        "properties": {
            "model": _MODEL,
            "content": {"type": "string"},
            "add_special": {"type": "boolean", "description": "insert BOS (default false)"},
            "parse_special": {"type": "boolean", "description": "special tokens' text as those tokens (default true)"},
            "with_pieces": {"type": "boolean", "description": "ids with their pieces (default false)"},
        },
        "additionalProperties": False,
    },
    "/detokenize": {
        "type": "object",
        "required": ["tokens"],
        "properties": {"model": _MODEL, "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
        "additionalProperties": False,
    },
    "/apply-template": {
        "type": "object",
        "required": ["messages"],
        "description": "a chat request's fields (ChatCompletionRequest), checked as /v1/chat/completions checks them",
        "properties": {"model": _MODEL, "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}}},
    },
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


def _status(field: Any) -> str:
    if field.status == "implemented":
        return "implemented (llama.cpp extra)" if field.extra else "implemented"
    if field.status == "ignored":
        return "accepted, ignored"
    neutral = " or ".join(json.dumps(n) for n in field.neutral)
    return "refused (400)" + (f" unless null or {neutral}" if neutral else " unless null")


def field_schema(route: str, field: Any) -> dict[str, Any]:
    """One request-body property: its JSON Schema and a description with its status and note."""
    if field.status in ("implemented", "ignored"):
        types = _TYPES.get(field.name, {})
        schema = dict(types.get(route, types.get(None, {})))
    else:
        schema = {"enum": [None, *field.neutral]} if field.neutral else {"type": "null"}
    return {**schema, "description": f"{_status(field)}: {field.note}", "x-edgesdk-status": field.status}


def request_schema(route: str, fields: Sequence[Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": [n for n in _REQUIRED.get(route, []) if n in {f.name for f in fields}],
        "properties": {f.name: field_schema(route, f) for f in fields},
        "additionalProperties": False,
    }


def _template(path: str) -> str:
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def _operation(path: str, method: str, fields: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
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
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{_schema_name(path)}"}}},
        }
        ok: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
        if path != "/v1/embeddings":
            ok["text/event-stream"] = {"schema": {"type": "string"}}
        op["responses"] = {"200": {"description": "the OpenAI response object", "content": ok}, **errors}
    elif path in _LLAMA_BODIES:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _LLAMA_BODIES[path]}}}
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


def _schema_name(route: str) -> str:
    return {
        "/v1/chat/completions": "ChatCompletionRequest",
        "/v1/completions": "CompletionRequest",
        "/v1/embeddings": "EmbeddingRequest",
        "/v1/responses": "ResponseRequest",
    }.get(route, route.strip("/").replace("/", "_") + "_request")


def openapi_document(routes: Iterable[tuple[str, Iterable[str]]], fields: Mapping[str, Sequence[Any]]) -> dict:
    """The OpenAPI 3.1 document of ``routes`` ((path, methods) pairs, Starlette path syntax allowed) whose request
    bodies are ``fields`` (route -> request fields with ``name``, ``status``, ``note``, ``neutral``, ``extra``)."""
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
            "schemas": {"Error": _ERROR, **{_schema_name(r): request_schema(r, f) for r, f in fields.items()}},
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
