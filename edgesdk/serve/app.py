# SPDX-License-Identifier: Apache-2.0
"""The ASGI application (Starlette): OpenAI-compatible routes over loaded edgesdk sessions.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (LLM bundles; ``"stream": true`` is
Server-Sent Events), ``POST /v1/embeddings`` (text-encoder bundles), ``GET /v1/models``,
``GET /v1/models/{id}``, ``GET /health``, ``GET /metrics`` (Prometheus text), ``GET /openapi.json``
(the OpenAPI 3.1 document, :mod:`edgesdk.serve.openapi`). Errors use OpenAI's
shape ``{"error": {"message", "type", "param", "code"}}``.

Nothing in a request names a file: ``model`` is looked up in the table of bundles given at start-up.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hmac
import ipaddress
import json
import re
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Match, Route

from edgesdk import __version__
from edgesdk.errors import EdgeSDKError, InputError, ShapeError
from edgesdk.runtime import grammar as _grammar
from edgesdk.runtime.requests import (
    INT32_MAX,
    MAX_TOP_LOGPROBS,
    SEED_MAX,
    GenerationRequest,
    check_logit_bias,
    check_tools,
)
from edgesdk.serve.batch_worker import BatchWorker, decide_parallel
from edgesdk.serve.openapi import openapi_document
from edgesdk.serve.workers import EmbeddingBatcher, Job, LLMWorker, Saturated
from edgesdk.telemetry.serve_metrics import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from edgesdk.telemetry.serve_metrics import ServerMetrics
from edgesdk.telemetry.serve_spans import HTTPSpan, ServerSpan, serve_tracer, untraced_patterns

# Documented defaults (docs/serve.md); a bundle's manifest may lower/raise them with a "serve" table.
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB of JSON per request
DEFAULT_MAX_TOKENS_CAP = 2048  # most tokens one request may ask for
DEFAULT_MAX_TOKENS = 256  # when the request gives none
DEFAULT_QUEUE = 16  # LLM requests waiting behind the running one
MAX_EMBEDDING_INPUTS = 2048  # inputs per embeddings request (as OpenAI)
MAX_STOP_SEQUENCES = 16
MAX_PARALLEL = 256  # serve --parallel: sequences per LLM
MAX_PROMPTS = 16  # prompts in one /v1/completions request (one choice each)


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_queue: int = DEFAULT_QUEUE
    max_batch: int = 32
    max_wait_ms: float = 5.0
    max_pending_embeddings: int = 1024
    tracer_provider: Any = None  # None: edgesdk.telemetry's provider when it offers one, else the global one
    prompt_cache_mb: float | None = None  # per LLM; None: the profile's policy.llm.prompt_cache_mb, else off; 0: off
    untraced: tuple[str, ...] | None = None  # URL regexes with no plain HTTP span; None: see untraced_patterns()
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides localhost and IP addresses; "*": any
    cors_origins: tuple[str, ...] = ()  # origins that get CORS answers ("*": any); none: no CORS at all
    parallel: int | None = None  # sequences per LLM decoded together; None: decide_parallel(); 1: one at a time
    prefix_reuse: bool = True  # batched LLMs: a slot keeps its last prompt's KV cells for a request sharing it

    def __post_init__(self) -> None:
        if self.parallel is not None and (isinstance(self.parallel, bool) or not isinstance(self.parallel, int)
                                          or not 1 <= self.parallel <= MAX_PARALLEL):
            raise InputError(f"parallel must be an integer from 1 to {MAX_PARALLEL}, got {self.parallel!r}")
        if self.api_key is not None and (not self.api_key.strip() or self.api_key != self.api_key.strip()):
            raise InputError("the API key is empty or has surrounding whitespace: an empty key would turn "
                             "authentication off (give a key, or leave --api-key and EDGESDK_API_KEY out)")
        self.allowed_hosts = tuple(check_allowed_host(h) for h in self.allowed_hosts)
        self.cors_origins = tuple(check_cors_origin(o) for o in self.cors_origins)


# Host names a browser only sends for this machine (RFC 6761: *.localhost is loopback); IP literals are
# answered too: DNS rebinding needs a name the attacker controls (docs/security.md, "The server").
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$")
_ORIGIN = re.compile(r"^https?://(\[[0-9a-f:.]+\]|[a-z0-9_]([a-z0-9_.-]{0,252}))(:[0-9]{1,5})?$")


def check_allowed_host(value: str) -> str:
    """A ``--allowed-host`` value: a host name or IP address (no port, no scheme), or ``*``; lower case."""
    v = str(value).strip().lower().rstrip(".")
    if v == "*" or _HOST_NAME.match(v) or _ip_literal(v.strip("[]")):
        return v.strip("[]")
    raise InputError(f"--allowed-host {value!r} is not a host name or IP address (no scheme or port; '*' for any)")


def check_cors_origin(value: str) -> str:
    """A ``--cors-origin`` value: ``scheme://host[:port]`` as browsers send it in ``Origin``, or ``*``."""
    v = str(value).strip()
    if v == "*" or _ORIGIN.match(v.lower()):
        return v.lower()
    raise InputError(f"--cors-origin {value!r} is not an origin (scheme://host[:port], http or https, no path; "
                     "'*' for any)")


def _ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_name(header: str | None) -> str | None:
    """The host of a ``Host`` header (port and IPv6 brackets removed, lower case, no trailing dot); None when
    it is missing or malformed."""
    v = (header or "").strip().lower()
    if v.startswith("["):
        end = v.find("]")
        name, port = (v[1:end], v[end + 1:]) if end > 0 else ("", "")
        if not _ip_literal(name):
            return None
        return name if port == "" or re.fullmatch(r":[0-9]{1,5}", port) else None
    name, _, port = v.partition(":")
    if port and not re.fullmatch(r"[0-9]{1,5}", port):
        return None
    name = name.rstrip(".")
    return name if _HOST_NAME.match(name) or _ip_literal(name) else None


def host_allowed(name: str, allowed: tuple[str, ...]) -> bool:
    return (name == "localhost" or name.endswith(".localhost") or _ip_literal(name) or name in allowed
            or "*" in allowed)


@dataclass
class ModelEntry:
    """A bundle served under ``name``: ``kind`` is "llm" (GGUF) or "embedding" (text encoder)."""

    name: str
    session: Any
    kind: str
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    created: int = field(default_factory=lambda: int(time.time()))
    worker: LLMWorker | BatchWorker | None = None
    batcher: EmbeddingBatcher | None = None
    prompt_cache: Any = None  # edgesdk.serve.prompt_cache.PromptCache when enabled
    parallel: int | None = None  # LLMs: sequences decoded together (set at start: ServeConfig / decide_parallel)
    parallel_reason: str = ""
    images: Any = None  # a VLM's edgesdk.serve.images.ImagePolicy (image_url parts); None: text only

    @property
    def provider(self) -> str:
        return str(getattr(getattr(self.session, "backend", None), "provider", "edgesdk"))


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.type, "param": self.param,
                                       "code": self.code}}, status_code=self.status, headers=self.headers)


def _saturated(exc: Saturated) -> APIError:
    if exc.draining:
        return APIError(503, str(exc), "service_unavailable", code="server_shutting_down",
                        headers={"Retry-After": str(exc.retry_after)})
    return APIError(429, str(exc), "rate_limit_error", code="queue_full", headers={"Retry-After": str(exc.retry_after)})


