# SPDX-License-Identifier: Apache-2.0
"""The OpenAI protocol of ``edgesdk serve``, requests side: request bodies parsed and checked once (JSON, then
every field against :data:`edgesdk.serve.fields.REQUEST_FIELDS`, into the runtime's
:class:`~edgesdk.runtime.requests.GenerationRequest`), and errors in OpenAI's shape (:class:`APIError`:
``{"error": {"message", "type", "param", "code"}}``, the runtime's exceptions mapped to them). Replies are
shaped by :mod:`edgesdk.serve.replies`.

Nothing here knows the HTTP routes' state (models, workers, metrics): that is :mod:`edgesdk.serve.routes`.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import cast

from starlette.requests import Request
from starlette.responses import JSONResponse

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
from edgesdk.serve.config import ModelEntry
from edgesdk.serve.fields import (
    FIELD_NAMES,
    MAX_EMBEDDING_INPUTS,
    MAX_METADATA,
    MAX_PROMPTS,
    MAX_STOP_SEQUENCES,
    PROMPT_CACHE_RETENTIONS,
    REASONING_EFFORTS,
    REQUEST_FIELDS,
    VERBOSITIES,
)
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
            if name in FIELD_NAMES
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


def _show(value: object) -> str:
    """``repr(value)`` cut to one short piece: a 4000-digit number is not echoed whole."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


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


# ------------------------------------------------------------------------------ generation and embedding bodies
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
            raise APIError(
                400,
                f"unknown field {_show(key)}: not a field of {route} that this server knows "
                f"(OpenAI's request fields and the llama.cpp extras top_k, min_p, repeat_penalty; "
                f"docs/serve.md lists them)",
                param=str(key),
                code="unsupported_parameter",
            )
        if value is None or f.status != "refused" or any(_same(value, n) for n in f.neutral):
            continue
        allowed = " or ".join(json.dumps(n) for n in (None, *f.neutral))
        raise APIError(
            400,
            f"'{key}' is not supported by this server: {f.note} (accepted: {allowed})",
            param=key,
            code="unsupported_parameter",
        )


def check_ignored(body: dict) -> None:
    """The fields accepted and ignored (``ignored`` in :data:`REQUEST_FIELDS`: they cannot change the reply
    here) still have OpenAI's types and bounds: anything else is an APIError 400 naming the field."""
    meta = body.get("metadata")
    if meta is not None:
        if not isinstance(meta, dict) or len(meta) > MAX_METADATA:
            raise APIError(
                400, f"'metadata' must be an object of at most {MAX_METADATA} key-value pairs", param="metadata"
            )
        for k, v in meta.items():
            if len(k) > 64 or not isinstance(v, str) or len(v) > 512:
                raise APIError(
                    400,
                    f"'metadata' keys are strings of at most 64 characters and values strings of at most 512 "
                    f"(key {_show(k)})",
                    param="metadata",
                )
    for key in ("prompt_cache_key", "safety_identifier"):
        value = body.get(key)
        if value is not None and not isinstance(value, str):
            raise APIError(400, f"'{key}' must be a string, got {_show(value)}", param=key)
    for key, allowed in (
        ("reasoning_effort", REASONING_EFFORTS),
        ("verbosity", VERBOSITIES),
        ("prompt_cache_retention", PROMPT_CACHE_RETENTIONS),
    ):
        value = body.get(key)
        if value is not None and value not in allowed:
            raise APIError(400, f"'{key}' must be one of {', '.join(allowed)}, got {_show(value)}", param=key)
    opts = body.get("prompt_cache_options")
    if opts is not None:
        ok = isinstance(opts, dict) and all(
            (k == "mode" and v in ("implicit", "explicit", None)) or (k == "ttl" and v in ("30m", None))
            for k, v in opts.items()
        )
        if not ok:
            raise APIError(
                400,
                "'prompt_cache_options' must be an object with 'mode' ('implicit' or 'explicit') and 'ttl' ('30m')",
                param="prompt_cache_options",
            )


