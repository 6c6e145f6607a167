# SPDX-License-Identifier: Apache-2.0
"""OpenTelemetry GenAI telemetry for builds and on-device inference (semantic conventions v1.41.1).

Usage::

    from edgesdk import telemetry
    telemetry.configure(trace_file="traces.jsonl")          # or OTEL_* / EDGESDK_TRACE_FILE env vars
    with telemetry.inference("chat", "gemma-3-270m", "llama.cpp", stream=True) as rec:
        with rec.stage("prefill"):                          # stage child spans: preprocess,
            n_prompt = evaluate(prompt)                      # encode, prefill, decode
        rec.set_input_tokens(n_prompt)
        for token in generate():
            rec.chunk()
        rec.set_output_tokens(n_out); rec.finish(["stop"])
    telemetry.shutdown()

Nothing configured means nothing recorded: every call returns a shared no-op object. Content
(prompts, outputs) is only captured when opted in (``capture_content=True`` or
``EDGESDK_CAPTURE_CONTENT=1``). docs/telemetry.md has the collector setup.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from edgesdk.errors import VerdictError
from edgesdk.telemetry import _names as N
from edgesdk.telemetry._recorder import (
    NOOP_RECORDER,
    NOOP_STAGE,
    InferenceRecorder,
    Instruments,
    StageSpan,
    _NoopRecorder,
)
from edgesdk.telemetry._setup import Counters, resolve_settings

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "configure",
    "tracer_provider",
    "shutdown",
    "force_flush",
    "stats",
    "build_trace",
    "build_stage",
    "inference",
    "fallback_event",
    "capture_enabled",
    "BUILD_STAGES",
    "INFERENCE_STAGES",
    "InferenceRecorder",
    "StageSpan",
    "NOOP_RECORDER",
    "NOOP_STAGE",
]

_log = logging.getLogger("edgesdk.telemetry")

BUILD_STAGES = N.BUILD_STAGES
INFERENCE_STAGES = N.INFERENCE_STAGES  # InferenceRecorder.stage(name): child spans of a request's span


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.configured = False
        self.atexit_registered = False
        self.tracer: trace.Tracer | None = None  # None = telemetry off: every call takes the no-op path
        self.instruments: Instruments | None = None
        self.adoptable = False  # nothing of ours configured: use the application's providers once it has some
        self.tracer_provider: TracerProvider | None = None  # ours (the SDK's), when edgesdk exports
        self.meter_provider: MeterProvider | None = None
        self.counters = Counters()
        self.exporter_names: list[str] = []
        self.capture_content = False
        self.chunk_metric = True
        self.config_key: tuple[str, int | None, int | None] | None = None


_state = _State()


def _after_fork_in_child() -> None:
    # Locks another thread held at fork time stay locked in the child: replace them.
    _state.lock = threading.RLock()
    _state.counters.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def configure(
    *,
    trace_file: str | Path | None = None,
    otlp_endpoint: str | None = None,
    otlp_protocol: str | None = None,
    console: bool = False,
    capture_content: bool | None = None,
    service_name: str = "edgesdk",
    span_exporter=None,
    metric_reader=None,
) -> None:
    """Set up tracing and metrics; the same settings twice is a no-op, others replace the providers.

    Arguments override the ``OTEL_*`` / ``EDGESDK_*`` environment (docs/telemetry.md). With an
    exporter to set up (``span_exporter`` / ``metric_reader``: caller-owned), edgesdk builds its own
    SDK providers and never touches the global ones; without, it records into the application's.
    """
    settings = resolve_settings(
        trace_file=trace_file,
        otlp_endpoint=otlp_endpoint,
        otlp_protocol=otlp_protocol,
        console=console,
        capture_content=capture_content,
        service_name=service_name,
    )
    key = (repr(settings), id(span_exporter) if span_exporter else None, id(metric_reader) if metric_reader else None)
    with _state.lock:
        if _state.configured and _state.config_key == key:
            return
        _shutdown_locked()
        _state.configured = True
        _state.config_key = key
        _state.capture_content = settings.capture_content
        _state.chunk_metric = settings.chunk_metric
        _state.counters = Counters()
        if settings.disabled:
            return
        if not (settings.any_exporter or span_exporter is not None or metric_reader is not None):
            _state.adoptable = True
            if _application_has_sdk():
                _use_locked()
            return
        from edgesdk.extras import require

        require("otel", "opentelemetry.sdk", "exporting telemetry (--trace-file, OTEL_EXPORTER_OTLP_*)")
        from edgesdk.telemetry._exporters import build_providers

        if not _state.atexit_registered:
            atexit.register(shutdown)
            _state.atexit_registered = True
        _state.tracer_provider, _state.meter_provider, names = build_providers(
            settings, _state.counters, span_exporter=span_exporter, metric_reader=metric_reader
        )
        _use_locked(_state.tracer_provider, _state.meter_provider, names)


def _use_locked(tracer_provider=None, meter_provider=None, exporter_names=("application",)) -> None:
    """Record with these providers: ours, or (None) the application's global ones, adopted."""
    _state.tracer = trace.get_tracer("edgesdk", N.SDK_VERSION, tracer_provider, schema_url=N.SCHEMA_URL)
    meter = metrics.get_meter("edgesdk", N.SDK_VERSION, meter_provider, schema_url=N.SCHEMA_URL)
    _state.instruments = Instruments(meter)
    _state.exporter_names = list(exporter_names)


