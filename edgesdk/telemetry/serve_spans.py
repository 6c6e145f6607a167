# SPDX-License-Identifier: Apache-2.0
"""The SERVER spans of ``edgesdk serve`` (moved here from serve/app.py: telemetry/ is the one place that
imports OpenTelemetry).

:class:`ServerSpan` is a GenAI request's span (``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``): HTTP server attributes (HTTP semantic conventions) plus GenAI ones, parent from the
client's ``traceparent``. :class:`HTTPSpan` is every other request's span (``/metrics``, ``/v1/models``,
a 404, a 405, a GenAI route refused before its handler ran). :func:`untraced_patterns` says which URLs
get no plain HTTP span. :func:`attach_context` / :func:`detach_context` carry a request's context to the
worker thread that runs it (so the runtime's spans are children of the SERVER span). Nothing here imports
Starlette: a request is anything with ``.headers`` (a mapping) and ``.scope`` (the ASGI scope).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from edgesdk import __version__
from edgesdk.errors import InputError

HTTP_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE", "QUERY"})
DEFAULT_UNTRACED = ("/health$",)  # probes: a span per liveness/readiness check is noise (docs/serve.md)


def http_attributes(scope: Mapping[str, Any], user_agent: str | None) -> dict:
    """HTTP server span attributes (OpenTelemetry HTTP semantic conventions) of an ASGI request scope.
    A method outside the conventions' list is recorded as ``_OTHER`` with the original alongside."""
    method = str(scope.get("method") or "")
    attrs: dict = {
        "http.request.method": method if method in HTTP_METHODS else "_OTHER",
        "url.path": str(scope.get("path") or "/"),
        "url.scheme": str(scope.get("scheme") or "http"),
    }
    if method not in HTTP_METHODS:
        attrs["http.request.method_original"] = method[:64]
    if scope.get("http_version"):
        attrs["network.protocol.version"] = str(scope["http_version"])
    server = scope.get("server") or (None, None)
    client = scope.get("client") or (None, None)
    if server[0]:
        attrs["server.address"] = str(server[0])
        if server[1] is not None:
            attrs["server.port"] = int(server[1])
    if client[0]:
        attrs["client.address"] = str(client[0])
        if client[1]:
            attrs["client.port"] = int(client[1])
    if user_agent:
        attrs["user_agent.original"] = user_agent[:256]
    return attrs


def untraced_patterns(configured: tuple[str, ...] | None = None) -> tuple[re.Pattern, ...]:
    """Which requests get no plain HTTP span: ``configured`` when given, else the comma-separated regular
    expressions of ``OTEL_PYTHON_STARLETTE_EXCLUDED_URLS`` / ``OTEL_PYTHON_EXCLUDED_URLS`` (the
    variables OpenTelemetry's Python instrumentations read; set and empty: nothing excluded), else
    ``/health$``. Each is searched in the request URL without its query (``http://host:port/path``)."""
    if configured is None:
        names = ("OTEL_PYTHON_STARLETTE_EXCLUDED_URLS", "OTEL_PYTHON_EXCLUDED_URLS")
        value = next((os.environ[v] for v in names if os.environ.get(v, "").strip()), None)
        if value is None:
            value = "" if any(v in os.environ for v in names) else ",".join(DEFAULT_UNTRACED)
        configured = tuple(x.strip() for x in value.split(",") if x.strip())
    out = []
    for pattern in configured:
        try:
            out.append(re.compile(pattern))
        except re.error as exc:
            raise InputError(f"excluded URL pattern {pattern!r} is not a regular expression ({exc})") from None
    return tuple(out)


def serve_tracer(provider=None) -> trace.Tracer:
    """The tracer of the server's spans: ``provider``'s, else the one edgesdk records with
    (:func:`edgesdk.telemetry.tracer_provider`; a no-op tracer when telemetry is off)."""
    if provider is None:
        from edgesdk.telemetry import tracer_provider

        provider = tracer_provider()
    return trace.get_tracer("edgesdk.serve", __version__, tracer_provider=provider)


