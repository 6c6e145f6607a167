# SPDX-License-Identifier: Apache-2.0
"""The metrics of ``edgesdk serve``: recorded once through the OpenTelemetry metrics API, rendered on
``/metrics`` by the OpenTelemetry SDK's Prometheus reader (``opentelemetry-exporter-prometheus`` with
``prometheus_client``, the ``edgesdk[serve]`` extra).

Each server gets its own SDK ``MeterProvider`` whose one reader is a ``PrometheusMetricReader`` on a private
``prometheus_client.CollectorRegistry``: ``/metrics`` answers the same whether the application installed a
global MeterProvider of its own or none, and two servers in one process never mix their series. The
instruments are OpenTelemetry instruments named after the GenAI semantic conventions where one exists
(``gen_ai.server.request.duration`` and so on, with the advised bucket boundaries of :mod:`._names`); the
reader turns a name into Prometheus by the specification's rules (dots to underscores, the unit as a suffix:
``s`` -> ``_seconds``, ``By`` -> ``_bytes``, a ``{...}`` annotation dropped; ``_total`` on counters), so the
Prometheus names are the ones ``/metrics`` always had. Figures that are a current value (queue depth, busy
slots, prompt cache bytes) are observable gauges, read when ``/metrics`` is scraped.

Thread-safe: the LLM workers and the event loop record.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

from edgesdk.telemetry import _names as N

#: The Content-Type of ``/metrics``: Prometheus text exposition format 0.0.4 (what ``generate_latest`` writes).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128]

# The keyword labels the server records with -> OpenTelemetry attribute names (the Prometheus label is the
# attribute with dots made underscores, so ``gen_ai.request.model`` is ``gen_ai_request_model`` on /metrics).
_ATTRIBUTES = {
    "gen_ai_operation_name": N.OPERATION_NAME,
    "gen_ai_request_model": N.REQUEST_MODEL,
    "gen_ai_token_type": N.TOKEN_TYPE,
}


class _Instrument:
    def __init__(self, owner: ServerMetrics, instrument) -> None:
        self._owner, self._instrument = owner, instrument

    def _attributes(self, labels: dict) -> dict[str, str]:
        return self._owner.attributes(labels)


class Counter(_Instrument):
    def inc(self, amount: float = 1.0, **labels: object) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self._instrument.add(amount, self._attributes(labels))


class Histogram(_Instrument):
    def observe(self, value: float, **labels: object) -> None:
        self._instrument.record(float(value), self._attributes(labels))


class Gauge:
    """A current value: set now (:meth:`set`) or read at scrape time (:meth:`set_function`), reported by an
    observable gauge's callback."""

    def __init__(self, owner: ServerMetrics) -> None:
        self._owner = owner
        self._lock = threading.Lock()
        self._values: dict[tuple, float] = {}
        self._live: dict[tuple, Callable[[], float]] = {}

    def _key(self, labels: dict) -> tuple:
        return tuple(sorted(self._owner.attributes(labels).items()))

    def set(self, value: float, **labels: object) -> None:
        with self._lock:
            self._values[self._key(labels)] = float(value)

    def set_function(self, fn: Callable[[], float], **labels: object) -> None:
        """Read the value from ``fn()`` whenever the metrics are collected (a live figure, such as busy slots)."""
        with self._lock:
            self._live[self._key(labels)] = fn

    def observe(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            values = dict(self._values)
            live = dict(self._live)
        for key, fn in live.items():
            try:
                values[key] = float(fn())
            except Exception:  # noqa: BLE001 - a closed engine reports nothing, never fails /metrics
                values.pop(key, None)
        return [Observation(value, dict(key)) for key, value in sorted(values.items())]


class ServerMetrics:
    """Every metric the server exposes on ``/metrics`` (docs/serve.md, "Prometheus metrics")."""

    def __init__(self) -> None:
        self._providers: dict[str, str] = {}
        self.registry = CollectorRegistry()
        # No target_info (resource) series and no otel_scope_* labels: the series are the server's own.
        self._reader = PrometheusMetricReader(
            disable_target_info=True, scope_info_enabled=False, registry=self.registry
        )
        # shutdown_on_exit=False: nothing to flush (a pull reader), and no atexit hook holding every server.
        self.provider = MeterProvider(
            metric_readers=[self._reader],
            shutdown_on_exit=False,
            resource=Resource.create({"service.name": "edgesdk-serve"}),
        )
        meter = self.provider.get_meter("edgesdk.serve", N.SDK_VERSION, schema_url=N.SCHEMA_URL)

        def counter(name: str, unit: str, description: str) -> Counter:
            return Counter(self, meter.create_counter(name, unit=unit, description=description))

        def histogram(name: str, unit: str, description: str, buckets: list) -> Histogram:
            return Histogram(
                self,
                meter.create_histogram(
                    name, unit=unit, description=description, explicit_bucket_boundaries_advisory=buckets
                ),
            )

        def gauge(name: str, unit: str, description: str) -> Gauge:
            g = Gauge(self)
            meter.create_observable_gauge(name, callbacks=[g.observe], unit=unit, description=description)
            return g

        self.requests = counter(N.SERVE_REQUESTS, "{request}", "HTTP requests answered, by route, model and status.")
        self.rejected = counter(
            N.SERVE_REJECTED, "{request}", "Requests refused because a queue was full or the server was draining."
        )
        self.cancelled = counter(
            N.SERVE_CANCELLED, "{request}", "Generations stopped early because the client went away."
        )
        self.duration = histogram(
            N.SERVER_REQUEST_DURATION,
            "s",
            "Time from request received to last byte of the response.",
            N.DURATION_BUCKETS,
        )
        self.ttft = histogram(
            N.SERVER_TIME_TO_FIRST_TOKEN,
            "s",
            "Time from request received to the first generated token (queue wait included).",
            N.TTFT_BUCKETS,
        )
        self.tpot = histogram(
            N.SERVER_TIME_PER_OUTPUT_TOKEN, "s", "Mean time per output token after the first.", N.TPOT_BUCKETS
        )
        # Not gen_ai.*: the conventions have no server token metric (/metrics used to call it
        # gen_ai_server_token_usage_tokens_total as if they had one).
        self.tokens = counter(N.SERVE_TOKEN_USAGE, "{token}", "Tokens processed, input and output.")
        self.queue_depth = gauge(N.SERVE_QUEUE_DEPTH, "{request}", "Requests waiting or running, per model.")
        self.batch_size = histogram(
            N.SERVE_EMBEDDING_BATCH_SIZE,
            "{input}",
            "Inputs per embedding batch run by the dynamic batcher.",
            BATCH_BUCKETS,
        )
        self.cached_tokens = counter(
            N.SERVE_PROMPT_CACHE_REUSED, "{token}", "Prompt tokens restored from the prompt cache instead of evaluated."
        )
        self.cache_bytes = gauge(N.SERVE_PROMPT_CACHE, "By", "Bytes held by the prompt cache.")
        self.slots = gauge(N.SERVE_SLOTS, "{slot}", "Sequences an LLM decodes together (serve --parallel).")
        self.slots_busy = gauge(N.SERVE_SLOTS_BUSY, "{slot}", "Slots holding a request now, per LLM.")
        self.speculative_tokens = counter(
            N.SERVE_SPECULATIVE_TOKENS,
            "{token}",
            "Speculative decoding: tokens drafted by prompt lookup (kind=drafted), kept by the model (kind=accepted).",
        )

    def model(self, name: str, provider: str) -> None:
        """Record ``gen_ai.provider.name`` (required by the GenAI conventions) with every GenAI figure of
        model ``name``."""
        self._providers[name] = provider

    def attributes(self, labels: dict) -> dict[str, str]:
        attrs = {_ATTRIBUTES.get(k, k): str(v) for k, v in labels.items()}
        provider = self._providers.get(attrs.get(N.REQUEST_MODEL, ""))
        if provider is not None:
            attrs[N.PROVIDER_NAME] = provider
        return attrs

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4) of every figure recorded so far."""
        return generate_latest(self.registry).decode("utf-8")
