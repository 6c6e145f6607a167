# SPDX-License-Identifier: Apache-2.0
"""The route handlers of ``edgesdk serve``: chat and text completions (streamed as Server-Sent Events or
whole), embeddings, the model list, health, ``/metrics`` and ``/openapi.json``.

:class:`Routes` holds what the handlers share (the served models, the settings, the metrics, the tracer, the
draining flag); :mod:`edgesdk.serve.app` adds the lifecycle and the middleware around it. Request bodies
are parsed and replies shaped by :mod:`edgesdk.serve.protocol`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from typing import Any, cast

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from edgesdk import __version__
from edgesdk.errors import EdgeSDKError, InputError
from edgesdk.runtime.requests import GenerationRequest
from edgesdk.serve.batch_worker import BatchWorker
from edgesdk.serve.config import ModelEntry, ServeConfig
from edgesdk.serve.protocol import (
    APIError,
    ReplyShape,
    backend_error,
    finish_reason,
    grammar_error,
    parse_embeddings,
    parse_generation,
    read_json,
    saturated_error,
)
from edgesdk.serve.workers import Job, Saturated
from edgesdk.telemetry.serve_metrics import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from edgesdk.telemetry.serve_metrics import ServerMetrics
from edgesdk.telemetry.serve_spans import ServerSpan, serve_tracer


async def _until_disconnected(receive, job: Job) -> None:
    """Wait for the ASGI ``http.disconnect`` of a request whose body has been read, then cancel ``job``
    (the worker checks between tokens; a queued job is skipped) and wake the handler waiting on it."""
    while (await receive())["type"] != "http.disconnect":
        pass
    job.cancel.set()
    job.events.put_nowait(("disconnected", None))


class Routes:
    """The handlers over the served models (``models``), with the state they share."""

    def __init__(self, entries: list[ModelEntry], config: ServeConfig):
        self.models = {e.name: e for e in entries}
        self.config = config
        self.metrics = ServerMetrics()
        self.openapi_doc: dict = {}  # create_app sets it from the routes and REQUEST_FIELDS
        for e in entries:
            self.metrics.model(e.name, e.provider)
        self.draining = False
        self.tracer = serve_tracer(config.tracer_provider)

    # -- helpers
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
        span = ServerSpan(self.tracer, request, operation, route, self._provider("llm"))
        try:
            body = await read_json(request, self.config.max_body_bytes)
            entry = self.entry(body, "llm")
            model = entry.name
            span.model(model, entry.provider, body.get("stream", False) is True)
            opts, stream, include_usage, what = parse_generation(body, entry, operation)
            where = "messages" if operation == "chat" else "prompt"
            shape = ReplyShape(operation, tools=bool(opts.get("tools")), logprobs="logprobs" in opts)
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
                raise backend_error(exc, where) from None
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
                raise saturated_error(exc) from None
            # Nothing else reads from the client until the response starts: watch for it going away, so a
            # request abandoned while queued or generating stops at the next token (a stream is watched
            # by StreamingResponse once it starts).
            watch = loop.create_task(_until_disconnected(request.receive, job))
            try:
                kind, value = await job.events.get()  # "started", or "error" before the first token
                if kind == "disconnected":
                    return self._abandoned(span, route, model)
                if kind == "error":
                    raise grammar_error(backend_error(value, where), value, grammar_param)
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
                        raise backend_error(value, where)
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
            finish = finish_reason(last)
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

    async def _generate_many(self, request: Request, entry: ModelEntry, span: ServerSpan, opts: dict, stream: bool,
                             include_usage: bool, prompts: tuple, shape: ReplyShape, t0: float) -> Response:
        """/v1/completions with several prompts: one job each, submitted together (the batching engine decodes
        them side by side), one choice each with its ``index``; streamed, the chunks of all choices interleave."""
        route, model, session = "/v1/completions", entry.name, entry.session
        try:
            reqs = [GenerationRequest.from_options(**({"prompt": p} if isinstance(p, str) else {"prompt_tokens": p}),
                                                   stream=stream, **opts) for p in prompts]
        except EdgeSDKError as exc:
            raise backend_error(exc, "prompt") from None
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
            raise saturated_error(exc) from None
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
                        raise backend_error(value, "prompt")
                    if kind == "chunk":
                        texts[i] += value
                    elif kind == "done":
                        lasts[i] = value
            except asyncio.CancelledError:
                stop()
                raise
            watcher.cancel()
            choices = [{"index": i, "text": texts[i], "finish_reason": finish_reason(last or {}),
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
                    raise backend_error(value, "prompt")
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
                        err = backend_error(value, "prompt")
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
                                                         "finish_reason": finish_reason(value)}]})
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

    def _abandoned(self, span: ServerSpan, route: str, model: str) -> Response:
        """The client went away before the response (``http.disconnect``): the job is cancelled already."""
        self.metrics.cancelled.inc(model=model)
        span.end(None, "cancelled", "client disconnected before the response", cancelled=True)
        self._count(route, model, 499)
        return Response(status_code=499)  # nobody reads it: the connection is gone

    def _finish(self, entry: ModelEntry, operation: str, span: ServerSpan, last: dict, t0: float) -> dict:
        n_in, n_out = int(last.get("input_tokens") or 0), int(last.get("output_tokens") or 0)
        span.set("gen_ai.usage.input_tokens", n_in)
        span.set("gen_ai.usage.output_tokens", n_out)
        span.set("gen_ai.response.finish_reasons", [finish_reason(last)])
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

    async def _sse(self, job: Job, entry: ModelEntry, operation: str, rid: str, span: ServerSpan, t0: float,
                   include_usage: bool, route: str, shape: ReplyShape | None = None):
        created = int(time.time())
        model = entry.name
        obj = "chat.completion.chunk" if operation == "chat" else "text_completion"
        base = {"id": rid, "object": obj, "created": created, "model": model,
                "system_fingerprint": f"edgesdk-{__version__}"}

        shape = shape or ReplyShape(operation)
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
                    err = backend_error(value, "messages" if operation == "chat" else "prompt")
                    payload = {"error": {"message": err.message, "type": err.type, "param": err.param,
                                         "code": err.code}}
                    yield b"data: " + json.dumps(payload).encode("utf-8") + b"\n\n"
                    span.end(200, err.code or err.type, err.message, error_type=err.code or err.type)
                    self._count(route, model, err.status)
                    finished = True
                    return
                else:
                    usage = self._finish(entry, operation, span, value, t0)
                    finish = finish_reason(value)
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
        span = ServerSpan(self.tracer, request, "embeddings", route, self._provider("embedding"))
        try:
            body = await read_json(request, self.config.max_body_bytes)
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
                raise saturated_error(exc) from None
            except EdgeSDKError as exc:
                raise backend_error(exc, "input") from None
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

