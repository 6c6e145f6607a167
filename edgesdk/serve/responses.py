# SPDX-License-Identifier: Apache-2.0
"""OpenAI's Responses API (``POST /v1/responses``) over the chat path: a Responses request
(:class:`~edgesdk.serve.schemas.ResponsesRequest`) is read into a chat request (``input`` items -> messages,
``instructions`` -> a system turn first, ``max_output_tokens`` -> max_tokens,
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
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from edgesdk.runtime.requests import DEFAULT_SAMPLING
from edgesdk.serve.protocol import backend_error, grammar_error, parse
from edgesdk.serve.replies import ReplyShape, finish_reason
from edgesdk.serve.routes import _Events
from edgesdk.serve.schemas import ChatCompletionRequest, ResponsesRequest, responses_param, responses_params
from edgesdk.telemetry.serve_spans import ServerSpan

if TYPE_CHECKING:
    from edgesdk.serve.config import ModelEntry
    from edgesdk.serve.routes import Routes

ROUTE = "/v1/responses"


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

    def __init__(self, body: dict, model: str, rid: str, chat: ChatCompletionRequest):
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
            "tool_choice": body.get("tool_choice", "auto" if chat.tools else "none"),
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

    async def handle(body: dict, entry: ModelEntry, span: ServerSpan, t0: float) -> Response:
        model = entry.name
        asked = parse(ResponsesRequest, body)
        req = asked.chat()  # the chat request it generates, checked as chat's: errors name the Responses field
        with responses_params():
            opts, stream, messages = req.options(entry), req.streaming, req.inputs(entry)[0]
        if entry.images is not None:
            await routes._decode_images(messages)
        shape = ReplyShape("chat", tools=bool(opts.get("tools")))
        grammar_param = "tools" if shape.tools else "text.format"
        with responses_params():
            jobs = routes.submit_jobs(entry, "chat", [messages], req, span, grammar_param)
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
                    err.param = responses_param(err.param)
                    raise err
                early.append((_i, kind, value))
            rid = "resp_" + uuid.uuid4().hex[:24]
            span.set("gen_ai.response.id", rid)
            echo = _Shape(body, model, rid, req)
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

    return await routes._served(request, "chat", ROUTE, "llm", handle)


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
                yield event("error", code=err.code or err.type, message=err.message, param=responses_param(err.param))
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


__all__ = ["create_response"]
