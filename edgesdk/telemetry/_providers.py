# SPDX-License-Identifier: Apache-2.0
"""Build the SDK TracerProvider and MeterProvider for resolved :class:`Settings`.

The only module that imports the OpenTelemetry SDK and exporters (the ``edgesdk[otel]`` extra);
it is imported when edgesdk itself configures exporting (the CLI, ``--trace-file``, ``OTEL_*``).
"""

from __future__ import annotations

import sys

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from edgesdk import __version__
from edgesdk.telemetry._exporters import (
    CountingBatchSpanProcessor,
    CountingSpanExporter,
    JsonLinesMetricExporter,
    JsonLinesSpanExporter,
    open_json_lines,
)
from edgesdk.telemetry._setup import (
    METRIC_EXPORT_INTERVAL_MS,
    SPAN_BATCH_SIZE,
    SPAN_QUEUE_SIZE,
    Counters,
    Settings,
)


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
    if settings.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return (GrpcSpanExporter(endpoint=traces_url, timeout=timeout),
                GrpcMetricExporter(endpoint=metrics_url, timeout=timeout))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return (OTLPSpanExporter(endpoint=traces_url, timeout=timeout),
            OTLPMetricExporter(endpoint=metrics_url, timeout=timeout))


def build_providers(settings: Settings, counters: Counters, *, span_exporter=None, metric_reader=None):
    """Return ``(tracer_provider, meter_provider, exporter_names)``. Nothing here touches the network."""
    resource = Resource.create({"service.name": settings.service_name, "telemetry.distro.name": "edgesdk",
                                "telemetry.distro.version": __version__})
    # Not the SDK's own atexit hooks: telemetry.shutdown() (registered once at configure) must drain the
    # metrics worker first and then shut both providers down in parallel, with a bound.
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    readers = []
    names = []

    def add_spans(exporter, label):
        processor = CountingBatchSpanProcessor(
            CountingSpanExporter(exporter, counters, label), counters, max_queue_size=SPAN_QUEUE_SIZE,
            max_export_batch_size=SPAN_BATCH_SIZE,
            export_timeout_millis=int(settings.export_timeout_s * 1000))
        tracer_provider.add_span_processor(processor)
        names.append(label)

    if settings.trace_file:
        sink = open_json_lines(settings.trace_file)
        add_spans(JsonLinesSpanExporter(sink), f"file:{settings.trace_file}")
        readers.append(PeriodicExportingMetricReader(JsonLinesMetricExporter(sink),
                                                     export_interval_millis=METRIC_EXPORT_INTERVAL_MS))
    if settings.otlp_endpoint:
        span_otlp, metric_otlp = _otlp_exporters(settings)
        add_spans(span_otlp, f"otlp-{settings.otlp_protocol}:{settings.otlp_endpoint}")
        if settings.otlp_metrics:
            readers.append(PeriodicExportingMetricReader(
                metric_otlp, export_interval_millis=METRIC_EXPORT_INTERVAL_MS,
                export_timeout_millis=int(settings.export_timeout_s * 1000)))
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
