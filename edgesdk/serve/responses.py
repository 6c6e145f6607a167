# SPDX-License-Identifier: Apache-2.0
"""OpenAI's Responses API (``POST /v1/responses``) over the chat path: a Responses request is read into a chat
request (``input`` items -> messages, ``instructions`` -> a system turn first, ``max_output_tokens`` -> max_tokens,
``text.format`` -> response_format, flat function ``tools`` -> chat tools), checked and generated exactly as
``/v1/chat/completions`` does (the same parser, worker and engine), and the reply is shaped as a Response object,
or streamed as its events (``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` ..., ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``, then ``response.completed`` or
``response.incomplete``).

Nothing is stored: ``previous_response_id`` and ``conversation`` are refused, and every response says
``store: false``. A streamed reply with tools is sent when it is complete (a call's arguments in one delta).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, Any, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from edgesdk.runtime.requests import DEFAULT_SAMPLING
from edgesdk.serve.fields import REASONING_EFFORTS
from edgesdk.serve.protocol import (
    APIError,
    backend_error,
    check_fields,
    check_ignored,
    grammar_error,
    parse_generation,
    read_json,
)
from edgesdk.serve.replies import ReplyShape, finish_reason
from edgesdk.serve.routes import _Events
from edgesdk.telemetry.serve_spans import ServerSpan

if TYPE_CHECKING:
    from edgesdk.serve.config import ModelEntry
    from edgesdk.serve.routes import Routes

ROUTE = "/v1/responses"

# A chat request's field -> the Responses field it came from (in error answers' ``param``). A message's index is not
# its input item's (instructions come first, function calls merge): any messages[...] error names ``input``.
_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}


def _param(param: str | None) -> str | None:
    if param is None:
        return None
    base = param.split(".", 1)[0].split("[", 1)[0]
    return _PARAMS.get(base, param)


# ------------------------------------------------------------------------------ request
def _content(content: object, where: str, role: str) -> str | list[dict]:
    """A Responses message's content as chat content: a string, or text (and image) parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"'{where}' must be a string or a list of content parts", param=where)
    parts: list[dict] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        here = f"{where}[{j}]"
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and role == "user":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise APIError(400, f"'{here}.image_url' must be a data URL (file_id is not supported)", param=here)
            detail = part.get("detail")
            parts.append({"type": "image_url", "image_url": {"url": url, **({"detail": detail} if detail else {})}})
        else:
            raise APIError(
                400,
                f"'{here}': only input_text, output_text and (user turns of VLM bundles) input_image parts are "
                f"supported, got {str(kind)[:40]!r}",
                param=here,
                code="unsupported_parameter",
            )
    return parts


def _messages(body: dict) -> list[dict]:
    """``instructions`` and ``input`` as chat messages."""
    out: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise APIError(400, "'instructions' must be a string", param="instructions")
        out.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise APIError(400, "'input' must be a string or a non-empty list of input items", param="input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(400, f"'{where}' must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(
                    400, f"'{where}.role' must be user, assistant, system or developer", param=f"{where}.role"
                )
            out.append({"role": role, "content": _content(item.get("content"), f"{where}.content", role)})
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            if not all(isinstance(v, str) for v in (call_id, name, args)):
                raise APIError(400, f"'{where}' needs string call_id, name and arguments", param=where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise APIError(400, f"'{where}.call_id' must be a string", param=f"{where}.call_id")
            if not isinstance(output, str):
                output = _content(output, f"{where}.output", "tool")
                output = "".join(p["text"] for p in output) if isinstance(output, list) else output
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        else:
            raise APIError(
                400,
                f"'{where}.type' {str(kind)[:40]!r} is not supported (message, function_call, function_call_output)",
                param=f"{where}.type",
                code="unsupported_parameter",
            )
    return out


def _tools(body: dict) -> tuple[list[dict] | None, object]:
    tools = body.get("tools")
    if tools is None or tools == []:
        chat_tools = None
    elif not isinstance(tools, list):
        raise APIError(400, "'tools' must be a list of function tools", param="tools")
    else:
        chat_tools = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                kind = t.get("type") if isinstance(t, dict) else None
                raise APIError(
                    400,
                    f"'tools[{i}]': only function tools are supported here, got {str(kind)[:40]!r}",
                    param=f"tools[{i}].type",
                    code="unsupported_parameter",
                )
            fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
            chat_tools.append({"type": "function", "function": fn})
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise APIError(
                400,
                "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
                param="tool_choice",
            )
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return chat_tools, choice


def _format(body: dict) -> dict | None:
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict) or any(k not in ("format", "verbosity") for k in text):
        raise APIError(400, "'text' must be an object with 'format' (and 'verbosity')", param="text")
    verbosity = text.get("verbosity")
    if verbosity is not None and verbosity not in ("low", "medium", "high"):
        raise APIError(400, "'text.verbosity' must be low, medium or high", param="text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema")}}
    if kind in ("text", "json_object"):
        return {"type": kind}
    raise APIError(400, "'text.format.type' must be text, json_object or json_schema", param="text.format")


