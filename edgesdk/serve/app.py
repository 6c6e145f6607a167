# SPDX-License-Identifier: Apache-2.0
"""The ASGI application (Starlette): OpenAI-compatible routes over loaded edgesdk sessions.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (LLM bundles; ``"stream": true`` is
Server-Sent Events), ``POST /v1/embeddings`` (text-encoder bundles), ``GET /v1/models``,
``GET /v1/models/{id}``, ``GET /health``, ``GET /metrics`` (Prometheus text), ``GET /openapi.json``
(the OpenAPI 3.1 document, :mod:`edgesdk.serve.openapi`). Errors use OpenAI's
shape ``{"error": {"message", "type", "param", "code"}}``.

Nothing in a request names a file: ``model`` is looked up in the table of bundles given at start-up.

This module is the app itself: the server's lifecycle (workers started with the app, drained when it stops)
and the middleware in front of every route (Host allow-list, API key, draining, the catch-all 500). The
settings and model entries are :mod:`edgesdk.serve.config`, the request fields :mod:`edgesdk.serve.fields`,
request parsing and errors :mod:`edgesdk.serve.protocol`, reply shapes :mod:`edgesdk.serve.replies`, the
handlers :mod:`edgesdk.serve.routes`.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import re
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from edgesdk.runtime.backend import BatchingBackend
from edgesdk.serve import operational
from edgesdk.serve.batch_worker import BatchWorker, decide_parallel
from edgesdk.serve.config import (
    HOST_NAME,
    ModelEntry,
    ServeConfig,
    host_allowed,
    host_name,
)
from edgesdk.serve.fields import REQUEST_FIELDS
from edgesdk.serve.openapi import openapi_document
from edgesdk.serve.protocol import APIError
from edgesdk.serve.responses import create_response
from edgesdk.serve.routes import Routes
from edgesdk.serve.workers import EmbeddingBatcher, LLMWorker
from edgesdk.telemetry.serve_spans import HTTPSpan, untraced_patterns

__all__ = [
    "create_app",
    "llm_parallel",
    "prompt_cache_mb",
]


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
        return 1, "1 (--parallel 1: one slot of the engine, one request at a time)"
    if not isinstance(session.backend, BatchingBackend):
        return 1, "1 (this backend has no continuous batching: one request at a time)"
    return decide_parallel(session, requested)


# ------------------------------------------------------------------------------ the app
class _Server(Routes):
    """The handlers' state with the server's lifecycle (:meth:`start`, :meth:`stop`) and what the middleware
    asks of it (:meth:`authorized`, the allowed hosts, the untraced URLs)."""

    def __init__(self, entries: list[ModelEntry], config: ServeConfig):
        super().__init__(entries, config)
        self.untraced = untraced_patterns(config.untraced)
        self._api_key = config.api_key.encode("utf-8") if config.api_key else None
        bind = config.host.strip().lower().rstrip(".")  # a server bound to a name answers to it
        self.allowed_hosts = config.allowed_hosts + ((bind,) if HOST_NAME.match(bind) else ())

    # -- lifecycle
    def start(self) -> None:
        if getattr(self, "_device_metrics", None) is None:  # hw.* beside the GenAI figures on /metrics
            from edgesdk.profiler.device_metrics import observe

            self._device_metrics = observe(self.metrics.provider)
        for e in self.models.values():
            if e.kind == "llm" and e.worker is None:
                if e.parallel is None:
                    e.parallel, e.parallel_reason = llm_parallel(e.session, self.config.parallel)
                self.metrics.slots.set(e.parallel, model=e.name)
                backend = e.session.backend
                if isinstance(backend, BatchingBackend):  # a GGUF: its engine, at any slot count
                    # one slot: the prefix of the last request is kept with --prompt-cache-mb (or the profile's
                    # policy.llm.prompt_cache_mb) > 0, else every prompt is evaluated whole, as edgesdk run does
                    reuse = (
                        self.config.prefix_reuse
                        if e.parallel > 1
                        else self.config.prefix_reuse and prompt_cache_mb(e.session, self.config.prompt_cache_mb) > 0
                    )
                    batch = BatchWorker(
                        e.name,
                        e.session,
                        slots=e.parallel,
                        max_queue=self.config.max_queue,
                        reuse_prefix=reuse,
                        reason=e.parallel_reason,
                        request_timeout_s=self.config.request_timeout_s,
                    )
                    e.worker = batch
                    self.metrics.queue_depth.set_function(functools.partial(getattr, batch, "depth"), model=e.name)
                    self.metrics.slots_busy.set_function(functools.partial(getattr, batch, "busy"), model=e.name)
                    continue
                e.worker = LLMWorker(  # a backend without an engine (VLM): one request at a time
                    e.name,
                    e.session,
                    self.config.max_queue,
                    on_depth=functools.partial(self.metrics.queue_depth.set, model=e.name),
                    request_timeout_s=self.config.request_timeout_s,
                )
            elif e.kind == "embedding" and e.batcher is None:
                e.batcher = EmbeddingBatcher(
                    e.name,
                    e.session,
                    max_batch=self.config.max_batch,
                    max_wait_ms=self.config.max_wait_ms,
                    max_pending=self.config.max_pending_embeddings,
                    on_batch=functools.partial(self.metrics.batch_size.observe, model=e.name),
                )

    async def stop(self, timeout_s: float = 10.0) -> None:
        self.draining = True
        device_metrics, self._device_metrics = getattr(self, "_device_metrics", None), None
        if device_metrics is not None:
            device_metrics.close()
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

    # -- for the middleware
    def authorized(self, headers: dict) -> bool:
        if self._api_key is None:
            return True
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else ""
        return hmac.compare_digest(given.encode("utf-8"), self._api_key)


def middleware_stack(
    server: _Server, routes: list[Route], genai: frozenset[str], config: ServeConfig
) -> list[Middleware]:
    """The middleware in front of every route (of the app, and of the start-up's app while models load): the guard,
    and CORS outermost when configured (preflights carry no API key, and refusals need CORS headers too)."""
    middleware = [Middleware(_Guard, server=server, routes=routes, genai=genai)]
    if config.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        middleware.insert(
            0,
            Middleware(
                CORSMiddleware,
                allow_origins=list(config.cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["*"],
                expose_headers=["Retry-After"],
                max_age=600,
            ),
        )
    return middleware


class _Guard:
    """Pure ASGI middleware: the Host allow-list (400/421), API key (constant-time compare), draining (503),
    a catch-all 500 in OpenAI shape, and the SERVER span of every request that no GenAI handler traces
    itself (:class:`HTTPSpan`)."""

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

    def _http_span(self, scope: dict, headers: dict) -> HTTPSpan | None:
        url = f"{scope.get('scheme') or 'http'}://{headers.get('host', '')}{scope.get('path', '')}"
        if any(p.search(url) for p in self.server.untraced):
            return None
        return HTTPSpan(self.server.tracer, scope, headers, self._route(scope))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        refusal = None
        name = host_name(headers.get("host"))
        if name is None:
            refusal = APIError(
                400, f"missing or malformed Host header {headers.get('host')!r}", param="Host", code="invalid_host"
            )
        elif not host_allowed(name, self.server.allowed_hosts):
            refusal = APIError(
                421,
                f"this server does not answer for host {name!r} (start it with --allowed-host {name} to allow it)",
                param="Host",
                code="host_not_allowed",
            )
        elif path not in self.OPEN:
            if not self.server.authorized(headers):
                refusal = APIError(
                    401,
                    "Incorrect API key provided (send 'Authorization: Bearer <key>')",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            elif self.server.draining and path.startswith("/v1/"):
                refusal = APIError(
                    503,
                    "the server is shutting down",
                    "service_unavailable",
                    code="server_shutting_down",
                    headers={"Retry-After": "5"},
                )
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
                scope, receive, send
            )
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
        # llama-server's operational endpoints (serve/operational.py)
        Route("/tokenize", functools.partial(operational.tokenize, server), methods=["POST"]),
        Route("/detokenize", functools.partial(operational.detokenize, server), methods=["POST"]),
        Route("/apply-template", functools.partial(operational.apply_template, server), methods=["POST"]),
        Route("/props", functools.partial(operational.props, server), methods=["GET"]),
        Route("/slots", functools.partial(operational.slots, server), methods=["GET"]),
        Route("/v1/responses", functools.partial(create_response, server), methods=["POST"]),  # serve/responses.py
    ]
    server.openapi_doc = openapi_document(((r.path, r.methods or ()) for r in routes), REQUEST_FIELDS)
    genai = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"})  # own spans
    middleware = middleware_stack(server, routes, genai, config)
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found}, middleware=middleware
    )
    app.state.server = server
    return app