def _application_has_sdk() -> bool:
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _tracer():
    """The tracer to record with, or None (telemetry off). Cheap when off: two attribute reads."""
    tracer = _state.tracer
    if tracer is not None:
        return tracer
    if not _state.configured:
        try:
            configure()
        except Exception as exc:  # noqa: BLE001 - bad telemetry env must not stop a build or inference
            _log.warning("telemetry disabled: %s", exc)
            with _state.lock:
                _state.configured = True
    if _state.adoptable and _state.tracer is None and _application_has_sdk():
        with _state.lock:  # the application installed its providers after our first call
            if _state.adoptable and _state.tracer is None:
                _use_locked()
    return _state.tracer


def tracer_provider():
    """The tracer provider edgesdk records with (its own, the application's, or None when off), for
    components that make their own spans (the server's SERVER spans) to reach the same exporters."""
    if _tracer() is None:
        return None
    return _state.tracer_provider if _state.tracer_provider is not None else trace.get_tracer_provider()


def capture_enabled() -> bool:
    """True when prompt/output content capture is opted in (spans carry gen_ai.*.messages)."""
    return _state.capture_content and _tracer() is not None


def force_flush(timeout_millis: int = 5000) -> bool:
    """Export what is queued now (tests, before reading a trace file). Bounded by ``timeout_millis``."""
    ok = True
    with _state.lock:
        for provider in (_state.tracer_provider, _state.meter_provider):
            if provider is not None:
                ok = bool(provider.force_flush(timeout_millis)) and ok
    return ok


def _shutdown_locked(timeout_s: float = 5.0) -> None:
    providers = [p for p in (_state.tracer_provider, _state.meter_provider) if p is not None]
    _state.tracer = _state.instruments = _state.tracer_provider = _state.meter_provider = None
    _state.adoptable = _state.configured = False
    _state.exporter_names = []
    if not providers:
        return

    def _close(provider) -> None:
        try:
            provider.shutdown()
        except Exception as exc:  # noqa: BLE001 - shutting down must not fail the CLI
            _log.warning("telemetry shutdown: %s", exc)

    # Shut both providers down in parallel with a bound, so a dead collector delays exit by at most timeout_s.
    threads = [threading.Thread(target=_close, args=(p,), daemon=True) for p in providers]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def shutdown() -> None:
    """Flush and shut down edgesdk's own exporters (the CLI calls this at exit). Safe to call more than
    once; an application's own providers are left alone."""
    with _state.lock:
        _shutdown_locked()


def stats() -> dict:
    """Export bookkeeping of edgesdk's own exporters: spans ended / exported / failed / dropped (a full
    queue; settled at shutdown), exporter errors, the exporters, whether content is captured."""
    enabled = _state.tracer is not None
    return {
        **_state.counters.snapshot(),
        "enabled": enabled,
        "exporters": list(_state.exporter_names),
        "capture_content": bool(_state.capture_content and enabled),
    }