def _from_backend(exc: BaseException, prompt_param: str = "messages") -> APIError:
    """An exception of a generation as an APIError; ``prompt_param`` names the input field ("messages" for
    chat, "prompt" for completions)."""
    if isinstance(exc, ShapeError) and "context holds" in str(exc):
        return APIError(400, str(exc), param=prompt_param, code="context_length_exceeded")
    if isinstance(exc, InputError):
        text = str(exc)
        first = re.match(r"[a-z_]+", text)
        name = first.group(0) if first else ""
        param = ("prompt" if name in ("prompt", "prompt_tokens") and prompt_param == "prompt"
                 else name if name in _FIELD_NAMES else None)
        return APIError(400, text, param=param)
    if isinstance(exc, asyncio.CancelledError):
        return APIError(503, "request cancelled", "service_unavailable", code="cancelled")
    if isinstance(exc, EdgeSDKError):
        return APIError(500, exc.one_line(), "server_error")
    return APIError(500, f"{type(exc).__name__}: {exc}", "server_error")


# ------------------------------------------------------------------------------ request parsing
async def _read_json(request: Request, limit: int) -> dict:
    # Only application/json: a browser sends text/plain or a form cross-origin without asking first (no
    # CORS preflight), so accepting any type would let every web page start a generation here.
    ctype = request.headers.get("content-type")
    if (ctype or "").partition(";")[0].strip().lower() != "application/json":
        raise APIError(415, f"Content-Type must be application/json (got {ctype!r})", param="Content-Type",
                       code="unsupported_media_type")
    length = request.headers.get("content-length")
    if length is not None:
        try:
            if int(length) > limit:
                raise APIError(413, f"request body is {int(length)} bytes; the limit is {limit}",
                               code="request_too_large")
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
            raise APIError(400, "request body holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without "
                           "its pair): not text") from None
        except RecursionError:
            raise APIError(400, "request body is not valid JSON (nested too deeply)") from None
    return data


def _show(value: object) -> str:
    """``repr(value)`` cut to one short piece: a 4000-digit number is not echoed whole."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


async def _until_disconnected(receive, job: Job) -> None:
    """Wait for the ASGI ``http.disconnect`` of a request whose body has been read, then cancel ``job``
    (the worker checks between tokens; a queued job is skipped) and wake the handler waiting on it."""
    while (await receive())["type"] != "http.disconnect":
        pass
    job.cancel.set()
    job.events.put_nowait(("disconnected", None))


def _number(body: dict, key: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi or (lo_open and v == lo):
        where = f"{'above' if lo_open else 'between'} {lo} and {'at most ' if lo_open else ''}{hi}"
        raise APIError(400, f"'{key}' must be a number {where}, got {_show(v)}", param=key)
    return float(v)


def _integer(body: dict, key: str, lo: int | None = None, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise APIError(400, f"'{key}' must be an integer, got {_show(v)}", param=key)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise APIError(400, f"'{key}' must be between {lo} and {hi}, got {_show(v)}", param=key)
    return v


# ------------------------------------------------------------------------------ the request fields
@dataclass(frozen=True)
class RequestField:
    """One field of a generation request body: ``implemented``, or ``refused`` (400 naming it) unless its
    value is one of ``neutral`` (the value that asks for nothing: ``logprobs: false``, ``n: 1``)."""

    name: str
    status: str  # "implemented" | "refused"
    note: str
    neutral: tuple = ()
    extra: bool = False  # not in OpenAI's schema: a llama.cpp server field


def _f(name: str, note: str, *, extra: bool = False) -> RequestField:
    return RequestField(name, "implemented", note, extra=extra)


def _r(name: str, note: str, *neutral: Any) -> RequestField:
    return RequestField(name, "refused", note, tuple(neutral))


_COMMON = (
    _f("model", "a served model name (GET /v1/models)"),
    _f("max_tokens", "1 to the model's cap (default 256; cap 2048 or the context, whichever is smaller)"),
    _f("temperature", "0 to 2; 0 is greedy"),
    _f("top_p", "above 0, at most 1"),
    _f("seed", f"0 to {SEED_MAX}"),
    _f("stop", f"a string or a list of at most {MAX_STOP_SEQUENCES} strings"),
    _f("stream", "Server-Sent Events"),
    _f("stream_options", "include_usage only"),
    _f("frequency_penalty", "-2 to 2 (llama.cpp penalties sampler, last 64 generated tokens)"),
    _f("presence_penalty", "-2 to 2 (llama.cpp penalties sampler, last 64 generated tokens)"),
    _f("logit_bias", "token id -> bias, -100 to 100 (llama.cpp logit-bias sampler)"),
    _f("n", "1 only (one choice per request); other values 400"),
    _f("user", "an end-user id (a string); it does not change the output"),
    _f("top_k", "llama.cpp extra: 0 (off) or more", extra=True),
    _f("min_p", "llama.cpp extra: 0 to 1", extra=True),
    _f("repeat_penalty", "llama.cpp extra: above 0 (1 is off)", extra=True),
)

#: Every field a generation route knows: OpenAI's chat.completions / completions request fields and the
#: llama.cpp server extras implemented here. Any other field is a 400 naming it; a refused field is a
#: 400 naming it unless its value is null or neutral. docs/serve.md's field table is generated from this.
REQUEST_FIELDS: dict[str, tuple[RequestField, ...]] = {
    "/v1/chat/completions": (
        _f("messages", "role and text content (a string or text parts; `image_url` parts for VLM bundles: data "
                       "URLs, see Images); assistant `tool_calls`, tool `tool_call_id` and `name`; any other "
                       "message field (audio, ...): 400 naming it"),
        *_COMMON,
        _f("max_completion_tokens", "as max_tokens (wins when both are given)"),
        _f("response_format", "`text`, `json_object`, `json_schema` (`json_schema.schema`): a llama.cpp grammar "
                              "from the schema constrains every token (continuous batching only)"),
        _f("tools", "function tools: rendered by the chat template (or a system turn when it ignores tools); "
                    "the reply is grammar-constrained to a call (continuous batching only)"),
        _f("tool_choice", "`none`, `auto` (a call or text), `required`, or a named function"),
        _f("parallel_tool_calls", "a boolean; at most one call per reply either way"),
        _r("functions", "function calling (deprecated) is not implemented", []),
        _r("function_call", "function calling (deprecated) is not implemented", "none"),
        _f("logprobs", "per-token log-softmax of the raw logits (before sampling changes them; continuous "
                       "batching only)"),
        _f("top_logprobs", f"0 to {MAX_TOP_LOGPROBS} most likely tokens per position (needs `logprobs: true`)"),
        _r("modalities", "text output only", ["text"]),
        _r("audio", "audio output is not implemented"),
        _r("prediction", "predicted outputs are not implemented"),
        _r("reasoning_effort", "no reasoning models are served"),
        _r("verbosity", "no verbosity control"),
        _r("web_search_options", "the server is offline by design"),
        _r("store", "completions are not stored", False),
        _r("metadata", "completions are not stored, so there is nothing to tag", {}),
        _r("service_tier", "one service tier", "auto", "default"),
        _r("prompt_cache_key", "no keyed prompt cache (the prompt cache is keyed by the prompt itself)"),
        _r("safety_identifier", "no abuse monitoring here"),
    ),
    "/v1/completions": (
        _f("prompt", "a string, token ids (a list of integers), or a list of up to 16 strings or token-id lists "
                     "(one choice per prompt, `index` in order)"),
        *_COMMON,
        _r("echo", "echoing the prompt is not implemented", False),
        _f("logprobs", f"0 to {MAX_TOP_LOGPROBS}: per-token log-softmax of the raw logits and that many most likely "
                       "tokens (continuous batching only)"),
        _r("best_of", "one completion per request", 1),
        _r("suffix", "insertion (fill-in-the-middle) is not implemented", ""),
    ),
    "/v1/embeddings": (
        _f("model", "a served text-embedding model name (GET /v1/models)"),
        _f("input", f"a string, a list of strings, token ids (a list of integers) or a list of token-id lists; at "
                    f"most {MAX_EMBEDDING_INPUTS} inputs, none empty. Token ids are the model's own vocabulary "
                    "(its tokenizer.json; an id outside it: 400) and are the encoder's input as given (a BERT "
                    "model's [CLS] ... [SEP] included); text and token ids longer than the model's max length are "
                    "truncated alike"),
        _f("encoding_format", "`float` or `base64`"),
        _f("dimensions", "the model's dimension only (no truncation); other values 400"),
        _f("user", "an end-user id (a string); it does not change the output"),
    ),
}


def fields_markdown() -> str:
    """docs/serve.md's request-field tables, made from :data:`REQUEST_FIELDS` (a test checks the docs hold
    exactly this text)."""
    out = []
    for route, fields in REQUEST_FIELDS.items():
        out += [f"`POST {route}`:", "", "| field | status | notes |", "|---|---|---|"]
        for f in sorted(fields, key=lambda f: (f.status != "implemented", f.extra, f.name)):
            if f.status == "implemented":
                status = "implemented (llama.cpp extra)" if f.extra else "implemented"
            else:
                status = "refused (400)" + (" unless " + " or ".join(f"`{json.dumps(n)}`" for n in f.neutral)
                                            if f.neutral else "")
            out.append(f"| `{f.name}` | {status} | {f.note} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


_FIELD_NAMES = frozenset(f.name for fields in REQUEST_FIELDS.values() for f in fields)


def _same(a: object, b: object) -> bool:
    """``a == b`` with types kept apart (``False`` is not ``0``)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def check_fields(body: dict, route: str) -> None:
    """An APIError 400 naming the first field of ``body`` that ``route`` does not know, or a refused field
    with a value other than null or its neutral one."""
    known = {f.name: f for f in REQUEST_FIELDS[route]}
    for key, value in body.items():
        f = known.get(key)
        if f is None:
            raise APIError(400, f"unknown field {_show(key)}: not a field of {route} that this server knows "
                           f"(OpenAI's request fields and the llama.cpp extras top_k, min_p, repeat_penalty; "
                           f"docs/serve.md lists them)", param=str(key), code="unsupported_parameter")
        if value is None or f.status == "implemented" or any(_same(value, n) for n in f.neutral):
            continue
        allowed = " or ".join(json.dumps(n) for n in (None, *f.neutral))
        raise APIError(400, f"'{key}' is not supported by this server: {f.note} (accepted: {allowed})",
                       param=key, code="unsupported_parameter")


