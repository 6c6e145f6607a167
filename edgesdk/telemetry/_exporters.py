# SPDX-License-Identifier: Apache-2.0
"""The SDK providers edgesdk builds when it configures exporting (the CLI, ``--trace-file``, ``OTEL_*``),
the OTLP-JSON Lines file exporter, and wrappers that count what was exported or lost. The only module
that imports the OTLP exporters (the ``edgesdk[otel]`` extra); the SDK is imported here and by
:mod:`.serve_metrics` (the server's Prometheus reader, ``edgesdk[serve]``).

The file format is what the OpenTelemetry Collector's ``file`` exporter writes: one
``ExportTraceServiceRequest`` (or ``ExportMetricsServiceRequest``) per line in the OTLP/JSON
encoding — protobuf JSON mapping with camelCase keys, enums as integers, 64-bit integers as
strings, and trace/span ids as lowercase hex (OTLP/JSON's one departure from plain protobuf JSON).
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from edgesdk import __version__
from edgesdk.errors import InputError
from edgesdk.telemetry._setup import Counters, Settings

# Bounded so a stalled exporter holds at most this many finished spans in memory.
SPAN_QUEUE_SIZE = 2048
SPAN_BATCH_SIZE = 512
METRIC_EXPORT_INTERVAL_MS = 30_000

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(node) -> None:
    """Rewrite base64 id fields (protobuf JSON mapping) to hex in place, recursively."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)


def to_otlp_json(message) -> dict:
    """An OTLP export request (protobuf) as its OTLP/JSON document."""
    document = MessageToDict(message, use_integers_for_enums=True)
    _hex_ids(document)
    return document


_OPEN_SINKS: weakref.WeakSet = weakref.WeakSet()


def _reinit_sink_locks_after_fork() -> None:
    # A fork while the export thread held a lock would leave it locked forever in the child.
    for sink in list(_OPEN_SINKS):
        sink._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_sink_locks_after_fork)


class _JsonLinesFile:
    """One file shared by the span and metric exporters; a lock keeps lines whole. It closes when the
    last exporter that ``acquire()``d it shuts down (the providers shut down in parallel)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._users = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise InputError(f"cannot write trace file {self.path}: {exc.strerror or exc}") from exc
        _OPEN_SINKS.add(self)

    def write(self, document: dict) -> None:
        """One JSON document as one line."""
        line = json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n"
        with self._lock:
            if not self._handle.closed:
                self._handle.write(line)
                self._handle.flush()

    def acquire(self) -> _JsonLinesFile:
        with self._lock:
            self._users += 1
        return self

    def close(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users <= 0 and not self._handle.closed:
                self._handle.close()


class JsonLinesSpanExporter(SpanExporter):
    def __init__(self, sink: _JsonLinesFile):
        self._sink = sink.acquire()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._sink.write(to_otlp_json(encode_spans(spans)))
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._sink.close()


class JsonLinesMetricExporter(MetricExporter):
    def __init__(self, sink: _JsonLinesFile, preferred_aggregation=None):
        super().__init__(preferred_aggregation=preferred_aggregation)
        self._sink = sink.acquire()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        try:
            document = to_otlp_json(encode_metrics(metrics_data))
            if document.get("resourceMetrics"):
                self._sink.write(document)
        except OSError:
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self._sink.close()


class CountingSpanExporter(SpanExporter):
    """Counts exported and failed spans; turns exporter exceptions into a one-time warning."""

    def __init__(self, inner: SpanExporter, counters: Counters, label: str):
        self._inner = inner
        self._counters = counters
        self._label = label

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception as exc:  # noqa: BLE001 - an exporter bug must not reach the inference thread
            result = SpanExportResult.FAILURE
            self._counters.add("export_errors", 1)
            self._counters.warn_once(f"{self._label}-exc", f"telemetry: {self._label} exporter raised {exc!r}")
        if result is SpanExportResult.SUCCESS:
            self._counters.add("spans_exported", len(spans))
        else:
            self._counters.add("spans_failed", len(spans))
            self._counters.warn_once(
                self._label, f"telemetry: {self._label} export failed; spans are being dropped (inference continues)"
            )
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        flush = getattr(self._inner, "force_flush", None)
        return flush(timeout_millis) if flush else True


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's batch processor, plus a count of the spans it was given. The SDK drops spans from a
    full queue and only logs it; at shutdown nothing is queued, so ``spans_dropped`` is settled then."""

    def __init__(self, exporter: SpanExporter, counters: Counters, **kwargs):
        super().__init__(exporter, **kwargs)
        self._counters = counters

    def on_end(self, span: ReadableSpan) -> None:
        self._counters.add("spans_ended", 1)
        super().on_end(span)

    def shutdown(self) -> None:
        super().shutdown()
        self._counters.settle_drops()