def inference(
    operation: str,
    model: str,
    provider: str,
    *,
    stream: bool = False,
    request: dict | None = None,
    attributes: dict | None = None,
    attach: bool = True,
) -> InferenceRecorder | _NoopRecorder:
    """Context manager for one inference request; yields a recorder (see module docstring).

    ``attach=False``: the span is never made the current one, so ``__enter__`` and ``__exit__`` may run on
    different threads (a request that a batching engine finishes on its own thread)."""
    tracer = _state.tracer or _tracer()
    if tracer is None:
        return NOOP_RECORDER
    return InferenceRecorder(
        tracer,
        _state.instruments,
        _state.capture_content,
        operation,
        model,
        provider,
        stream,
        request,
        attributes,
        _state.chunk_metric,
        attach,
    )


def build_trace(
    model: str, profile: str, attributes: dict | None = None
) -> contextlib.AbstractContextManager[trace.Span]:
    """Root span of one build (a new trace): ``edgesdk.build``; stages nest under it."""
    # context=Context(): always a new trace, even when called inside another span.
    return _build_span(
        N.BUILD_SPAN,
        {N.BUILD_MODEL: str(model), N.DEVICE_PROFILE: str(profile)},
        attributes,
        N.BUILD_OUTCOME,
        None,
        otel_context.Context(),
    )


def build_stage(stage: str, attributes: dict | None = None) -> contextlib.AbstractContextManager[trace.Span]:
    """Child span per build stage ``edgesdk.build.{stage}`` with duration and outcome."""
    return _build_span(
        f"{N.BUILD_SPAN}.{stage}", {N.BUILD_STAGE: str(stage)}, attributes, N.BUILD_STAGE_OUTCOME, str(stage)
    )


@contextlib.contextmanager
def _build_span(
    name: str,
    attrs: dict,
    attributes: dict | None,
    outcome_attr: str,
    stage: str | None,
    context: otel_context.Context | None = None,
) -> Iterator[trace.Span]:
    tracer = _tracer()
    if tracer is None:
        yield trace.INVALID_SPAN
        return
    span = tracer.start_span(
        name, context=context, kind=SpanKind.INTERNAL, attributes={**attrs, **N.clean_attributes(attributes or {})}
    )
    token = otel_context.attach(trace.set_span_in_context(span))
    start = time.perf_counter()
    outcome = "ok"
    error_type = None
    try:
        yield span
    except BaseException as exc:
        # A check that said no (license deny, parity verdict) is a decision, not a crash.
        outcome = "denied" if isinstance(exc, VerdictError) else "error"
        error_type = N.error_type(exc)
        span.set_attribute(N.ERROR_TYPE, error_type)
        span.set_status(Status(StatusCode.ERROR, N.error_description(exc)))
        raise
    finally:
        otel_context.detach(token)
        current = getattr(span, "attributes", None) or {}
        if error_type is not None or outcome_attr not in current:
            span.set_attribute(outcome_attr, outcome)
        else:
            outcome = str(current.get(outcome_attr))
        span.end()
        instruments = _state.instruments
        if stage is not None and instruments is not None:
            labels = {N.BUILD_STAGE: stage, N.BUILD_STAGE_OUTCOME: outcome}
            if error_type:
                labels[N.ERROR_TYPE] = error_type
            instruments.build_stage_duration.record(time.perf_counter() - start, labels)


def fallback_event(from_: str, to: str, reason: str, attributes: dict | None = None) -> None:
    """Record a backend/precision fallback as an ``edgesdk.fallback`` event on the current span (or,
    with none recording, e.g. at load time, on a short ``edgesdk.fallback`` span of its own)."""
    tracer = _tracer()
    if tracer is None:
        return
    attrs = {
        N.FALLBACK_FROM: str(from_),
        N.FALLBACK_TO: str(to),
        N.FALLBACK_REASON: str(reason),
        **N.clean_attributes(attributes or {}),
    }
    current = trace.get_current_span()
    if current.is_recording():
        current.add_event(N.FALLBACK_EVENT, attrs)
        return
    span = tracer.start_span(N.FALLBACK_EVENT, kind=SpanKind.INTERNAL)
    span.add_event(N.FALLBACK_EVENT, attrs)
    span.end()