def _generation_options(body: dict, entry: ModelEntry) -> dict:
    n = _integer(body, "n", 1)
    if n not in (None, 1):
        raise APIError(400, "only n=1 is supported", param="n")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key, 1)
    if max_tokens is not None and max_tokens > entry.max_tokens_cap:
        raise APIError(
            400,
            f"'{key}' is {_show(max_tokens)}; this server allows at most {entry.max_tokens_cap} for {entry.name!r}",
            param=key,
        )
    opts: dict = {"max_tokens": max_tokens or entry.default_max_tokens}
    for name, lo, hi, lo_open in (
        ("temperature", 0.0, 2.0, False),
        ("top_p", 0.0, 1.0, True),
        ("min_p", 0.0, 1.0, False),
        ("frequency_penalty", -2.0, 2.0, False),
        ("presence_penalty", -2.0, 2.0, False),
    ):
        value = _number(body, name, lo, hi, lo_open=lo_open)  # top_p: the runtime's rule 0 < top_p <= 1
        if value is not None:
            opts[name] = value
    repeat = body.get("repeat_penalty")
    if repeat is not None:
        if isinstance(repeat, bool) or not isinstance(repeat, int | float) or not 0 < repeat <= 1e6:
            raise APIError(
                400,
                f"'repeat_penalty' must be a number above 0 (1 is off), got {_show(repeat)}",
                param="repeat_penalty",
            )
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
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOP_SEQUENCES:
            raise APIError(
                400, f"'stop' must be a string or a list of at most {MAX_STOP_SEQUENCES} strings", param="stop"
            )
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
            raise APIError(
                400,
                f"'tool_choice' must name one of the tools ({', '.join(names) or 'none given'}), got {_show(choice)}",
                param="tool_choice",
            )
        choice = name
    elif choice is None:
        choice = "auto" if tools else "none"
    elif choice not in ("none", "auto", "required"):
        raise APIError(
            400,
            f"'tool_choice' must be 'none', 'auto', 'required' or "
            f"{{'type': 'function', 'function': {{'name': ...}}}}, got {_show(choice)}",
            param="tool_choice",
        )
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
                raise InputError(
                    f"response_format.type must be 'text', 'json_object' or 'json_schema', got {_show(kind)}"
                )
        except InputError as exc:
            raise APIError(400, str(exc), param="response_format") from None
    if tools and choice != "none":
        if schema_grammar is not None:
            raise APIError(
                400,
                "'response_format' cannot be combined with tools (unless tool_choice is 'none'): "
                "the reply is a tool call or text",
                param="response_format",
            )
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
            raise APIError(
                400, f"'prompt' holds {len(prompt)} prompts; the limit is {MAX_PROMPTS} per request", param="prompt"
            )
        return tuple(_prompt({"prompt": p}) for p in prompt)  # type: ignore[misc]  # one each: never a tuple
    raise APIError(
        400,
        "'prompt' must be a string, token ids (a non-empty list of integers), or a list of "
        f"up to {MAX_PROMPTS} strings or token-id lists",
        param="prompt",
    )


def parse_generation(
    body: dict, entry: ModelEntry, operation: str
) -> tuple[dict, bool, bool, list[dict] | str | list[int] | tuple[str | list[int], ...]]:
    """A chat (``operation="chat"``) or completions body -> (generation options, stream, include_usage,
    messages, prompt text or prompt token ids). Anything the model cannot take is an APIError 400 naming
    the field: every field is checked against :data:`REQUEST_FIELDS`."""
    check_fields(body, "/v1/chat/completions" if operation == "chat" else "/v1/completions")
    check_ignored(body)
    opts = _generation_options(body, entry)
    stream = body.get("stream", False) is True
    include = stream_options(body)
    opts.update(_structured(body, operation))
    if operation == "chat":
        return opts, stream, stream and bool(include), _messages(body, entry)
    return opts, stream, stream and bool(include), _prompt(body)


def stream_options(body: dict) -> bool:
    """``stream_options``: whether ``include_usage`` is asked; ``include_obfuscation`` is accepted (a boolean) and
    ignored: no ``obfuscation`` padding field is sent. Any other key is an APIError 400 naming it."""
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise APIError(400, "'stream_options' must be an object", param="stream_options")
    for key, value in (options or {}).items():
        if key not in ("include_usage", "include_obfuscation"):
            raise APIError(
                400,
                f"'stream_options.{str(key)[:40]}' is not supported (include_usage; include_obfuscation is ignored)",
                param=f"stream_options.{str(key)[:40]}",
                code="unsupported_parameter",
            )
        if value is not None and not isinstance(value, bool):
            raise APIError(400, f"'stream_options.{key}' must be a boolean", param=f"stream_options.{key}")
    return bool((options or {}).get("include_usage"))


