# SPDX-License-Identifier: Apache-2.0
"""The server's own counters and histograms, rendered as Prometheus text exposition (format 0.0.4).

Names follow the OpenTelemetry GenAI server metrics translated to Prometheus rules (dots to
underscores, unit suffix): ``gen_ai.server.request.duration`` (s) ->
``gen_ai_server_request_duration_seconds``. Thread-safe: the LLM workers and the event loop record.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable

# Bucket boundaries advised by the GenAI semantic conventions (v1.41.1).
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + body + "}" if body else ""


def _num(x: float) -> str:
    x = float(x)
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, label_names: tuple[str, ...]):
        self.name, self.help, self.label_names = name, help_text, label_names
        self._lock = threading.Lock()

    def _key(self, labels: dict) -> tuple:
        return tuple(str(labels.get(n, "")) for n in self.label_names)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name, help_text, label_names=()):
        super().__init__(name, help_text, tuple(label_names))
        self._values: dict[tuple, float] = {}

    def inc(self, amount: float = 1.0, **labels) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [f"{self.name}{_labels(zip(self.label_names, k))} {_num(v)}" for k, v in items]


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, name, help_text, label_names=()):
        super().__init__(name, help_text, tuple(label_names))
        self._values: dict[tuple, float] = {}
        self._live: dict[tuple, Callable[[], float]] = {}

    def set(self, value: float, **labels) -> None:
        with self._lock:
            self._values[self._key(labels)] = float(value)

    def set_function(self, fn: Callable[[], float], **labels) -> None:
        """Read the value from ``fn()`` whenever the metrics are rendered (a live figure, such as busy slots)."""
        with self._lock:
            self._live[self._key(labels)] = fn

    def render(self) -> list[str]:
        with self._lock:
            values = dict(self._values)
            live = dict(self._live)
        for key, fn in live.items():
            try:
                values[key] = float(fn())
            except Exception:  # noqa: BLE001 - a closed engine renders nothing, never fails /metrics
                values.pop(key, None)
        items = sorted(values.items())
        return self.header() + [f"{self.name}{_labels(zip(self.label_names, k))} {_num(v)}" for k, v in items]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name, help_text, label_names=(), buckets=DURATION_BUCKETS):
        super().__init__(name, help_text, tuple(label_names))
        self.buckets = tuple(sorted(float(b) for b in buckets))
        self._series: dict[tuple, list] = {}  # key -> [per-bucket counts (non-cumulative) + overflow, sum, count]

    def observe(self, value: float, **labels) -> None:
        key = self._key(labels)
        value = float(value)
        idx = next((i for i, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = [[0] * (len(self.buckets) + 1), 0.0, 0]
            series[0][idx] += 1
            series[1] += value
            series[2] += 1

    def count(self, **labels) -> int:
        with self._lock:
            series = self._series.get(self._key(labels))
            return series[2] if series else 0

    def render(self) -> list[str]:
        with self._lock:
            items = sorted((k, ([*v[0]], v[1], v[2])) for k, v in self._series.items())
        lines = self.header()
        for key, (counts, total, n) in items:
            pairs = list(zip(self.label_names, key))
            running = 0
            for bound, c in zip((*self.buckets, math.inf), counts):
                running += c
                lines.append(f"{self.name}_bucket{_labels([*pairs, ('le', _num(bound))])} {running}")
            lines.append(f"{self.name}_sum{_labels(pairs)} {_num(total)}")
            lines.append(f"{self.name}_count{_labels(pairs)} {n}")
        return lines


class ServerMetrics:
    """Every metric the server exposes on ``/metrics``."""

    def __init__(self) -> None:
        self.requests = Counter("edgesdk_serve_requests_total", "HTTP requests answered, by route, model and status.",
                                ("route", "model", "status"))
        self.rejected = Counter("edgesdk_serve_rejected_total",
                                "Requests refused because a queue was full or the server was draining.",
                                ("model", "reason"))
        self.cancelled = Counter("edgesdk_serve_cancelled_total",
                                 "Generations stopped early because the client went away.", ("model",))
        self.duration = Histogram("gen_ai_server_request_duration_seconds",
                                  "Time from request received to last byte of the response.",
                                  ("gen_ai_operation_name", "gen_ai_request_model"), DURATION_BUCKETS)
        self.ttft = Histogram("gen_ai_server_time_to_first_token_seconds",
                              "Time from request received to the first generated token (queue wait included).",
                              ("gen_ai_operation_name", "gen_ai_request_model"), TTFT_BUCKETS)
        self.tpot = Histogram("gen_ai_server_time_per_output_token_seconds",
                              "Mean time per output token after the first.",
                              ("gen_ai_operation_name", "gen_ai_request_model"), TPOT_BUCKETS)
        self.tokens = Counter("gen_ai_server_token_usage_tokens_total", "Tokens processed, input and output.",
                              ("gen_ai_request_model", "gen_ai_token_type"))
        self.queue_depth = Gauge("edgesdk_serve_queue_depth", "Requests waiting or running, per model.", ("model",))
        self.batch_size = Histogram("edgesdk_serve_embedding_batch_size",
                                    "Inputs per embedding batch run by the dynamic batcher.", ("model",),
                                    BATCH_BUCKETS)
        self.cached_tokens = Counter("edgesdk_serve_prompt_cache_reused_tokens_total",
                                     "Prompt tokens restored from the prompt cache instead of evaluated.", ("model",))
        self.cache_bytes = Gauge("edgesdk_serve_prompt_cache_bytes", "Bytes held by the prompt cache.", ("model",))
        self.slots = Gauge("edgesdk_serve_slots", "Sequences an LLM decodes together (serve --parallel).", ("model",))
        self.slots_busy = Gauge("edgesdk_serve_slots_busy", "Slots holding a request now, per LLM.", ("model",))

    def render(self) -> str:
        lines: list[str] = []
        for metric in (self.requests, self.rejected, self.cancelled, self.duration, self.ttft, self.tpot,
                       self.tokens, self.queue_depth, self.batch_size, self.cached_tokens, self.cache_bytes,
                       self.slots, self.slots_busy):
            lines += metric.render()
        return "\n".join(lines) + "\n"
