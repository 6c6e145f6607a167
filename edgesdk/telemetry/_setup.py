# SPDX-License-Identifier: Apache-2.0
"""Telemetry settings (arguments first, then the ``OTEL_*`` / ``EDGESDK_*`` environment) and the export
counters of ``telemetry.stats()``: a slow or dead collector costs a warning and counted drops, never a
blocked inference (bounded queues, short timeouts, the SDK's background threads)."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from edgesdk.errors import InputError

_log = logging.getLogger("edgesdk.telemetry")

# Seconds; the SDK default (10 s) would hold the CLI's exit for that long per signal on a dead collector.
DEFAULT_EXPORT_TIMEOUT_S = 2.0

_TRUE = {"1", "true", "yes", "on"}


def env_flag(name: str) -> bool | None:
    value = os.environ.get(name, "").strip().lower()
    return value in _TRUE if value else None


@dataclass
class Settings:
    """What to export where. Built from arguments and environment by :func:`resolve_settings`."""

    disabled: bool = False
    trace_file: Path | None = None
    otlp_endpoint: str | None = None
    # From OTEL_* variables: the SDK exporters resolve them themselves (per-signal endpoints are used
    # as given, generic ones get /v1/traces and /v1/metrics appended for HTTP, insecure from the scheme).
    otlp_endpoint_from_env: bool = False
    otlp_protocol: str = "grpc"
    console: bool = False
    capture_content: bool = False
    service_name: str = "edgesdk"
    export_timeout_s: float = DEFAULT_EXPORT_TIMEOUT_S
    otlp_metrics: bool = True
    # One gen_ai.client.operation.time_per_output_chunk value per streamed chunk (semconv: recommended
    # for streams); EDGESDK_CHUNK_METRIC=0 turns it off on devices where a histogram record per token
    # is too much. The span, TTFT and the per-request time per output token stay.
    chunk_metric: bool = True

    @property
    def any_exporter(self) -> bool:
        return bool(self.trace_file or self.otlp_endpoint or self.console)


def _capture_from_env() -> bool:
    ours = env_flag("EDGESDK_CAPTURE_CONTENT")
    if ours is not None:
        return ours
    # OTel's own GenAI instrumentations use this switch (values true / span_only / span_and_event ...).
    theirs = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower()
    return theirs in _TRUE or theirs.startswith("span")


def _normalise_protocol(protocol: str | None, endpoint: str | None) -> str:
    if protocol:
        value = protocol.strip().lower()
        if value == "grpc":
            return "grpc"
        if value in ("http/protobuf", "http", "http/json"):
            return "http/protobuf"
        raise InputError(f"unsupported OTLP protocol {protocol!r}", hint="use grpc or http/protobuf")
    # 4318 is the OTLP/HTTP port by convention; anything else is treated as gRPC (the Python SDK default).
    return "http/protobuf" if endpoint and ":4318" in endpoint else "grpc"


def resolve_settings(*, trace_file, otlp_endpoint, otlp_protocol, console, capture_content, service_name) -> Settings:
    settings = Settings(service_name=os.environ.get("OTEL_SERVICE_NAME") or service_name)
    exporters = {e.strip().lower() for e in os.getenv("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    explicit = trace_file or otlp_endpoint or console
    if env_flag("OTEL_SDK_DISABLED") or ("none" in exporters and not explicit):
        settings.disabled = True
        return settings
    file_value = trace_file if trace_file is not None else os.environ.get("EDGESDK_TRACE_FILE")
    settings.trace_file = Path(file_value) if file_value else None
    endpoint = (
        otlp_endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    # The spec's default exporter is otlp at localhost; we only export over the network when asked,
    # because an edge device without a collector would otherwise log a warning per batch forever.
    if not endpoint and "otlp" in exporters:
        endpoint = "http://localhost:4317"
    settings.otlp_endpoint = endpoint or None
    settings.otlp_endpoint_from_env = bool(endpoint) and not otlp_endpoint
    settings.otlp_protocol = _normalise_protocol(
        otlp_protocol
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL"),
        settings.otlp_endpoint,
    )
    settings.console = bool(console) or "console" in exporters
    settings.capture_content = capture_content if capture_content is not None else _capture_from_env()
    timeout = os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")
    if timeout:
        try:
            # The spec gives this in milliseconds; the Python SDK historically read seconds. Accept both.
            value = float(timeout)
            settings.export_timeout_s = value / 1000.0 if value > 100 else value
        except ValueError as exc:
            raise InputError(f"OTEL_EXPORTER_OTLP_TIMEOUT is not a number: {timeout!r}") from exc
    settings.otlp_metrics = os.environ.get("OTEL_METRICS_EXPORTER", "").strip().lower() != "none"
    settings.chunk_metric = env_flag("EDGESDK_CHUNK_METRIC") is not False
    return settings


@dataclass
class Counters:
    """Export bookkeeping exposed by ``telemetry.stats()``; updated from exporter threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    spans_ended: int = 0
    spans_exported: int = 0
    spans_failed: int = 0
    spans_dropped: int = 0
    export_errors: int = 0
    warned: set = field(default_factory=set)

    def settle_drops(self) -> None:
        """After shutdown nothing is queued: what ended and was not exported or failed was dropped."""
        with self.lock:
            self.spans_dropped = max(0, self.spans_ended - self.spans_exported - self.spans_failed)

    def add(self, name: str, n: int) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def warn_once(self, key: str, message: str) -> None:
        with self.lock:
            if key in self.warned:
                return
            self.warned.add(key)
        _log.warning(message)

    def snapshot(self) -> dict:
        with self.lock:
            return {
                name: getattr(self, name)
                for name in ("spans_ended", "spans_exported", "spans_failed", "spans_dropped", "export_errors")
            }