def generation_request(
    operation: str, what: list[dict] | str | list[int], stream: bool, opts: dict
) -> GenerationRequest:
    """The runtime's request of one chat (``what``: its messages) or one completions prompt (text or token ids)
    with the options of :func:`parse_generation`; an APIError 400 naming the field the runtime refuses."""
    try:
        if isinstance(what, str):
            return GenerationRequest.from_options(prompt=what, stream=stream, **opts)
        if operation == "chat":
            from edgesdk.serve.images import text_only  # a VLM's image parts: checked in _messages

            return GenerationRequest.from_options(messages=text_only(cast("list[dict]", what)), stream=stream, **opts)
        return GenerationRequest.from_options(prompt_tokens=cast("list[int]", what), stream=stream, **opts)
    except EdgeSDKError as exc:
        raise backend_error(exc, "messages" if operation == "chat" else "prompt") from None


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
        raise APIError(
            400,
            "'input' must be a non-empty string, list of strings, list of token ids, or list of token-id lists",
            param="input",
        )
    texts = all(isinstance(t, str) for t in inputs)
    if not texts and not all(_token_ids(t) for t in inputs):
        raise APIError(
            400,
            "'input' must be a list of strings or a list of token-id lists (lists of integers), "
            "not a mix or other values",
            param="input",
        )
    if any(not t for t in inputs):
        raise APIError(400, f"'input' must not contain empty {'strings' if texts else 'token-id lists'}", param="input")
    if not texts:
        bad = next((t for ids in inputs for t in ids if not 0 <= t <= INT32_MAX), None)
        if bad is not None:
            raise APIError(
                400, f"'input' token ids must be from 0 to the model's vocabulary size, got {_show(bad)}", param="input"
            )
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise APIError(400, f"'input' holds {len(inputs)} items; the limit is {MAX_EMBEDDING_INPUTS}", param="input")
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
    """Chat messages with text content; a VLM entry's messages keep their parts, image_url parts read and checked
    from their headers (edgesdk.serve.images: data URLs, local files under --allow-local-images, size limits, the
    images' tokens against the context; else 400 naming them), not decoded yet (``images.decode_images``)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
            raise APIError(400, f"messages[{i}] must be an object with a 'role'", param=f"messages[{i}]")
        for key, value in m.items():  # audio, refusal, function_call, ...: not passed to the template
            if key not in ("role", "content", *_TOOL_KEYS.get(m["role"], ())) and value not in (None, [], ""):
                raise APIError(
                    400,
                    f"messages[{i}].{key[:40]}: only 'role' and 'content' (and an assistant's "
                    "'tool_calls', a tool's 'tool_call_id' and 'name') are supported in a message",
                    param=f"messages[{i}].{key[:40]}",
                    code="unsupported_parameter",
                )
        content = m.get("content")
        if isinstance(content, list):  # content parts: text, and image_url for a VLM
            texts, parts = [], []
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "image_url":
                    from edgesdk.serve.images import ImageError, image_part

                    try:
                        parts.append(
                            image_part(
                                part,
                                f"messages[{i}].content[{j}]",
                                entry.images if entry is not None else None,
                                entry.name if entry is not None else "",
                            )
                        )
                    except ImageError as exc:
                        raise APIError(400, str(exc), param=exc.param) from None
                    continue
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(
                        400,
                        f"messages[{i}].content: only text parts are supported"
                        + (" besides image_url" if entry is not None and entry.images else ""),
                        param=f"messages[{i}].content",
                    )
                texts.append(part["text"])
                parts.append({"type": "text", "text": part["text"]})
            content = parts if entry is not None and entry.images is not None else "".join(texts)
        if content is None:
            content = ""
        if not isinstance(content, str | list):
            raise APIError(
                400, f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content"
            )
        # OpenAI's `developer` role (o-series clients send it for instructions) is a system turn on models
        # without one of their own, as OpenAI treats it there: chat templates know `system`.
        role = "system" if m["role"] == "developer" else m["role"]
        msg = {"role": role, "content": content}
        msg.update({k: m[k] for k in _TOOL_KEYS.get(m["role"], ()) if m.get(k) not in (None, [], "")})
        out.append(msg)
    if entry is not None and entry.images is not None:
        from edgesdk.serve.images import check_image_tokens

        try:  # counted from the headers, before any image is decoded (the route decodes them on a thread)
            check_image_tokens(out, entry.images)
        except InputError as exc:
            raise APIError(400, str(exc), param="messages", code="context_length_exceeded") from None
    return out


_TOOL_KEYS = {"assistant": ("tool_calls",), "tool": ("tool_call_id", "name")}