def _otlp_exporters(settings: Settings):
    timeout = settings.export_timeout_s
    if settings.otlp_endpoint_from_env:
        traces_url = metrics_url = None  # let the SDK apply the OTEL_EXPORTER_OTLP_* rules
    else:
        base = (settings.otlp_endpoint or "").rstrip("/")  # called only with an endpoint
        base = base if "://" in base else "http://" + base
        traces_url = metrics_url = base
        if settings.otlp_protocol != "grpc":
            # OTLP/HTTP: an endpoint given in code is the base URL; per-signal paths are appended.
            root = base[: -len("/v1/traces")] if base.endswith("/v1/traces") else base
            traces_url, metrics_url = f"{root}/v1/traces", f"{root}/v1/metrics"
    # The gRPC and HTTP exporter packages have the same module and class names.
    package = "opentelemetry.exporter.otlp.proto." + ("grpc" if settings.otlp_protocol == "grpc" else "http")
    spans = importlib.import_module(f"{package}.trace_exporter").OTLPSpanExporter
    metrics = importlib.import_module(f"{package}.metric_exporter").OTLPMetricExporter
    return spans(endpoint=traces_url, timeout=timeout), metrics(endpoint=metrics_url, timeout=timeout)


def build_providers(settings: Settings, counters: Counters, *, span_exporter=None, metric_reader=None):
    """Return ``(tracer_provider, meter_provider, exporter_names)``. Nothing here touches the network."""
    resource = Resource.create(
        {
            "service.name": settings.service_name,
            "telemetry.distro.name": "edgesdk",
            "telemetry.distro.version": __version__,
        }
    )
    # Not the SDK's own atexit hooks: telemetry.shutdown() (registered once at configure) must drain the
    # metrics worker first and then shut both providers down in parallel, with a bound.
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    readers = []
    names = []

    def add_spans(exporter, label):
        processor = CountingBatchSpanProcessor(
            CountingSpanExporter(exporter, counters, label),
            counters,
            max_queue_size=SPAN_QUEUE_SIZE,
            max_export_batch_size=SPAN_BATCH_SIZE,
            export_timeout_millis=int(settings.export_timeout_s * 1000),
        )
        tracer_provider.add_span_processor(processor)
        names.append(label)

    if settings.trace_file:
        sink = _JsonLinesFile(settings.trace_file)
        add_spans(JsonLinesSpanExporter(sink), f"file:{settings.trace_file}")
        readers.append(
            PeriodicExportingMetricReader(
                JsonLinesMetricExporter(sink), export_interval_millis=METRIC_EXPORT_INTERVAL_MS
            )
        )
    if settings.otlp_endpoint:
        span_otlp, metric_otlp = _otlp_exporters(settings)
        add_spans(span_otlp, f"otlp-{settings.otlp_protocol}:{settings.otlp_endpoint}")
        if settings.otlp_metrics:
            readers.append(
                PeriodicExportingMetricReader(
                    metric_otlp,
                    export_interval_millis=METRIC_EXPORT_INTERVAL_MS,
                    export_timeout_millis=int(settings.export_timeout_s * 1000),
                )
            )
    if settings.console:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # Bind the stream now: the SDK's default argument is whatever sys.stdout was at its import.
        add_spans(ConsoleSpanExporter(out=sys.stdout), "console")
    if span_exporter is not None:
        add_spans(span_exporter, type(span_exporter).__name__)
    if metric_reader is not None:
        readers.append(metric_reader)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
    return tracer_provider, meter_provider, names