def _generation_options(body: dict, entry: ModelEntry) -> dict:
    n = _integer(body, "n", 1)
    if n not in (None, 1):
        raise APIError(400, "only n=1 is supported", param="n")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key, 1)
    if max_tokens is not None and max_tokens > entry.max_tokens_cap:
        raise APIError(400, f"'{key}' is {_show(max_tokens)}; this server allows at most {entry.max_tokens_cap} "
                       f"for {entry.name!r}", param=key)
    opts: dict = {"max_tokens": max_tokens or entry.default_max_tokens}
    for name, lo, hi, lo_open in (("temperature", 0.0, 2.0, False), ("top_p", 0.0, 1.0, True),
                                  ("min_p", 0.0, 1.0, False), ("frequency_penalty", -2.0, 2.0, False),
                                  ("presence_penalty", -2.0, 2.0, False)):
        value = _number(body, name, lo, hi, lo_open=lo_open)  # top_p: the runtime's rule 0 < top_p <= 1
        if value is not None:
            opts[name] = value
    repeat = body.get("repeat_penalty")
    if repeat is not None:
        if isinstance(repeat, bool) or not isinstance(repeat, int | float) or not 0 < repeat <= 1e6:
            raise APIError(400, f"'repeat_penalty' must be a number above 0 (1 is off), got {_show(repeat)}",
                           param="repeat_penalty")
        opts["repeat_penalty"] = float(repeat)
    top_k = _integer(body, "top_k", 0, INT32_MAX)
    if top_k is not None:
        opts["top_k"] = top_k
    seed = _integer(body, "seed", 0, SEED_MAX)
    if seed is not None:
        opts["seed"] = seed
    bias = body.get("logit_bias")
    if bias is not None:
        try:
            opts["logit_bias"] = dict(check_logit_bias(bias)) or None
        except InputError as exc:
            raise APIError(400, str(exc), param="logit_bias") from None
        if opts["logit_bias"] is None:
            del opts["logit_bias"]
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) \
                or len(stops) > MAX_STOP_SEQUENCES:
            raise APIError(400, f"'stop' must be a string or a list of at most {MAX_STOP_SEQUENCES} strings",
                           param="stop")
        if stops:
            opts["stop"] = stops
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, "'stream' must be a boolean", param="stream")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise APIError(400, "'user' must be a string", param="user")
    return opts