def _check_own(body: dict) -> None:
    """The Responses-only fields that are accepted and ignored: their types still."""
    reasoning = body.get("reasoning")
    if reasoning is not None:
        ok = isinstance(reasoning, dict) and all(
            (k == "effort" and (v is None or v in REASONING_EFFORTS))
            or (k in ("summary", "generate_summary") and (v is None or v in ("auto", "concise", "detailed")))
            for k, v in reasoning.items()
        )
        if not ok:
            raise APIError(400, "'reasoning' must be an object with 'effort' and 'summary'", param="reasoning")
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise APIError(400, "'store' must be a boolean", param="store")
    mtc = body.get("max_tool_calls")
    if mtc is not None and (isinstance(mtc, bool) or not isinstance(mtc, int) or mtc < 1):
        raise APIError(400, "'max_tool_calls' must be a positive integer", param="max_tool_calls")
    so = body.get("stream_options")
    if so is not None and (
        not isinstance(so, dict) or any(k != "include_obfuscation" or not isinstance(v, bool) for k, v in so.items())
    ):
        raise APIError(400, "'stream_options' takes only include_obfuscation (a boolean)", param="stream_options")


def chat_body(body: dict, model: str) -> dict:
    """A Responses request as the chat request it generates (checked: 400 naming the Responses field)."""
    check_fields(body, ROUTE)
    check_ignored(body)
    _check_own(body)
    tools, choice = _tools(body)
    chat: dict[str, Any] = {"model": model, "messages": _messages(body)}
    for src, dst in (
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
        ("user", "user"),
        ("parallel_tool_calls", "parallel_tool_calls"),
    ):
        if body.get(src) is not None:
            chat[dst] = body[src]
    if tools is not None:
        chat["tools"] = tools
    if choice is not None:
        chat["tool_choice"] = choice
    fmt = _format(body)
    if fmt is not None:
        chat["response_format"] = fmt
    return chat