class HTTPSpan:
    """A SERVER span for a request that is not a GenAI operation: ``/health``, ``/metrics``,
    ``/v1/models``, an unknown path (404), a wrong method (405), and a GenAI route refused before its
    handler ran (401 without the API key, 503 while draining). Named ``{method} {http.route}``, or
    ``{method}`` when no route matched (the HTTP conventions: the path of an unknown URL is not a
    low-cardinality name); status as :class:`ServerSpan`: 4xx unset, 5xx ERROR with ``error.type``."""

    def __init__(self, tracer, scope: Mapping[str, Any], headers: Mapping[str, str], route: str | None):
        attrs = http_attributes(scope, headers.get("user-agent"))
        if route:
            attrs["http.route"] = route
        method = attrs["http.request.method"]
        name = "HTTP" if method == "_OTHER" else method
        self.span = tracer.start_span(
            f"{name} {route}" if route else name,
            context=propagate.extract(headers),
            kind=SpanKind.SERVER,
            attributes=attrs,
        )

    def end(self, status: int | None, error_type: str | None = None) -> None:
        if status is not None:
            self.span.set_attribute("http.response.status_code", int(status))
        if error_type is None and status is not None and status >= 500:
            error_type = str(status)
        if error_type:
            self.span.set_attribute("error.type", error_type)
            self.span.set_status(Status(StatusCode.ERROR, error_type))
        self.span.end()


class ServerSpan:
    """The request's SERVER span: HTTP server attributes (HTTP semantic conventions) and GenAI ones, parent
    from the client's ``traceparent``. It starts when the request arrives, before its body is read, so a
    request refused with 4xx has a span too; its name is ``{operation} {model}`` once the model is known.

    Status follows the HTTP conventions for SERVER spans: 4xx leaves it unset (the server did its job),
    5xx and a request that ended before its response was complete (client gone, ``error.type:
    cancelled``) set it to ERROR with ``error.type``."""

    def __init__(self, tracer, request, operation: str, route: str, provider: str):
        parent = propagate.extract(request.headers)
        self.operation = operation
        # The provider is known before the model only when one serves this kind; else "edgesdk" until then.
        attrs: dict = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": provider,
            **http_attributes(request.scope, request.headers.get("user-agent")),
        }
        attrs["http.route"] = route
        self.span = tracer.start_span(operation, context=parent, kind=SpanKind.SERVER, attributes=attrs)
        self.ctx = trace.set_span_in_context(self.span, parent)
        self._ended = False

    def model(self, name: str, provider: str, stream: bool | None = None) -> None:
        self.span.update_name(f"{self.operation} {name}")
        self.span.set_attribute("gen_ai.request.model", name)
        self.span.set_attribute("gen_ai.provider.name", provider)
        if stream:
            self.span.set_attribute("gen_ai.request.stream", True)

    def set(self, key: str, value) -> None:
        if value is not None:
            self.span.set_attribute(key, value)

    def end(
        self,
        status: int | None,
        code: str | None = None,
        message: str | None = None,
        cancelled: bool = False,
        error_type: str | None = None,
    ) -> None:
        """``status``: the HTTP status sent (None when none was); ``code``: the OpenAI error code;
        ``error_type``: the request failed after its status was sent (a stream that broke off)."""
        if self._ended:
            return
        self._ended = True
        if status is not None:
            self.span.set_attribute("http.response.status_code", int(status))
        if code:
            self.span.set_attribute("edgesdk.serve.error_code", code)
        error_type = "cancelled" if cancelled else error_type
        if error_type:
            self.span.set_attribute("error.type", error_type)
            self.span.set_status(Status(StatusCode.ERROR, message or error_type))
        elif status is not None and status >= 500:
            self.span.set_attribute("error.type", str(status))
            self.span.set_status(Status(StatusCode.ERROR, message or str(status)))
        self.span.end()


def attach_context(ctx):
    """Make ``ctx`` (a request's OpenTelemetry context, carried to a worker thread; None: nothing) the current
    context of this thread; returns the token for :func:`detach_context` (None when there was no context)."""
    return otel_context.attach(ctx) if ctx is not None else None


def detach_context(token) -> None:
    """Undo :func:`attach_context` (a None token: nothing to undo)."""
    if token is not None:
        otel_context.detach(token)