def _structured(body: dict, operation: str) -> dict:
    """``response_format``, ``tools``/``tool_choice`` and ``logprobs`` -> GenerationRequest options (grammar,
    tools, tool_choice, logprobs); an APIError 400 naming the field otherwise."""
    opts: dict = {}
    if operation != "chat":
        lp = _integer(body, "logprobs", 0, MAX_TOP_LOGPROBS)
        if lp is not None:
            opts["logprobs"] = lp
        return opts
    lp_on = body.get("logprobs")
    if lp_on is not None and not isinstance(lp_on, bool):
        raise APIError(400, f"'logprobs' must be a boolean, got {_show(lp_on)}", param="logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not lp_on:
        raise APIError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    if lp_on:
        opts["logprobs"] = top or 0
    tools_in, choice = body.get("tools"), body.get("tool_choice")
    try:
        tools = check_tools(tools_in if tools_in != [] else None)
    except InputError as exc:
        raise APIError(400, str(exc), param="tools") from None
    names = [t["function"]["name"] for t in tools]
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or name not in names:
            raise APIError(400, f"'tool_choice' must name one of the tools ({', '.join(names) or 'none given'}), "
                           f"got {_show(choice)}", param="tool_choice")
        choice = name
    elif choice is None:
        choice = "auto" if tools else "none"
    elif choice not in ("none", "auto", "required"):
        raise APIError(400, f"'tool_choice' must be 'none', 'auto', 'required' or "
                       f"{{'type': 'function', 'function': {{'name': ...}}}}, got {_show(choice)}", param="tool_choice")
    if choice != "none" and not tools:
        raise APIError(400, f"'tool_choice' {choice!r} needs 'tools'", param="tool_choice")
    ptc = body.get("parallel_tool_calls")
    if ptc is not None and not isinstance(ptc, bool):
        raise APIError(400, "'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
    fmt = body.get("response_format")
    schema_grammar = None
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        try:
            if kind == "json_object":
                schema_grammar = _grammar.json_object_grammar()
            elif kind == "json_schema":
                spec = fmt.get("json_schema")
                schema = spec.get("schema") if isinstance(spec, dict) else None
                if not isinstance(schema, dict):
                    raise InputError("response_format.json_schema.schema must be a JSON Schema object")
                schema_grammar = _grammar.json_schema_grammar(schema, "response_format.json_schema.schema")
            elif kind != "text":
                raise InputError(f"response_format.type must be 'text', 'json_object' or 'json_schema', "
                                 f"got {_show(kind)}")
        except InputError as exc:
            raise APIError(400, str(exc), param="response_format") from None
    if tools and choice != "none":
        if schema_grammar is not None:
            raise APIError(400, "'response_format' cannot be combined with tools (unless tool_choice is 'none'): "
                           "the reply is a tool call or text", param="response_format")
        try:
            opts["grammar"] = _grammar.tool_grammar(tools, choice)
        except InputError as exc:
            raise APIError(400, str(exc), param="tools") from None
        opts["tools"], opts["tool_choice"] = list(tools), choice
    elif schema_grammar is not None:
        opts["grammar"] = schema_grammar
    return opts


def _prompt(body: dict) -> str | list[int] | tuple[str | list[int], ...]:
    """A completions ``prompt``: text, or token ids (a list of integers, or a list of one such list); several
    prompts (a list of strings or of token-id lists, at most :data:`MAX_PROMPTS`) as a tuple of them."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = next((t for t in prompt if not 0 <= t <= INT32_MAX), None)
        if bad is not None:
            raise APIError(400, f"'prompt' token ids must be from 0 to {INT32_MAX}, got {_show(bad)}", param="prompt")
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise APIError(400, f"'prompt' holds {len(prompt)} prompts; the limit is {MAX_PROMPTS} per request",
                           param="prompt")
        return tuple(_prompt({"prompt": p}) for p in prompt)  # type: ignore[misc]  # one each: never a tuple
    raise APIError(400, "'prompt' must be a string, token ids (a non-empty list of integers), or a list of "
                   f"up to {MAX_PROMPTS} strings or token-id lists", param="prompt")


def parse_generation(body: dict, entry: ModelEntry, operation: str) -> tuple[
        dict, bool, bool, list[dict] | str | list[int] | tuple[str | list[int], ...]]:
    """A chat (``operation="chat"``) or completions body -> (generation options, stream, include_usage,
    messages, prompt text or prompt token ids). Anything the model cannot take is an APIError 400 naming
    the field: every field is checked against :data:`REQUEST_FIELDS`."""
    check_fields(body, "/v1/chat/completions" if operation == "chat" else "/v1/completions")
    opts = _generation_options(body, entry)
    stream = body.get("stream", False) is True
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise APIError(400, "'stream_options' must be an object", param="stream_options")
    for key in stream_options or {}:
        if key != "include_usage":
            raise APIError(400, f"'stream_options.{key}' is not supported (include_usage only)",
                           param=f"stream_options.{key}", code="unsupported_parameter")
    include = (stream_options or {}).get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise APIError(400, "'stream_options.include_usage' must be a boolean", param="stream_options")
    opts.update(_structured(body, operation))
    if operation == "chat":
        return opts, stream, stream and bool(include), _messages(body, entry)
    return opts, stream, stream and bool(include), _prompt(body)


def _token_ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def parse_embeddings(body: dict) -> tuple[list[str | list[int]], str, int | None]:
    """An embeddings body -> (inputs: texts or token-id lists, encoding format, dimensions); an APIError 400
    naming the field otherwise. Every field is checked against :data:`REQUEST_FIELDS`; token ids are checked
    against the model's vocabulary by the route (:meth:`Session.count_tokens`)."""
    check_fields(body, "/v1/embeddings")
    inputs = body.get("input")
    if isinstance(inputs, str) or (_token_ids(inputs) and inputs):
        inputs = [inputs]  # one text, or one input's token ids
    if not isinstance(inputs, list) or not inputs:
        raise APIError(400, "'input' must be a non-empty string, list of strings, list of token ids, or list of "
                       "token-id lists", param="input")
    texts = all(isinstance(t, str) for t in inputs)
    if not texts and not all(_token_ids(t) for t in inputs):
        raise APIError(400, "'input' must be a list of strings or a list of token-id lists (lists of integers), "
                       "not a mix or other values", param="input")
    if any(not t for t in inputs):
        raise APIError(400, f"'input' must not contain empty {'strings' if texts else 'token-id lists'}",
                       param="input")
    if not texts:
        bad = next((t for ids in inputs for t in ids if not 0 <= t <= INT32_MAX), None)
        if bad is not None:
            raise APIError(400, f"'input' token ids must be from 0 to the model's vocabulary size, got {_show(bad)}",
                           param="input")
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise APIError(400, f"'input' holds {len(inputs)} items; the limit is {MAX_EMBEDDING_INPUTS}",
                       param="input")
    fmt = body.get("encoding_format")
    if fmt is None:
        fmt = "float"
    elif fmt not in ("float", "base64"):
        raise APIError(400, "'encoding_format' must be 'float' or 'base64'", param="encoding_format")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise APIError(400, "'user' must be a string", param="user")
    return inputs, fmt, _integer(body, "dimensions", 1)


def _messages(body: dict, entry: ModelEntry | None = None) -> list[dict]:
    """Chat messages with text content; a VLM entry's messages keep their parts, image_url parts decoded
    (edgesdk.serve.images: data URLs, local files under --allow-local-images, size limits; else 400 naming them)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
            raise APIError(400, f"messages[{i}] must be an object with a 'role'", param=f"messages[{i}]")
        for key, value in m.items():  # audio, refusal, function_call, ...: not passed to the template
            if key not in ("role", "content", *_TOOL_KEYS.get(m["role"], ())) and value not in (None, [], ""):
                raise APIError(400, f"messages[{i}].{key[:40]}: only 'role' and 'content' (and an assistant's "
                               "'tool_calls', a tool's 'tool_call_id' and 'name') are supported in a message",
                               param=f"messages[{i}].{key[:40]}", code="unsupported_parameter")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text, and image_url for a VLM
            texts, parts = [], []
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "image_url":
                    from edgesdk.serve.images import ImageError, image_part

                    try:
                        parts.append(image_part(part, f"messages[{i}].content[{j}]",
                                                entry.images if entry is not None else None,
                                                entry.name if entry is not None else ""))
                    except ImageError as exc:
                        raise APIError(400, str(exc), param=exc.param) from None
                    continue
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"messages[{i}].content: only text parts are supported"
                                   + (" besides image_url" if entry is not None and entry.images else ""),
                                   param=f"messages[{i}].content")
                texts.append(part["text"])
                parts.append({"type": "text", "text": part["text"]})
            content = parts if entry is not None and entry.images is not None else "".join(texts)
        if content is None:
            content = ""
        if not isinstance(content, str | list):
            raise APIError(400, f"messages[{i}].content must be a string or a list of text parts",
                           param=f"messages[{i}].content")
        msg = {"role": m["role"], "content": content}
        msg.update({k: m[k] for k in _TOOL_KEYS.get(m["role"], ()) if m.get(k) not in (None, [], "")})
        out.append(msg)
    return out


_TOOL_KEYS = {"assistant": ("tool_calls",), "tool": ("tool_call_id", "name")}


# ------------------------------------------------------------------------------ spans
# The SERVER spans live in telemetry/ (the one place that imports OpenTelemetry); these names stay importable here.
_HTTPSpan = HTTPSpan
_Span = ServerSpan


def prompt_cache_mb(session, configured: float | None) -> float:
    """The prompt cache budget in MiB: ``configured`` when given, else the session's profile
    ``policy.llm.prompt_cache_mb``, else 0 (off)."""
    if configured is not None:
        return max(0.0, float(configured))
    profile = getattr(session, "profile", None)
    llm = ((getattr(profile, "policy", None) or {}).get("llm") or {}) if profile is not None else {}
    value = llm.get("prompt_cache_mb") if isinstance(llm, dict) else None
    return max(0.0, float(value)) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def llm_parallel(session, requested: int | None) -> tuple[int, str]:
    """Sequences to decode together for an LLM session, and why: :func:`decide_parallel` for a llama.cpp
    backend; 1 (one request at a time) for a backend without continuous batching."""
    if requested == 1:
        return 1, "1 (--parallel 1: one request at a time)"
    if not hasattr(getattr(session, "backend", None), "batch_engine"):
        return 1, "1 (this backend has no continuous batching: one request at a time)"
    return decide_parallel(session, requested)


# ------------------------------------------------------------------------------ the app
class _Server:
    def __init__(self, entries: list[ModelEntry], config: ServeConfig):
        self.models = {e.name: e for e in entries}
        self.config = config
        self.metrics = ServerMetrics()
        self.openapi_doc: dict = {}  # create_app sets it from the routes and REQUEST_FIELDS
        for e in entries:
            self.metrics.model(e.name, e.provider)
        self.draining = False
        self.tracer = serve_tracer(config.tracer_provider)
        self.untraced = untraced_patterns(config.untraced)
        self._api_key = config.api_key.encode("utf-8") if config.api_key else None
        bind = config.host.strip().lower().rstrip(".")  # a server bound to a name answers to it
        self.allowed_hosts = config.allowed_hosts + ((bind,) if _HOST_NAME.match(bind) else ())

    # -- lifecycle
    def start(self) -> None:
        for e in self.models.values():
            if e.kind == "llm" and e.worker is None:
                if e.parallel is None:
                    e.parallel, e.parallel_reason = llm_parallel(e.session, self.config.parallel)
                self.metrics.slots.set(e.parallel, model=e.name)
                if e.parallel > 1:
                    batch = BatchWorker(e.name, e.session, slots=e.parallel, max_queue=self.config.max_queue,
                                        reuse_prefix=self.config.prefix_reuse, reason=e.parallel_reason)
                    e.worker = batch
                    self.metrics.queue_depth.set_function(functools.partial(getattr, batch, "depth"), model=e.name)
                    self.metrics.slots_busy.set_function(functools.partial(getattr, batch, "busy"), model=e.name)
                    continue
                mb = prompt_cache_mb(e.session, self.config.prompt_cache_mb)
                backend = getattr(e.session, "backend", None)
                if e.prompt_cache is None and mb > 0 and backend is not None and hasattr(backend, "prompt_cache"):
                    from edgesdk.serve.prompt_cache import PromptCache

                    e.prompt_cache = backend.prompt_cache = PromptCache(int(mb * (1 << 20)))
                e.worker = LLMWorker(e.name, e.session, self.config.max_queue,
                                     on_depth=functools.partial(self.metrics.queue_depth.set, model=e.name))
            elif e.kind == "embedding" and e.batcher is None:
                e.batcher = EmbeddingBatcher(e.name, e.session, max_batch=self.config.max_batch,
                                             max_wait_ms=self.config.max_wait_ms,
                                             max_pending=self.config.max_pending_embeddings,
                                             on_batch=functools.partial(self.metrics.batch_size.observe, model=e.name))

    async def stop(self, timeout_s: float = 10.0) -> None:
        self.draining = True
        for e in self.models.values():
            if e.worker is not None:
                await asyncio.get_running_loop().run_in_executor(None, e.worker.close, timeout_s)
            if e.batcher is not None:
                await e.batcher.close()
        from edgesdk import telemetry

        telemetry.force_flush()
        flush = getattr(self.config.tracer_provider, "force_flush", None)
        if callable(flush):
            flush()

    # -- helpers
    def authorized(self, headers: dict) -> bool:
        if self._api_key is None:
            return True
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else ""
        return hmac.compare_digest(given.encode("utf-8"), self._api_key)

    def entry(self, body: dict, kind: str) -> ModelEntry:
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise APIError(400, "'model' is required (GET /v1/models lists them)", param="model")
        entry = self.models.get(name)
        if entry is None:
            raise APIError(404, f"The model '{name}' does not exist (served: {', '.join(sorted(self.models))})",
                           param="model", code="model_not_found")
        if entry.kind != kind:
            want = "an LLM (GGUF) bundle" if kind == "llm" else "a text-embedding bundle"
            raise APIError(400, f"model {name!r} is a {entry.kind} bundle; this endpoint needs {want}", param="model")
        return entry

    def _provider(self, kind: str) -> str:
        found = {e.provider for e in self.models.values() if e.kind == kind}
        return found.pop() if len(found) == 1 else "edgesdk"

    def _count(self, route: str, model: str, status: int) -> None:
        self.metrics.requests.inc(route=route, model=model, status=str(status))

    # -- routes
    async def health(self, request: Request) -> Response:
        depth = {n: (e.worker.depth if e.worker else e.batcher.depth if e.batcher else 0)
                 for n, e in self.models.items()}
        status = 503 if self.draining else 200
        return JSONResponse({"status": "draining" if self.draining else "ok", "models": depth}, status_code=status)

    async def prom(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(self.openapi_doc)

    async def list_models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card(e) for e in self.models.values()]})

    async def get_model(self, request: Request) -> Response:
        e = self.models.get(request.path_params["model"])
        if e is None:
            return APIError(404, f"The model '{request.path_params['model']}' does not exist", param="model",
                            code="model_not_found").response()
        return JSONResponse(self._model_card(e))

    @staticmethod
    def _model_card(e: ModelEntry) -> dict:
        return {"id": e.name, "object": "model", "created": e.created, "owned_by": "edgesdk",
                "edgesdk": {"kind": e.kind, "backend": e.provider}}

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat", "/v1/chat/completions")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "text_completion", "/v1/completions")

    async def _generate(self, request: Request, operation: str, route: str) -> Response:
        t0 = time.perf_counter()
        model = ""
        span = _Span(self.tracer, request, operation, route, self._provider("llm"))
        try:
            body = await _read_json(request, self.config.max_body_bytes)
            entry = self.entry(body, "llm")
            model = entry.name
            span.model(model, entry.provider, body.get("stream", False) is True)
            opts, stream, include_usage, what = parse_generation(body, entry, operation)
            where = "messages" if operation == "chat" else "prompt"
            shape = _Shape(operation, tools=bool(opts.get("tools")), logprobs="logprobs" in opts)
            grammar_param = "tools" if shape.tools else "response_format"
            needs_engine = [k for k in ("grammar", "logprobs") if k in opts]
            if needs_engine and not isinstance(entry.worker, BatchWorker):
                param = grammar_param if needs_engine[0] == "grammar" else "logprobs"
                how = "a VLM bundle always is" if entry.images is not None else "serve --parallel 2 or more"
                raise APIError(400, f"'{param}' needs continuous batching, and {model!r} is served one request at a "
                               f"time ({how})", param=param, code="unsupported_parameter")
            if isinstance(what, tuple):  # several completions prompts: one choice each
                return await self._generate_many(request, entry, span, opts, stream, include_usage, what, shape, t0)
            try:
                if isinstance(what, str):
                    request_obj = GenerationRequest.from_options(prompt=what, stream=stream, **opts)
                elif operation == "chat":
                    from edgesdk.serve.images import text_only  # a VLM's image parts: checked in _messages

                    request_obj = GenerationRequest.from_options(messages=text_only(cast("list[dict]", what)),
                                                                 stream=stream, **opts)
                else:
                    request_obj = GenerationRequest.from_options(prompt_tokens=cast("list[int]", what),
                                                                 stream=stream, **opts)
            except EdgeSDKError as exc:
                raise _from_backend(exc, where) from None
            session = entry.session
            if operation == "chat":
                def start(m=what, o=opts):
                    return session.chat(m, stream=True, **o)
            else:
                def start(p=what, o=opts):
                    return session.stream(p, **o)
            span.set("gen_ai.request.max_tokens", opts["max_tokens"])
            span.set("gen_ai.request.temperature", opts.get("temperature"))
            span.set("gen_ai.request.top_p", opts.get("top_p"))
            span.set("gen_ai.request.seed", opts.get("seed"))
            span.set("gen_ai.request.top_k", opts.get("top_k"))
            span.set("gen_ai.request.frequency_penalty", opts.get("frequency_penalty"))
            span.set("gen_ai.request.presence_penalty", opts.get("presence_penalty"))
            loop = asyncio.get_running_loop()
            job = Job(start=start, loop=loop, events=asyncio.Queue(), otel_ctx=span.ctx, request=request_obj)
            assert entry.worker is not None  # created in start() for every llm entry
            try:
                entry.worker.submit(job)
            except Saturated as exc:
                self.metrics.rejected.inc(model=model, reason="draining" if exc.draining else "queue_full")
                raise _saturated(exc) from None
            # Nothing else reads from the client until the response starts: watch for it going away, so a
            # request abandoned while queued or generating stops at the next token (a stream is watched
            # by StreamingResponse once it starts).
            watch = loop.create_task(_until_disconnected(request.receive, job))
            try:
                kind, value = await job.events.get()  # "started", or "error" before the first token
                if kind == "disconnected":
                    return self._abandoned(span, route, model)
                if kind == "error":
                    raise _grammar_error(_from_backend(value, where), value, grammar_param)
                rid = ("chatcmpl-" if operation == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
                span.set("gen_ai.response.id", rid)
                if stream:
                    watch.cancel()
                    await asyncio.wait({watch})  # (our own cancellation still propagates)
                    if job.cancel.is_set():  # it saw the disconnect just before it was stopped
                        return self._abandoned(span, route, model)
                    return StreamingResponse(self._sse(job, entry, operation, rid, span, t0, include_usage, route,
                                                       shape),
                                             media_type="text/event-stream",
                                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
                pieces: list[str] = []
                t_first = None
                while True:
                    kind, value = await job.events.get()
                    if kind == "chunk":
                        t_first = t_first or time.perf_counter()
                        pieces.append(value)
                    elif kind == "disconnected":
                        return self._abandoned(span, route, model)
                    elif kind == "error":
                        raise _from_backend(value, where)
                    elif kind == "logprobs":  # the done event holds them all
                        continue
                    else:
                        last = value
                        break
            except asyncio.CancelledError:
                job.cancel.set()
                span.end(None, "cancelled", "client disconnected before the response", cancelled=True)
                raise
            finally:
                watch.cancel()
            usage = self._finish(entry, operation, span, last, t0)
            text = "".join(pieces)
            finish = _finish_reason(last)
            created = int(time.time())
            lps = shape.logprobs_of(last.get("logprobs") or [], 0)
            if operation == "chat":
                message: dict = {"role": "assistant", "content": text}
                calls = shape.tool_calls(text, finish)
                if calls is not None:
                    message = {"role": "assistant", "content": calls[1], "tool_calls": calls[0] or None}
                    if calls[0]:
                        finish = "tool_calls"
                choice = {"index": 0, "message": message, "logprobs": lps, "finish_reason": finish}
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": text, "logprobs": lps, "finish_reason": finish}
                obj = "text_completion"
            span.end(200)
            self._count(route, model, 200)
            return JSONResponse({"id": rid, "object": obj, "created": created, "model": model,
                                 "system_fingerprint": f"edgesdk-{__version__}", "choices": [choice], "usage": usage})
        except APIError as exc:
            span.end(exc.status, exc.code or exc.type, exc.message)
            self._count(route, model, exc.status)
            return exc.response()
        except Exception as exc:  # the guard answers 500: the span says so
            span.end(500, "server_error", f"{type(exc).__name__}: {exc}")
            raise

    async def _generate_many(self, request: Request, entry: ModelEntry, span: _Span, opts: dict, stream: bool,
                             include_usage: bool, prompts: tuple, shape: _Shape, t0: float) -> Response:
        """/v1/completions with several prompts: one job each, submitted together (the batching engine decodes
        them side by side), one choice each with its ``index``; streamed, the chunks of all choices interleave."""
        route, model, session = "/v1/completions", entry.name, entry.session
        try:
            reqs = [GenerationRequest.from_options(**({"prompt": p} if isinstance(p, str) else {"prompt_tokens": p}),
                                                   stream=stream, **opts) for p in prompts]
        except EdgeSDKError as exc:
            raise _from_backend(exc, "prompt") from None
        loop = asyncio.get_running_loop()
        jobs: list[Job] = []
        assert entry.worker is not None
        try:
            for p, r in zip(prompts, reqs, strict=True):
                def start(p: str | list[int] = p) -> Any:
                    return session.stream(p, **opts)

                job = Job(start=start, loop=loop, events=asyncio.Queue(), otel_ctx=span.ctx, request=r)
                entry.worker.submit(job)
                jobs.append(job)
        except Saturated as exc:
            for job in jobs:
                job.cancel.set()
            self.metrics.rejected.inc(model=model, reason="draining" if exc.draining else "queue_full")
            raise _saturated(exc) from None
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, job: Job) -> None:
            while True:
                kind, value = await job.events.get()
                await merged.put((i, kind, value))
                if kind in ("done", "error", "disconnected"):
                    return

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            for job in jobs:
                job.cancel.set()
            await merged.put((-1, "disconnected", None))

        pumps = [loop.create_task(pump(i, j)) for i, j in enumerate(jobs)]
        watcher = loop.create_task(watch())

        def stop() -> None:
            for job in jobs:
                job.cancel.set()
            for t in (*pumps, watcher):
                t.cancel()

        rid = "cmpl-" + uuid.uuid4().hex[:24]
        span.set("gen_ai.response.id", rid)
        created = int(time.time())
        base = {"id": rid, "object": "text_completion", "created": created, "model": model,
                "system_fingerprint": f"edgesdk-{__version__}"}
        texts = [""] * len(jobs)
        lps: list[list] = [[] for _ in jobs]
        lasts: list[dict | None] = [None] * len(jobs)

        def usage_of() -> dict:
            u = [self._finish(entry, "text_completion", span, last, t0) for last in lasts if last is not None]
            n_in, n_out = sum(x["prompt_tokens"] for x in u), sum(x["completion_tokens"] for x in u)
            return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}

        if not stream:
            try:
                while any(last is None for last in lasts):
                    i, kind, value = await merged.get()
                    if kind == "disconnected":
                        stop()
                        return self._abandoned(span, route, model)
                    if kind == "error":
                        stop()
                        raise _from_backend(value, "prompt")
                    if kind == "chunk":
                        texts[i] += value
                    elif kind == "done":
                        lasts[i] = value
            except asyncio.CancelledError:
                stop()
                raise
            watcher.cancel()
            choices = [{"index": i, "text": texts[i], "finish_reason": _finish_reason(last or {}),
                        "logprobs": shape.logprobs_of((last or {}).get("logprobs") or [], 0)}
                       for i, last in enumerate(lasts)]
            usage = usage_of()
            span.end(200)
            self._count(route, model, 200)
            return JSONResponse({**base, "choices": choices, "usage": usage})

        def line(payload: dict) -> bytes:
            return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"

        # the first event of each job: "started", or "error" before the first token (a prompt too long: 400)
        started: set[int] = set()
        early: list[tuple] = []  # a job's pieces that came before every job had started
        try:
            while len(started) < len(jobs):
                i, kind, value = await merged.get()
                if kind == "started":
                    started.add(i)
                elif kind == "error":
                    stop()
                    raise _from_backend(value, "prompt")
                elif kind == "disconnected":
                    stop()
                    return self._abandoned(span, route, model)
                else:
                    early.append((i, kind, value))
        except asyncio.CancelledError:
            stop()
            raise
        watcher.cancel()  # StreamingResponse watches for the disconnect from here on

        async def events():
            finished = False
            sent = [0] * len(jobs)
            try:
                while any(last is None for last in lasts):
                    i, kind, value = early.pop(0) if early else await merged.get()
                    if kind == "disconnected":
                        return
                    if kind == "error":
                        err = _from_backend(value, "prompt")
                        yield line({"error": {"message": err.message, "type": err.type, "param": err.param,
                                              "code": err.code}})
                        span.end(200, err.code or err.type, err.message, error_type=err.code or err.type)
                        self._count(route, model, err.status)
                        finished = True
                        return
                    if kind == "logprobs":
                        lps[i].extend(value)
                    elif kind == "chunk":
                        lp = shape.logprobs_of(lps[i], sent[i])
                        lps[i] = []
                        sent[i] += len(value)
                        yield line({**base, "choices": [{"index": i, "text": value, "logprobs": lp,
                                                         "finish_reason": None}]})
                    elif kind == "done":
                        lasts[i] = value
                        yield line({**base, "choices": [{"index": i, "text": "", "logprobs": None,
                                                         "finish_reason": _finish_reason(value)}]})
                usage = usage_of()
                if include_usage:
                    yield line({**base, "choices": [], "usage": usage})
                yield b"data: [DONE]\n\n"
                finished = True
                span.end(200)
                self._count(route, model, 200)
            finally:
                stop()
                if not finished:
                    self.metrics.cancelled.inc(model=model)
                    span.end(200, "cancelled", "client disconnected before the end of the stream", cancelled=True)
                    self._count(route, model, 499)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _abandoned(self, span: _Span, route: str, model: str) -> Response:
        """The client went away before the response (``http.disconnect``): the job is cancelled already."""
        self.metrics.cancelled.inc(model=model)
        span.end(None, "cancelled", "client disconnected before the response", cancelled=True)
        self._count(route, model, 499)
        return Response(status_code=499)  # nobody reads it: the connection is gone

    def _finish(self, entry: ModelEntry, operation: str, span: _Span, last: dict, t0: float) -> dict:
        n_in, n_out = int(last.get("input_tokens") or 0), int(last.get("output_tokens") or 0)
        span.set("gen_ai.usage.input_tokens", n_in)
        span.set("gen_ai.usage.output_tokens", n_out)
        span.set("gen_ai.response.finish_reasons", [_finish_reason(last)])
        span.set("gen_ai.response.model", entry.name)
        m, labels = self.metrics, {"gen_ai_operation_name": operation, "gen_ai_request_model": entry.name}
        m.duration.observe(time.perf_counter() - t0, **labels)
        first, end = last.get("first_token_at"), last.get("last_token_at")
        if first:
            m.ttft.observe(max(0.0, first - t0), **labels)
            if end and n_out > 1:
                m.tpot.observe((end - first) / (n_out - 1), **labels)
        m.tokens.inc(n_in, gen_ai_request_model=entry.name, gen_ai_token_type="input")
        m.tokens.inc(n_out, gen_ai_request_model=entry.name, gen_ai_token_type="output")
        usage: dict = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        if entry.prompt_cache is not None or (isinstance(entry.worker, BatchWorker) and self.config.prefix_reuse):
            cached = int(last.get("cached_tokens") or 0)
            usage["prompt_tokens_details"] = {"cached_tokens": cached}  # OpenAI's field for reused prompt tokens
            span.set("gen_ai.usage.cache_read.input_tokens", cached)
            m.cached_tokens.inc(cached, model=entry.name)
            if entry.prompt_cache is not None:
                m.cache_bytes.set(entry.prompt_cache.stats()["bytes"], model=entry.name)
        return usage

    async def _sse(self, job: Job, entry: ModelEntry, operation: str, rid: str, span: _Span, t0: float,
                   include_usage: bool, route: str, shape: _Shape | None = None):
        created = int(time.time())
        model = entry.name
        obj = "chat.completion.chunk" if operation == "chat" else "text_completion"
        base = {"id": rid, "object": obj, "created": created, "model": model,
                "system_fingerprint": f"edgesdk-{__version__}"}

        shape = shape or _Shape(operation)
        lp_pending: list = []  # token log-probabilities not sent yet
        sent_chars = 0  # completions: text_offset of the next piece
        held: list[str] = []  # a tool-call reply: sent whole at the end, as tool-call deltas or content

        def event(choice_delta: dict | None, finish=None, usage=None) -> bytes:
            nonlocal sent_chars
            lps = None
            if choice_delta is not None and lp_pending and shape.logprobs:
                lps = shape.logprobs_of(lp_pending, sent_chars)
                lp_pending.clear()
            if choice_delta is not None:
                sent_chars += len(choice_delta.get("content") or "")
            if operation == "chat":
                choices = [] if choice_delta is None else [{"index": 0, "delta": choice_delta, "logprobs": lps,
                                                            "finish_reason": finish}]
            else:
                choices = [] if choice_delta is None else [{"index": 0, "text": choice_delta.get("content", ""),
                                                            "logprobs": lps, "finish_reason": finish}]
            payload = {**base, "choices": choices}
            if include_usage:
                payload["usage"] = usage
            return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"

        finished = False
        try:
            if operation == "chat":
                yield event({"role": "assistant", "content": ""})
            first_chunk = True
            while True:
                kind, value = await job.events.get()
                if kind == "logprobs":
                    lp_pending.extend(value)
                elif kind == "chunk":
                    if first_chunk:
                        span.set("gen_ai.response.time_to_first_chunk", time.perf_counter() - t0)
                        first_chunk = False
                    if shape.tools:
                        held.append(value)
                    else:
                        yield event({"content": value})
                elif kind == "error":
                    err = _from_backend(value, "messages" if operation == "chat" else "prompt")
                    payload = {"error": {"message": err.message, "type": err.type, "param": err.param,
                                         "code": err.code}}
                    yield b"data: " + json.dumps(payload).encode("utf-8") + b"\n\n"
                    span.end(200, err.code or err.type, err.message, error_type=err.code or err.type)
                    self._count(route, model, err.status)
                    finished = True
                    return
                else:
                    usage = self._finish(entry, operation, span, value, t0)
                    finish = _finish_reason(value)
                    calls = shape.tool_calls("".join(held), finish) if shape.tools else None
                    if calls is not None and calls[0]:
                        finish = "tool_calls"
                        for i, call in enumerate(calls[0]):  # as OpenAI streams them: id and name, then arguments
                            fn = call["function"]
                            yield event({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                                         "function": {"name": fn["name"], "arguments": ""}}]})
                            yield event({"tool_calls": [{"index": i, "function": {"arguments": fn["arguments"]}}]})
                    elif calls is not None:
                        yield event({"content": calls[1]})
                    yield event({}, finish=finish)
                    if include_usage:
                        yield b"data: " + json.dumps({**base, "choices": [], "usage": usage},
                                                     separators=(",", ":")).encode("utf-8") + b"\n\n"
                    yield b"data: [DONE]\n\n"
                    finished = True
                    span.end(200)
                    self._count(route, model, 200)
                    return
        finally:
            if not finished:  # the client went away (or the server is cancelling): stop generating
                job.cancel.set()
                self.metrics.cancelled.inc(model=model)
                span.end(200, "cancelled", "client disconnected before the end of the stream", cancelled=True)
                self._count(route, model, 499)

    async def embeddings(self, request: Request) -> Response:
        route = "/v1/embeddings"
        t0 = time.perf_counter()
        model = ""
        span = _Span(self.tracer, request, "embeddings", route, self._provider("embedding"))
        try:
            body = await _read_json(request, self.config.max_body_bytes)
            entry = self.entry(body, "embedding")
            model = entry.name
            span.model(model, entry.provider)
            inputs, fmt, dims = parse_embeddings(body)
            if not isinstance(inputs[0], str):  # token ids: in this model's vocabulary, before they share a batch
                try:
                    entry.session.count_tokens(inputs)
                except EdgeSDKError as exc:
                    raise APIError(400, exc.one_line() if isinstance(exc, InputError) else str(exc),
                                   param="input") from None
            assert entry.batcher is not None  # created in start() for every embedding entry
            try:
                emb, counts = await entry.batcher.embed(inputs, otel_ctx=span.ctx)
            except Saturated as exc:
                self.metrics.rejected.inc(model=model, reason="draining" if exc.draining else "queue_full")
                raise _saturated(exc) from None
            except EdgeSDKError as exc:
                raise _from_backend(exc, "input") from None
            if dims is not None and dims != emb.shape[1]:
                raise APIError(400, f"'dimensions' must be {emb.shape[1]} for {model!r} (no truncation)",
                               param="dimensions")
            n_tokens = int(sum(counts))
            data = []
            for i, vec in enumerate(np.asarray(emb, dtype=np.float32)):
                value = (base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii") if fmt == "base64"
                         else vec.tolist())
                data.append({"object": "embedding", "index": i, "embedding": value})
            span.set("gen_ai.usage.input_tokens", n_tokens)
            span.set("gen_ai.embeddings.dimension.count", int(emb.shape[1]))
            span.set("gen_ai.response.model", model)
            self.metrics.duration.observe(time.perf_counter() - t0, gen_ai_operation_name="embeddings",
                                          gen_ai_request_model=model)
            self.metrics.tokens.inc(n_tokens, gen_ai_request_model=model, gen_ai_token_type="input")
            span.end(200)
            self._count(route, model, 200)
            return JSONResponse({"object": "list", "data": data, "model": model,
                                 "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})
        except APIError as exc:
            span.end(exc.status, exc.code or exc.type, exc.message)
            self._count(route, model, exc.status)
            return exc.response()
        except Exception as exc:  # the guard answers 500: the span says so
            span.end(500, "server_error", f"{type(exc).__name__}: {exc}")
            raise


@dataclass
class _Shape:
    """How a generation's reply is shaped: tool calls parsed out of it, log-probabilities in OpenAI's form."""

    operation: str
    tools: bool = False
    logprobs: bool = False

    def tool_calls(self, text: str, finish: str) -> tuple[list[dict], str | None] | None:
        """(tool calls, text content) of a reply in the generic tool format; None when tools are off. A reply
        cut by max_tokens is its raw text."""
        if not self.tools:
            return None
        if finish == "length":
            return [], text
        calls, content = _grammar.parse_tool_reply(text)
        return [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                 "function": {"name": name, "arguments": args}} for name, args in calls], content

    def logprobs_of(self, entries: list, offset: int) -> dict | None:
        """OpenAI's ``logprobs`` of a choice (chat: ``content``; completions: tokens, token_logprobs,
        top_logprobs, text_offset from ``offset`` characters into the completion)."""
        if not self.logprobs:
            return None

        def tok(b: bytes) -> str:
            return b.decode("utf-8", errors="replace")

        if self.operation == "chat":
            return {"content": [{"token": tok(e.text), "logprob": e.logprob, "bytes": list(e.text),
                                 "top_logprobs": [{"token": tok(t), "logprob": lp, "bytes": list(t)}
                                                  for _, t, lp in e.top]} for e in entries], "refusal": None}
        offsets = []
        for e in entries:
            offsets.append(offset)
            offset += len(tok(e.text))
        return {"tokens": [tok(e.text) for e in entries], "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{tok(t): lp for _, t, lp in e.top} for e in entries], "text_offset": offsets}


def _grammar_error(err: APIError, exc: BaseException, param: str) -> APIError:
    """A request whose grammar llama.cpp refused: a 400 naming the field it came from."""
    if isinstance(exc, InputError) and str(exc).startswith("grammar"):
        err.param = param
    return err


def _finish_reason(last: dict) -> str:
    reason = last.get("finish_reason")
    return "length" if reason == "length" else "stop"


class _Guard:
    """Pure ASGI middleware: the Host allow-list (400/421), API key (constant-time compare), draining (503),
    a catch-all 500 in OpenAI shape, and the SERVER span of every request that no GenAI handler traces
    itself (:class:`_HTTPSpan`)."""

    OPEN = ("/health",)

    def __init__(self, app, server: _Server, routes: list[Route], genai: frozenset[str]):
        self.app, self.server, self.routes, self.genai = app, server, routes, genai

    def _route(self, scope: dict) -> str | None:
        """The matched route's template (``/v1/models/{model}``), also for a 405 (path matched, method
        not); None for an unknown path."""
        partial = None
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return _template(route.path)
            if match == Match.PARTIAL and partial is None:
                partial = _template(route.path)
        return partial

    def _http_span(self, scope: dict, headers: dict) -> _HTTPSpan | None:
        url = f"{scope.get('scheme') or 'http'}://{headers.get('host', '')}{scope.get('path', '')}"
        if any(p.search(url) for p in self.server.untraced):
            return None
        return _HTTPSpan(self.server.tracer, scope, headers, self._route(scope))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        refusal = None
        name = host_name(headers.get("host"))
        if name is None:
            refusal = APIError(400, f"missing or malformed Host header {headers.get('host')!r}", param="Host",
                               code="invalid_host")
        elif not host_allowed(name, self.server.allowed_hosts):
            refusal = APIError(421, f"this server does not answer for host {name!r} (start it with "
                               f"--allowed-host {name} to allow it)", param="Host", code="host_not_allowed")
        elif path not in self.OPEN:
            if not self.server.authorized(headers):
                refusal = APIError(401, "Incorrect API key provided (send 'Authorization: Bearer <key>')",
                                   code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            elif self.server.draining and path.startswith("/v1/"):
                refusal = APIError(503, "the server is shutting down", "service_unavailable",
                                   code="server_shutting_down", headers={"Retry-After": "5"})
        # A GenAI handler that will run starts its own span (with the GenAI attributes); all else gets one here.
        traced_by_handler = refusal is None and scope.get("method") == "POST" and path in self.genai
        span = None if traced_by_handler else self._http_span(scope, headers)
        if refusal is not None:
            await refusal.response()(scope, receive, send)
            if span is not None:
                span.end(refusal.status)
            return
        status: int | None = None

        async def tracking_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # noqa: BLE001 - never a traceback to the client
            if span is not None:
                span.end(status or 500, _error_type(exc))
            if status is not None:
                raise
            await APIError(500, f"internal error: {type(exc).__name__}", "server_error").response()(
                scope, receive, send)
            return
        except BaseException:  # cancelled (shutdown, client gone): no status sent is the truth
            if span is not None:
                span.end(status, "cancelled")
            raise
        if span is not None:
            span.end(status)


def _template(path: str) -> str:
    """A Starlette route path as an ``http.route`` template: ``{model:path}`` -> ``{model}``."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def _error_type(exc: BaseException) -> str:
    """``error.type`` for an exception: its fully qualified class name (HTTP conventions)."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def create_app(entries: list[ModelEntry], config: ServeConfig | None = None) -> Starlette:
    """The ASGI app serving ``entries``. Workers start with the app's lifespan and stop (draining) with it."""
    config = config or ServeConfig()
    server = _Server(entries, config)

    @asynccontextmanager
    async def lifespan(app):
        server.start()
        try:
            yield
        finally:
            await server.stop()

    async def not_found(request: Request, exc) -> Response:
        status = getattr(exc, "status_code", 404)
        kind = "not found" if status == 404 else "method not allowed" if status == 405 else "error"
        return APIError(status, f"{request.method} {request.url.path}: {kind}", code=str(status)).response()

    routes = [
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/embeddings", server.embeddings, methods=["POST"]),
        Route("/v1/models", server.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", server.get_model, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.prom, methods=["GET"]),
        Route("/openapi.json", server.openapi, methods=["GET"]),
    ]
    server.openapi_doc = openapi_document(((r.path, r.methods or ()) for r in routes), REQUEST_FIELDS)
    genai = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})  # spans of their own
    middleware = [Middleware(_Guard, server=server, routes=routes, genai=genai)]
    if config.cors_origins:  # outermost: preflights carry no API key, and refusals need CORS headers too
        from starlette.middleware.cors import CORSMiddleware

        middleware.insert(0, Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                        allow_methods=["GET", "POST"], allow_headers=["*"],
                                        expose_headers=["Retry-After"], max_age=600))
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found},
                    middleware=middleware)
    app.state.server = server
    return app
