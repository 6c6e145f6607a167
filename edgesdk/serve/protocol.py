# SPDX-License-Identifier: Apache-2.0
"""The OpenAI protocol of ``edgesdk serve``, requests side: request bodies read (JSON) and parsed once into their
pydantic models (:mod:`edgesdk.serve.schemas`, by :func:`parse`), and errors in OpenAI's shape (:class:`APIError`:
``{"error": {"message", "type", "param", "code"}}``: pydantic's validation errors and the runtime's exceptions
mapped to one-line messages naming the field). Replies are shaped by :mod:`edgesdk.serve.replies`.

Nothing here knows the HTTP routes' state (models, workers, metrics): that is :mod:`edgesdk.serve.routes`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from edgesdk.errors import EdgeSDKError, InputError, ShapeError
from edgesdk.serve.workers import RequestTimeout, Saturated


# ------------------------------------------------------------------------------ errors
class APIError(Exception):
    """An error answer in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``)."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}},
            status_code=self.status,
            headers=self.headers,
        )


def saturated_error(exc: Saturated) -> APIError:
    """A worker's full queue (429) or shutdown (503), with its Retry-After."""
    if exc.draining:
        return APIError(
            503,
            str(exc),
            "service_unavailable",
            code="server_shutting_down",
            headers={"Retry-After": str(exc.retry_after)},
        )
    return APIError(429, str(exc), "rate_limit_error", code="queue_full", headers={"Retry-After": str(exc.retry_after)})


_FIELD_NAMES: set[str] = set()  # every request field's name: edgesdk.serve.fields registers them (made from the
# request models, which use this module; a registry instead of an import keeps the modules free of a cycle)


def register_field_names(names: Iterable[str]) -> None:
    """Request field names that :func:`backend_error` may name as the ``param`` of a runtime's InputError."""
    _FIELD_NAMES.update(names)


def backend_error(exc: BaseException, prompt_param: str = "messages") -> APIError:
    """An exception of a generation as an APIError; ``prompt_param`` names the input field ("messages" for
    chat, "prompt" for completions)."""
    if isinstance(exc, ShapeError) and "context holds" in str(exc):
        return APIError(400, str(exc), param=prompt_param, code="context_length_exceeded")
    if isinstance(exc, InputError):
        text = str(exc)
        first = re.match(r"[a-z_]+", text)
        name = first.group(0) if first else ""
        param = (
            "prompt"
            if name in ("prompt", "prompt_tokens") and prompt_param == "prompt"
            else name
            if name in _FIELD_NAMES
            else None
        )
        return APIError(400, text, param=param)
    if isinstance(exc, asyncio.CancelledError):
        return APIError(503, "request cancelled", "service_unavailable", code="cancelled")
    if isinstance(exc, RequestTimeout):  # the server's own deadline, not the client's: 504 as a proxy would answer
        return APIError(504, str(exc), "server_error", code="request_timeout")
    if isinstance(exc, EdgeSDKError):
        return APIError(500, exc.one_line(), "server_error")
    return APIError(500, f"{type(exc).__name__}: {exc}", "server_error")


def grammar_error(err: APIError, exc: BaseException, param: str) -> APIError:
    """A request whose grammar llama.cpp refused: a 400 naming the field it came from."""
    if isinstance(exc, InputError) and str(exc).startswith("grammar"):
        err.param = param
    return err


# ------------------------------------------------------------------------------ request parsing
async def read_json(request: Request, limit: int) -> dict:
    # Only application/json: a browser sends text/plain or a form cross-origin without asking first (no
    # CORS preflight), so accepting any type would let every web page start a generation here.
    ctype = request.headers.get("content-type")
    if (ctype or "").partition(";")[0].strip().lower() != "application/json":
        raise APIError(
            415,
            f"Content-Type must be application/json (got {ctype!r})",
            param="Content-Type",
            code="unsupported_media_type",
        )
    length = request.headers.get("content-length")
    if length is not None:
        try:
            if int(length) > limit:
                raise APIError(
                    413, f"request body is {int(length)} bytes; the limit is {limit}", code="request_too_large"
                )
        except ValueError:
            raise APIError(400, "invalid Content-Length header") from None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
    return decode_json(bytes(body))


def decode_json(raw: bytes) -> dict:
    """A request body as its JSON object; anything else is an APIError 400 (never another exception): not
    JSON, nested deeper than the parser goes, an integer of over 4300 digits, a string holding a lone UTF-16
    surrogate (``"\\ud800"``: no text, and it cannot be encoded back into a response)."""
    try:
        data = json.loads(raw or b"null")
    except RecursionError:
        raise APIError(400, "request body is not valid JSON (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"request body is not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object")
    if b"\\u" in raw:  # only an escape can make a lone surrogate (raw UTF-8 ones fail to decode above)
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(
                400, "request body holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair): not text"
            ) from None
        except RecursionError:
            raise APIError(400, "request body is not valid JSON (nested too deeply)") from None
    return data


def show(value: object) -> str:
    """``repr(value)`` cut to one short piece: a 4000-digit number is not echoed whole."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


B = TypeVar("B", bound=BaseModel)  # a request model of edgesdk.serve.schemas


def parse(model: type[B], body: dict) -> B:
    """``body`` as ``model`` (a :class:`~edgesdk.serve.schemas.Body`); an APIError 400 naming the first field
    that is wrong, in one line (never pydantic's own multi-error text)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from None


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{str(part)[:40]}" if out else str(part)[:40]
    return out


def _says(kind: str, ctx: dict, value: Any) -> str:
    """pydantic's error ``kind`` (its ``ctx``, the ``value`` refused) as the end of ``'<field>' ...``."""
    got = f", got {show(value)}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be an integer" + got
    if kind in ("float_type", "float_parsing", "finite_number"):
        return f"must be a{' finite' if kind == 'finite_number' else ''} number" + got
    if kind in ("bool_type", "bool_parsing"):
        return "must be a boolean" + got
    if kind in ("string_type", "list_type", "dict_type", "model_type", "model_attributes_type"):
        what = {"string_type": "a string", "list_type": "a list"}.get(kind, "an object")
        return f"must be {what}" + got
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if kind in bounds:
        limit = next(iter(ctx.values()), "")
        return f"must be {bounds[kind]} {limit}" + got
    if kind in ("too_short", "string_too_short") and ctx.get("min_length") == 1:
        return "must not be empty"
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        most = "at most" if kind.endswith("long") else "at least"
        limit = ctx.get("max_length", ctx.get("min_length"))
        unit = "characters" if kind.startswith("string") else "items"
        return f"must hold {most} {limit} {unit}" + got
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}" + got
    if kind == "missing":
        return "is required"
    return f"is not valid ({kind})" + got


def validation_error(errors: list) -> APIError:
    """The first of pydantic's ``errors`` (an unknown field first) as one APIError 400 naming its field."""
    e = min(errors, key=lambda e: e["type"] != "extra_forbidden")
    param = _path(e["loc"]) or None
    ctx = e.get("ctx") or {}
    if e["type"] == "extra_forbidden":
        return APIError(
            400, f"'{param}' is not a field this server knows here", param=param, code="unsupported_parameter"
        )
    text = e["msg"] if e["type"] == "edgesdk" else _says(e["type"], ctx, e.get("input"))
    return APIError(400, f"'{param}' {text}" if param else text, param=param, code=ctx.get("code"))
