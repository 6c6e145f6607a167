# SPDX-License-Identifier: Apache-2.0
"""The request fields ``edgesdk serve`` knows (:data:`REQUEST_FIELDS`), read from the request models
(:mod:`edgesdk.serve.schemas`): each one implemented, ignored, or refused with a 400 naming it. docs/serve.md's
field tables are :func:`fields_markdown`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from edgesdk.serve.protocol import register_field_names
from edgesdk.serve.schemas import (
    MAX_EMBEDDING_INPUTS,
    MAX_METADATA,
    MAX_PROMPTS,
    MAX_STOP_SEQUENCES,
    PROMPT_CACHE_RETENTIONS,
    REASONING_EFFORTS,
    VERBOSITIES,
    Body,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ResponsesRequest,
)


@dataclass(frozen=True)
class RequestField:
    """One field of a request body: ``implemented``; ``ignored`` (accepted, its type checked, with no effect here);
    or ``refused`` (400 naming it) unless its value is one of ``neutral``."""

    name: str
    status: str  # "implemented" | "ignored" | "refused"
    note: str
    neutral: tuple = ()
    extra: bool = False  # not in OpenAI's schema: a llama.cpp server field


def request_fields(model: type[Body]) -> tuple[RequestField, ...]:
    out = []
    for name, f in model.model_fields.items():
        meta = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        neutral = meta.get("x-edgesdk-neutral")
        out.append(
            RequestField(
                name,
                str(meta.get("x-edgesdk-status")),
                f.description or "",
                tuple(neutral) if isinstance(neutral, list) else (),
                meta.get("x-edgesdk-extra") is True,
            )
        )
    return tuple(out)


#: The OpenAI routes' request models, by route.
MODELS: dict[str, type[Body]] = {
    m.route: m for m in (ChatCompletionRequest, CompletionRequest, ResponsesRequest, EmbeddingRequest)
}
#: Every field a route knows; any other field is a 400 naming it.
REQUEST_FIELDS: dict[str, tuple[RequestField, ...]] = {route: request_fields(m) for route, m in MODELS.items()}


def status_text(f: RequestField, markdown: bool = False) -> str:
    """``implemented``, ``accepted, ignored`` or ``refused (400) unless ...`` (the docs' and the OpenAPI's words)."""
    if f.status == "implemented":
        return "implemented (llama.cpp extra)" if f.extra else "implemented"
    if f.status == "ignored":
        return "accepted, ignored"
    if markdown:
        return "refused (400)" + (
            " unless " + " or ".join(f"`{json.dumps(n)}`" for n in f.neutral) if f.neutral else ""
        )
    neutral = " or ".join(json.dumps(n) for n in f.neutral)
    return "refused (400)" + (f" unless null or {neutral}" if neutral else " unless null")


def fields_markdown() -> str:
    """docs/serve.md's request-field tables, made from :data:`REQUEST_FIELDS` (a test checks the docs hold
    exactly this text)."""
    out = []
    order = {"implemented": 0, "ignored": 1, "refused": 2}
    for route, fields in REQUEST_FIELDS.items():
        out += [f"`POST {route}`:", "", "| field | status | notes |", "|---|---|---|"]
        for f in sorted(fields, key=lambda f: (order[f.status], f.extra, f.name)):
            out.append(f"| `{f.name}` | {status_text(f, markdown=True)} | {f.note} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


FIELD_NAMES = frozenset(f.name for fields in REQUEST_FIELDS.values() for f in fields)
register_field_names(FIELD_NAMES)  # the names backend_error may give as an error's param

__all__ = [
    "FIELD_NAMES",
    "MAX_EMBEDDING_INPUTS",
    "MAX_METADATA",
    "MAX_PROMPTS",
    "MAX_STOP_SEQUENCES",
    "PROMPT_CACHE_RETENTIONS",
    "REASONING_EFFORTS",
    "REQUEST_FIELDS",
    "VERBOSITIES",
    "fields_markdown",
]
