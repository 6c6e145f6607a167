# SPDX-License-Identifier: Apache-2.0
"""The route handlers of ``edgesdk serve``: chat and text completions (streamed as Server-Sent Events or
whole), embeddings, the model list, health, ``/metrics`` and ``/openapi.json``.

:class:`Routes` holds what the handlers share (the served models, the settings, the metrics, the tracer, the
draining flag); :mod:`edgesdk.serve.app` adds the lifecycle and the middleware around it. Request bodies
are parsed by :mod:`edgesdk.serve.protocol`, replies shaped by :mod:`edgesdk.serve.replies`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from edgesdk import __version__
from edgesdk.errors import EdgeSDKError, InputError
from edgesdk.serve.batch_worker import BatchWorker
from edgesdk.serve.config import ModelEntry, ServeConfig
from edgesdk.serve.operational import special_prompt_ids
from edgesdk.serve.protocol import APIError, backend_error, grammar_error, parse, read_json, saturated_error
from edgesdk.serve.replies import ReplyShape, ToolCallStream, finish_reason
from edgesdk.serve.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, GenerationBody
from edgesdk.serve.workers import Job, Saturated
from edgesdk.telemetry.serve_metrics import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from edgesdk.telemetry.serve_metrics import ServerMetrics
from edgesdk.telemetry.serve_spans import ServerSpan, serve_tracer


class _Events:
    """The events of a request's generation jobs (one per prompt) as one sequence of ``(index, kind, value)``.
    Until :meth:`unwatch`, the client going away (ASGI ``http.disconnect``) cancels every job (the worker checks
    between tokens; a queued job is skipped) and wakes the reader with a ``disconnected`` event."""

    def __init__(self, jobs: list[Job], receive: Callable[[], Awaitable[Any]]) -> None:
        loop = asyncio.get_running_loop()
        self.jobs = jobs
        self._merged: asyncio.Queue | None = None
        self._pumps: list[asyncio.Task] = []
        if len(jobs) > 1:  # one job is read from its own queue: no second hop per token
            self._merged = asyncio.Queue()
            self._pumps = [loop.create_task(self._pump(i, job, self._merged)) for i, job in enumerate(jobs)]
        # The watch task gets the jobs and the queue, not ``self``: once cancelled, the task keeps its CancelledError,
        # whose traceback keeps this coroutine's frame; a frame holding ``self`` (which holds the task) was a
        # reference cycle per request (issue 25), kept with its jobs and their requests until a full collection.
        self._watch = loop.create_task(self._until_disconnected(jobs, self._merged, receive))

    async def get(self) -> tuple[int, str, Any]:
        if self._merged is None:
            kind, value = await self.jobs[0].events.get()
            return 0, kind, value
        return await self._merged.get()

    @staticmethod
    async def _pump(i: int, job: Job, merged: asyncio.Queue) -> None:
        while True:
            kind, value = await job.events.get()
            merged.put_nowait((i, kind, value))
            if kind in ("done", "error"):
                return

    @staticmethod
    async def _until_disconnected(
        jobs: list[Job], merged: asyncio.Queue | None, receive: Callable[[], Awaitable[Any]]
    ) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        for job in jobs:
            job.cancel.set()
        if merged is None:
            jobs[0].events.put_nowait(("disconnected", None))
        else:
            merged.put_nowait((-1, "disconnected", None))

    async def unwatch(self) -> bool:
        """Stop watching for the disconnect (StreamingResponse watches a stream); True when it came already."""
        self._watch.cancel()
        await asyncio.wait({self._watch})  # (our own cancellation still propagates)
        return any(job.cancel.is_set() for job in self.jobs)

    def close(self, cancel: bool) -> None:
        """Stop watching and reading; ``cancel``: cancel the jobs too (the ones still running stop)."""
        self._watch.cancel()
        for task in self._pumps:
            task.cancel()
        if cancel:
            for job in self.jobs:
                job.cancel.set()


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
            raise APIError(
                404,
                f"The model '{name}' does not exist (served: {', '.join(sorted(self.models))})",
                param="model",
                code="model_not_found",
            )
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
        depth = {
            n: (e.worker.depth if e.worker else e.batcher.depth if e.batcher else 0) for n, e in self.models.items()
        }
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
            return APIError(
                404, f"The model '{request.path_params['model']}' does not exist", param="model", code="model_not_found"
            ).response()
        return JSONResponse(self._model_card(e))

    @staticmethod
    def _model_card(e: ModelEntry) -> dict:
        return {
            "id": e.name,
            "object": "model",
            "created": e.created,
            "owned_by": "edgesdk",
            "edgesdk": {"kind": e.kind, "backend": e.provider},
        }

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat", "/v1/chat/completions")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "text_completion", "/v1/completions")

    async def _generate(self, request: Request, operation: str, route: str) -> Response:
        """A chat or completions request: one generation job per prompt (a chat, or a single prompt: one; a
        completions ``prompt`` that is a list of prompts: one each, submitted together, one choice each)."""

        async def handle(body: dict, entry: ModelEntry, span: ServerSpan, t0: float) -> Response:
            model = entry.name
            req = parse(ChatCompletionRequest if operation == "chat" else CompletionRequest, body)
            opts, stream, include_usage = req.options(entry), req.streaming, req.include_usage
            inputs: list[Any] = req.inputs(entry)  # a chat's messages, or each completions prompt (one choice each)
            if entry.images is not None and operation == "chat":
                await self._decode_images(inputs[0])
            where = "messages" if operation == "chat" else "prompt"
            shape = ReplyShape(operation, tools=bool(opts.get("tools")), logprobs="logprobs" in opts)
            grammar_param = "tools" if shape.tools else "response_format"
            if operation != "chat" and entry.images is None:  # special tokens in the text, as llama-server reads them
                inputs = [await special_prompt_ids(entry, x) if isinstance(x, str) else x for x in inputs]
            jobs = self.submit_jobs(entry, operation, inputs, req, span, grammar_param)
            # Nothing else reads from the client until the response starts: watch for it going away, so a
            # request abandoned while queued or generating stops at the next token (a stream is watched
            # by StreamingResponse once it starts).
            events = _Events(jobs, request.receive)
            streaming = False
            pieces: list[list[str]] = [[] for _ in jobs]
            lasts: list[dict | None] = [None] * len(jobs)
            try:
                early: list[tuple[int, str, Any]] = []  # pieces of a started job while others have not started
                started = 0
                while started < len(jobs):  # each job's first event: "started", or "error" (a prompt too long)
                    i, kind, value = await events.get()
                    if kind == "started":
                        started += 1
                    elif kind == "disconnected":
                        return self._abandoned(span, route, model)
                    elif kind == "error":
                        raise grammar_error(backend_error(value, where), value, grammar_param)
                    else:
                        early.append((i, kind, value))
                rid = ("chatcmpl-" if operation == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
                span.set("gen_ai.response.id", rid)
                if stream:
                    if await events.unwatch():  # it saw the disconnect just before it was stopped
                        return self._abandoned(span, route, model)
                    streaming = True
                    return StreamingResponse(
                        self._sse(events, early, entry, operation, rid, span, t0, include_usage, route, shape),
                        media_type="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                    )
                while None in lasts:
                    i, kind, value = early.pop(0) if early else await events.get()
                    if kind == "chunk":
                        pieces[i].append(value)
                    elif kind == "disconnected":
                        return self._abandoned(span, route, model)
                    elif kind == "error":
                        raise backend_error(value, where)
                    elif kind == "done":  # it holds the log-probabilities too
                        lasts[i] = value
            except asyncio.CancelledError:
                span.end(None, "cancelled", "client disconnected before the response", cancelled=True)
                raise
            finally:
                if not streaming:  # (a stream's generator closes them)
                    events.close(cancel=None in lasts)
            done = cast("list[dict]", lasts)
            usage = self._finish(entry, operation, span, done, t0)
            choices = [shape.choice(i, "".join(p), last) for i, (p, last) in enumerate(zip(pieces, done, strict=True))]
            span.end(200)
            self._count(route, model, 200)
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion" if operation == "chat" else "text_completion",
                    "created": int(time.time()),
                    "model": model,
                    "system_fingerprint": f"edgesdk-{__version__}",
                    "choices": choices,
                    "usage": usage,
                }
            )

        return await self._served(request, operation, route, "llm", handle)

    def submit_jobs(
        self,
        entry: ModelEntry,
        operation: str,
        inputs: list,
        req: GenerationBody,
        span: ServerSpan,
        grammar_param: str,
    ) -> list[Job]:
        """One generation job per input (chat messages, prompt text or prompt token ids) of ``req``, submitted to
        the model's worker; APIError 400 for what the worker cannot do, 429/503 when it is full or draining."""
        model = entry.name
        opts = req.options(entry)
        needs_engine = [k for k in ("grammar", "logprobs") if k in opts]
        if needs_engine and not isinstance(entry.worker, BatchWorker):
            param = grammar_param if needs_engine[0] == "grammar" else "logprobs"
            how = "a VLM bundle always is" if entry.images is not None else "serve --parallel 2 or more"
            raise APIError(
                400,
                f"'{param}' needs continuous batching, and {model!r} is served one request at a time ({how})",
                param=param,
                code="unsupported_parameter",
            )
        requests = [req.to_generation_request(entry, x) for x in inputs]
        session = entry.session
        span.set("gen_ai.request.max_tokens", opts["max_tokens"])
        span.set("gen_ai.request.temperature", opts.get("temperature"))
        span.set("gen_ai.request.top_p", opts.get("top_p"))
        span.set("gen_ai.request.seed", opts.get("seed"))
        span.set("gen_ai.request.top_k", opts.get("top_k"))
        span.set("gen_ai.request.frequency_penalty", opts.get("frequency_penalty"))
        span.set("gen_ai.request.presence_penalty", opts.get("presence_penalty"))
        loop = asyncio.get_running_loop()
        assert entry.worker is not None  # created in start() for every llm entry
        jobs: list[Job] = []
        try:
            for x, one in zip(inputs, requests, strict=True):
                start = (
                    functools.partial(session.chat, x, stream=True, **opts)
                    if operation == "chat"
                    else functools.partial(session.stream, x, **opts)
                )
                job = Job(start=start, loop=loop, events=asyncio.Queue(), otel_ctx=span.ctx, request=one)
                entry.worker.submit(job)
                jobs.append(job)
        except Saturated as exc:
            for job in jobs:
                job.cancel.set()
            self.metrics.rejected.inc(model=model, reason="draining" if exc.draining else "queue_full")
            raise saturated_error(exc) from None
        return jobs

    @staticmethod
    async def _decode_images(messages: list[dict]) -> None:
        """A VLM request's images, checked from their headers by parse_generation, decoded on a thread: a request
        of many large images no longer holds the event loop (every other client and /health) while it decodes."""
        from edgesdk.serve.images import ImageError, decode_images, pending_images

        if not pending_images(messages):
            return
        try:
            await asyncio.to_thread(decode_images, messages)
        except ImageError as exc:
            raise APIError(400, str(exc), param=exc.param) from None

    async def _served(
        self,
        request: Request,
        operation: str,
        route: str,
        kind: str,
        handle: Callable[[dict, ModelEntry, ServerSpan, float], Awaitable[Response]],
    ) -> Response:
        """One API request's frame, for every route that answers from a model: its SERVER span (``t0``: when it
        came), its body and the model of ``kind`` it names (:meth:`_read`), ``handle``'s answer, and an error
        raised on the way answered by :meth:`_failed` (which ends the span and counts the request)."""
        t0 = time.perf_counter()
        model = ""
        span = ServerSpan(self.tracer, request, operation, route, self._provider(kind))
        try:
            body, entry = await self._read(request, span, kind)
            model = entry.name
            return await handle(body, entry, span, t0)
        except Exception as exc:
            return self._failed(span, route, model, exc)

    async def _read(self, request: Request, span: ServerSpan, kind: str) -> tuple[dict, ModelEntry]:
        """A request's JSON body and the model of ``kind`` it names, set on its span (an LLM's with the body's
        ``stream``)."""
        body = await read_json(request, self.config.max_body_bytes)
        entry = self.entry(body, kind)
        span.model(entry.name, entry.provider, body.get("stream", False) is True if kind == "llm" else None)
        return body, entry

    def _failed(self, span: ServerSpan, route: str, model: str, exc: Exception) -> Response:
        """A request that raised: an APIError is its answer (span ended and request counted with its status); any
        other error is raised again for the guard to answer 500, the span ended as a server error first."""
        if not isinstance(exc, APIError):
            span.end(500, "server_error", f"{type(exc).__name__}: {exc}")
            raise exc
        span.end(exc.status, exc.code or exc.type, exc.message)
        self._count(route, model, exc.status)
        return exc.response()

    def _abandoned(self, span: ServerSpan, route: str, model: str) -> Response:
        """The client went away before the response (``http.disconnect``): the job is cancelled already."""
        self.metrics.cancelled.inc(model=model)
        span.end(None, "cancelled", "client disconnected before the response", cancelled=True)
        self._count(route, model, 499)
        return Response(status_code=499)  # nobody reads it: the connection is gone

    def _finish(self, entry: ModelEntry, operation: str, span: ServerSpan, lasts: list[dict], t0: float) -> dict:
        """The metrics of each finished generation of a request (one per prompt), and the request's usage (the
        span's and the response's: sums over the prompts)."""
        m, labels = self.metrics, {"gen_ai_operation_name": operation, "gen_ai_request_model": entry.name}
        caching = entry.prompt_cache is not None or (isinstance(entry.worker, BatchWorker) and self.config.prefix_reuse)
        n_in = n_out = cached = drafted_all = accepted_all = 0
        for last in lasts:
            i_in, i_out = int(last.get("input_tokens") or 0), int(last.get("output_tokens") or 0)
            n_in, n_out, cached = n_in + i_in, n_out + i_out, cached + int(last.get("cached_tokens") or 0)
            m.duration.observe(time.perf_counter() - t0, **labels)
            first, end = last.get("first_token_at"), last.get("last_token_at")
            if first:
                m.ttft.observe(max(0.0, first - t0), **labels)
                if end and i_out > 1:
                    m.tpot.observe((end - first) / (i_out - 1), **labels)
            drafted = int(last.get("drafted_tokens") or 0)
            if drafted:  # speculative decoding: what it drafted and what the model kept
                accepted = int(last.get("accepted_tokens") or 0)
                drafted_all, accepted_all = drafted_all + drafted, accepted_all + accepted
                m.speculative_tokens.inc(drafted, model=entry.name, kind="drafted")
                m.speculative_tokens.inc(accepted, model=entry.name, kind="accepted")
            m.tokens.inc(i_in, gen_ai_request_model=entry.name, gen_ai_token_type="input")
            m.tokens.inc(i_out, gen_ai_request_model=entry.name, gen_ai_token_type="output")
        span.set("gen_ai.usage.input_tokens", n_in)
        span.set("gen_ai.usage.output_tokens", n_out)
        span.set("gen_ai.response.finish_reasons", [finish_reason(last) for last in lasts])
        span.set("gen_ai.response.model", entry.name)
        usage: dict = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        if caching:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}  # OpenAI's field for reused prompt tokens
            span.set("gen_ai.usage.cache_read.input_tokens", cached)
            m.cached_tokens.inc(cached, model=entry.name)
            if entry.prompt_cache is not None:
                m.cache_bytes.set(entry.prompt_cache.stats()["bytes"], model=entry.name)
        if drafted_all:  # speculative decoding, in OpenAI's fields for predicted tokens kept and dropped
            usage["completion_tokens_details"] = {
                "accepted_prediction_tokens": accepted_all,
                "rejected_prediction_tokens": drafted_all - accepted_all,
            }
        return usage

    async def _sse(
        self,
        events: _Events,
        early: list[tuple[int, str, Any]],
        entry: ModelEntry,
        operation: str,
        rid: str,
        span: ServerSpan,
        t0: float,
        include_usage: bool,
        route: str,
        shape: ReplyShape,
    ):
        """The Server-Sent Events of a streamed request: each choice's pieces as they come (the choices of
        several prompts interleave), its finish, then the usage (``include_usage``) and ``[DONE]``."""
        model = entry.name
        obj = "chat.completion.chunk" if operation == "chat" else "text_completion"
        base = {
            "id": rid,
            "object": obj,
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": f"edgesdk-{__version__}",
        }
        n = len(events.jobs)
        lp_pending: list[list] = [[] for _ in range(n)]  # token log-probabilities not sent yet
        sent_chars = [0] * n  # completions: text_offset of the next piece
        calls = [ToolCallStream(shape) for _ in range(n)] if shape.tools else []  # tool-call replies
        lasts: list[dict | None] = [None] * n
        usage: dict = {}

        def event(i: int, delta: dict, finish: str | None = None) -> bytes:
            lps = None
            if lp_pending[i] and shape.logprobs:
                lps = shape.logprobs_of(lp_pending[i], sent_chars[i])
                lp_pending[i] = []
            sent_chars[i] += len(delta.get("content") or "")
            if operation == "chat":
                choice = {"index": i, "delta": delta, "logprobs": lps, "finish_reason": finish}
            else:
                choice = {"index": i, "text": delta.get("content", ""), "logprobs": lps, "finish_reason": finish}
            payload: dict = {**base, "choices": [choice]}
            if include_usage:
                payload["usage"] = None
            return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"

        finished = False
        try:
            if operation == "chat":
                yield event(0, {"role": "assistant", "content": ""})
            first_chunk = True
            while None in lasts:
                i, kind, value = early.pop(0) if early else await events.get()
                if kind == "logprobs":
                    lp_pending[i].extend(value)
                elif kind == "chunk":
                    if first_chunk:
                        span.set("gen_ai.response.time_to_first_chunk", time.perf_counter() - t0)
                        first_chunk = False
                    if calls:
                        for delta in calls[i].feed(value):
                            yield event(i, delta)
                    else:
                        yield event(i, {"content": value})
                elif kind == "error":
                    err = backend_error(value, "messages" if operation == "chat" else "prompt")
                    payload = {
                        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
                    }
                    yield b"data: " + json.dumps(payload).encode("utf-8") + b"\n\n"
                    span.end(200, err.code or err.type, err.message, error_type=err.code or err.type)
                    self._count(route, model, err.status)
                    finished = True
                    return
                elif kind == "disconnected":
                    return
                elif kind == "done":
                    lasts[i] = value
                    if None not in lasts:
                        usage = self._finish(entry, operation, span, cast("list[dict]", lasts), t0)
                    finish = finish_reason(value)
                    if calls:  # what is left of a tool-call reply (all of it when it was held)
                        deltas, finish = calls[i].end(finish)
                        for delta in deltas:
                            yield event(i, delta)
                    yield event(i, {}, finish=finish)
            if include_usage:
                yield (
                    b"data: "
                    + json.dumps({**base, "choices": [], "usage": usage}, separators=(",", ":")).encode("utf-8")
                    + b"\n\n"
                )
            yield b"data: [DONE]\n\n"
            finished = True
            span.end(200)
            self._count(route, model, 200)
        finally:
            events.close(cancel=not finished or None in lasts)  # the client went away (or an error ended it)
            if not finished:
                self.metrics.cancelled.inc(model=model)
                span.end(200, "cancelled", "client disconnected before the end of the stream", cancelled=True)
                self._count(route, model, 499)

    async def embeddings(self, request: Request) -> Response:
        route = "/v1/embeddings"

        async def handle(body: dict, entry: ModelEntry, span: ServerSpan, t0: float) -> Response:
            model = entry.name
            parsed = parse(EmbeddingRequest, body)
            inputs, fmt, dims = parsed.inputs, parsed.encoding_format or "float", parsed.dimensions
            if not isinstance(inputs[0], str):  # token ids: in this model's vocabulary, before they share a batch
                try:
                    entry.session.count_tokens(inputs)
                except EdgeSDKError as exc:
                    raise APIError(
                        400, exc.one_line() if isinstance(exc, InputError) else str(exc), param="input"
                    ) from None
            assert entry.batcher is not None  # created in start() for every embedding entry
            try:
                emb, counts = await entry.batcher.embed(inputs, otel_ctx=span.ctx)
            except Saturated as exc:
                self.metrics.rejected.inc(model=model, reason="draining" if exc.draining else "queue_full")
                raise saturated_error(exc) from None
            except EdgeSDKError as exc:
                raise backend_error(exc, "input") from None
            if dims is not None and dims != emb.shape[1]:
                raise APIError(
                    400, f"'dimensions' must be {emb.shape[1]} for {model!r} (no truncation)", param="dimensions"
                )
            n_tokens = int(sum(counts))
            data = []
            for i, vec in enumerate(np.asarray(emb, dtype=np.float32)):
                value = (
                    base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii") if fmt == "base64" else vec.tolist()
                )
                data.append({"object": "embedding", "index": i, "embedding": value})
            span.set("gen_ai.usage.input_tokens", n_tokens)
            span.set("gen_ai.embeddings.dimension.count", int(emb.shape[1]))
            span.set("gen_ai.response.model", model)
            self.metrics.duration.observe(
                time.perf_counter() - t0, gen_ai_operation_name="embeddings", gen_ai_request_model=model
            )
            self.metrics.tokens.inc(n_tokens, gen_ai_request_model=model, gen_ai_token_type="input")
            span.end(200)
            self._count(route, model, 200)
            return JSONResponse(
                {
                    "object": "list",
                    "data": data,
                    "model": model,
                    "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                }
            )

        return await self._served(request, "embeddings", route, "embedding", handle)