# ------------------------------------------------------------------------------ reply
def _usage(chat_usage: dict) -> dict:
    n_in, n_out = int(chat_usage.get("prompt_tokens") or 0), int(chat_usage.get("completion_tokens") or 0)
    cached = int((chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": n_in,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n_in + n_out,
    }


def _text_item(item_id: str, text: str | None, status: str) -> dict:
    """An assistant message item; ``text`` None: no content part yet (as ``response.output_item.added`` sends it)."""
    parts = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": parts}


def _output(choice: dict, msg_id: str) -> list[dict]:
    """A chat choice as Responses output items: its text as a message, each tool call as a function_call."""
    message = choice["message"]
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    items: list[dict] = []
    if message.get("content") or not message.get("tool_calls"):
        items.append(_text_item(msg_id, message.get("content") or "", status))
    for call in message.get("tool_calls") or []:
        items.append(
            {
                "id": "fc_" + uuid.uuid4().hex[:24],
                "type": "function_call",
                "status": "completed",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
            }
        )
    return items


class _Shape:
    """The Response object's fields that echo the request."""

    def __init__(self, body: dict, model: str, rid: str, chat: dict):
        fmt = (body.get("text") or {}).get("format") or {"type": "text"}
        self.base = {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "temperature": body.get("temperature", DEFAULT_SAMPLING["temperature"]),
            "top_p": body.get("top_p", DEFAULT_SAMPLING["top_p"]),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto" if chat.get("tools") else "none"),
            "tools": body.get("tools") or [],
            "text": {"format": fmt},
            "reasoning": {"effort": None, "summary": None},
            "previous_response_id": None,
            "store": False,
            "truncation": "disabled",
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
            "error": None,
            "incomplete_details": None,
            "usage": None,
        }

    def response(self, status: str, output: list[dict], usage: dict | None) -> dict:
        out = {**self.base, "status": status, "output": output, "usage": usage}
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        return out


async def create_response(routes: Routes, request: Request) -> Response:
    """``POST /v1/responses``."""
    t0 = time.perf_counter()
    model = ""
    span = ServerSpan(routes.tracer, request, "chat", ROUTE, routes._provider("llm"))
    try:
        body = await read_json(request, routes.config.max_body_bytes)
        entry = routes.entry(body, "llm")
        model = entry.name
        span.model(model, entry.provider, body.get("stream", False) is True)
        try:
            chat = chat_body(body, model)
            opts, stream, _include, what = parse_generation(chat, entry, "chat")
        except APIError as exc:
            exc.param = _param(exc.param)
            raise
        messages = cast("list[dict]", what)
        if entry.images is not None:
            await routes._decode_images(messages)
        shape = ReplyShape("chat", tools=bool(opts.get("tools")))
        grammar_param = "tools" if shape.tools else "text.format"
        jobs = routes.submit_jobs(entry, "chat", [messages], stream, opts, span, grammar_param)
        events = _Events(jobs, request.receive)
        streaming = False
        done = False
        try:
            early: list[tuple[int, str, Any]] = []
            while True:  # the job's first event: "started", or "error" (a prompt too long)
                _i, kind, value = await events.get()
                if kind == "started":
                    break
                if kind == "disconnected":
                    return routes._abandoned(span, ROUTE, model)
                if kind == "error":
                    err = grammar_error(backend_error(value, "messages"), value, grammar_param)
                    err.param = _param(err.param)
                    raise err
                early.append((_i, kind, value))
            rid = "resp_" + uuid.uuid4().hex[:24]
            span.set("gen_ai.response.id", rid)
            echo = _Shape(body, model, rid, chat)
            if stream:
                if await events.unwatch():
                    return routes._abandoned(span, ROUTE, model)
                streaming = True
                return StreamingResponse(
                    _sse(routes, events, early, entry, echo, span, t0, shape),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                )
            pieces: list[str] = []
            last: dict | None = None
            while last is None:
                _i, kind, value = early.pop(0) if early else await events.get()
                if kind == "chunk":
                    pieces.append(value)
                elif kind == "disconnected":
                    return routes._abandoned(span, ROUTE, model)
                elif kind == "error":
                    raise backend_error(value, "input")
                elif kind == "done":
                    last = value
            done = True
        except asyncio.CancelledError:
            span.end(None, "cancelled", "client disconnected before the response", cancelled=True)
            raise
        finally:
            if not streaming:
                events.close(cancel=not done)
        usage = routes._finish(entry, "chat", span, [last], t0)
        choice = shape.choice(0, "".join(pieces), last)
        status = "incomplete" if finish_reason(last) == "length" else "completed"
        span.end(200)
        routes._count(ROUTE, model, 200)
        return JSONResponse(echo.response(status, _output(choice, "msg_" + uuid.uuid4().hex[:24]), _usage(usage)))
    except APIError as exc:
        span.end(exc.status, exc.code or exc.type, exc.message)
        routes._count(ROUTE, model, exc.status)
        return exc.response()
    except Exception as exc:  # the guard answers 500: the span says so
        span.end(500, "server_error", f"{type(exc).__name__}: {exc}")
        raise


async def _sse(
    routes: Routes,
    events: _Events,
    early: list[tuple[int, str, Any]],
    entry: ModelEntry,
    echo: _Shape,
    span: ServerSpan,
    t0: float,
    shape: ReplyShape,
):
    """The Responses stream: each event as ``event: TYPE`` and ``data: JSON`` with its sequence number."""
    model = entry.name
    seq = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        data = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return f"event: {kind}\ndata: ".encode() + json.dumps(data, separators=(",", ":")).encode("utf-8") + b"\n\n"

    msg_id = "msg_" + uuid.uuid4().hex[:24]
    finished = False
    last: dict | None = None
    try:
        yield event("response.created", response=echo.response("in_progress", [], None))
        yield event("response.in_progress", response=echo.response("in_progress", [], None))
        text: list[str] = []
        opened = False
        first = True
        while last is None:
            _i, kind, value = early.pop(0) if early else await events.get()
            if kind == "chunk":
                if first:
                    span.set("gen_ai.response.time_to_first_chunk", time.perf_counter() - t0)
                    first = False
                text.append(value)
                if shape.tools:  # held: a tool-call reply is read when it is complete
                    continue
                if not opened:
                    opened = True
                    yield event(
                        "response.output_item.added", output_index=0, item=_text_item(msg_id, None, "in_progress")
                    )
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    yield event(
                        "response.content_part.added", item_id=msg_id, output_index=0, content_index=0, part=part
                    )
                yield event(
                    "response.output_text.delta",
                    item_id=msg_id,
                    output_index=0,
                    content_index=0,
                    delta=value,
                    logprobs=[],
                )
            elif kind == "error":
                err = backend_error(value, "messages")
                yield event("error", code=err.code or err.type, message=err.message, param=_param(err.param))
                span.end(200, err.code or err.type, err.message, error_type=err.code or err.type)
                routes._count(ROUTE, model, err.status)
                finished = True
                return
            elif kind == "disconnected":
                return
            elif kind == "done":
                last = value
        usage = _usage(routes._finish(entry, "chat", span, [last], t0))
        choice = shape.choice(0, "".join(text), last)
        output = _output(choice, msg_id)
        for index, item in enumerate(output):
            if item["type"] == "message":
                whole = item["content"][0]["text"] if item["content"] else ""
                if not opened:  # (nothing was streamed: tools on, or an empty reply)
                    yield event(
                        "response.output_item.added", output_index=index, item=_text_item(msg_id, None, "in_progress")
                    )
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    yield event(
                        "response.content_part.added", item_id=msg_id, output_index=index, content_index=0, part=part
                    )
                    if whole:
                        yield event(
                            "response.output_text.delta",
                            item_id=msg_id,
                            output_index=index,
                            content_index=0,
                            delta=whole,
                            logprobs=[],
                        )
                yield event(
                    "response.output_text.done",
                    item_id=msg_id,
                    output_index=index,
                    content_index=0,
                    text=whole,
                    logprobs=[],
                )
                part = {"type": "output_text", "text": whole, "annotations": [], "logprobs": []}
                yield event(
                    "response.content_part.done", item_id=msg_id, output_index=index, content_index=0, part=part
                )
            else:  # a function call, whole
                pending = {**item, "status": "in_progress", "arguments": ""}
                yield event("response.output_item.added", output_index=index, item=pending)
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=item["arguments"],
                )
                yield event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            yield event("response.output_item.done", output_index=index, item=item)
        status = "incomplete" if finish_reason(last) == "length" else "completed"
        yield event(f"response.{status}", response=echo.response(status, output, usage))
        finished = True
        span.end(200)
        routes._count(ROUTE, model, 200)
    finally:
        events.close(cancel=not finished or last is None)
        if not finished:
            routes.metrics.cancelled.inc(model=model)
            span.end(200, "cancelled", "client disconnected before the end of the stream", cancelled=True)
            routes._count(ROUTE, model, 499)


__all__ = ["chat_body", "create_response"]
