# SPDX-License-Identifier: Apache-2.0
"""Spans made in one step when they end, on edgesdk's own tracer provider.

A streamed request's span is created on the finishing thread after the request is over, with every
attribute known (see ``_recorder``). Going through ``Tracer.start_span`` + ``Span.end`` for that
costs about twice a bare SDK span here: the SDK cleans every attribute value into a locked
``BoundedAttributes`` (12 us for 16 attributes), takes the span's lock several times and calls the
processors twice. :meth:`DirectSpans.emit` does what ``start_span`` does (parent, trace id, the
sampler's decision and trace state, W3C random-trace-id flag, span id) and hands the processors the
same ``ReadableSpan`` that ``Span.end`` would, with the attributes checked instead of cleaned.
A non-streaming request's span must be current while the request runs: :meth:`DirectSpans.start`
decides it then (as ``start_span`` would) and returns a :class:`DeferredSpan`, made the same way when
it ends unless someone used it as a span meanwhile (then it becomes the SDK's span, see there).

It applies only where the result is provably the SDK's:
- the provider is edgesdk's own (never installed globally, so nobody else adds processors), its
  processors are edgesdk's batch processors (``on_start`` and ``_on_ending`` do nothing) and the
  list is the one seen at setup;
- the tracer is enabled, with no SDK self-metrics (``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``);
- no attribute value length limit, and no more attributes than the limit;
- every key is a non-empty ``str`` and every value an exact ``str``/``bool``/``int``/``float`` or a
  list/tuple of those (which the SDK would store as a tuple: so do we), and no events.
It uses SDK internals (the tracer's limits, processor list and scope; ``_Span`` for the SDK's path of
a deferred span), pinned to the SDK version in ``pyproject.toml``; on another layout ``reason`` says
so and the SDK does everything.
Anything else goes through the SDK (``emit`` returns ``None``). ``tests/test_telemetry_direct_spans.py``
compares the two paths field by field and through both of our encoders, under several samplers.
"""

from __future__ import annotations

import threading
from time import time_ns

from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

try:
    from opentelemetry.sdk.trace import _Span as _SdkSpan
except ImportError:  # another SDK layout: DirectSpans says so and is not used
    _SdkSpan = None

_PLAIN = frozenset((str, bool, int, float))
_ENDED = NonRecordingSpan(trace_api.INVALID_SPAN_CONTEXT)  # what a finished DeferredSpan forwards to
_UNSET = Status(StatusCode.UNSET)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_DEFAULT = TraceFlags(TraceFlags.DEFAULT)
_RANDOM = getattr(TraceFlags, "RANDOM_TRACE_ID", None)


def plain_attributes(attributes) -> dict | None:
    """The attributes as the SDK would store them, when that needs no cleaning; else None."""
    out = {}
    plain = _PLAIN
    for key, value in attributes.items():
        if type(key) is not str or not key:
            return None
        kind = type(value)
        if kind in plain:
            out[key] = value
        elif kind is tuple or kind is list:
            for item in value:
                if type(item) not in plain:
                    return None
            out[key] = tuple(value)
        else:
            return None
    return out


# The SDK's processors whose start and ending hooks are empty (``pass``): skipping them changes nothing.
_EMPTY_HOOKS = frozenset(f"{cls}.{hook}" for cls in ("SpanProcessor", "BatchSpanProcessor", "SimpleSpanProcessor")
                         for hook in ("on_start", "_on_ending"))


def _does_nothing(cls, hook: str) -> bool:
    method = getattr(cls, hook, None)
    if method is None:
        return hook == "_on_ending"  # an SDK without the hook
    return (getattr(method, "__module__", "").startswith("opentelemetry.sdk.trace")
            and getattr(method, "__qualname__", "") in _EMPTY_HOOKS)


class DirectSpans:
    """See the module docstring. ``reason`` is None when usable, else why not."""

    def __init__(self, tracer, span_limits, own_processor_types: tuple):
        self.reason = None
        try:
            from opentelemetry.sdk.trace._tracer_metrics import NoOpTracerMetrics
        except ImportError:  # another SDK layout
            NoOpTracerMetrics = None  # noqa: N806 - a class
        multi = getattr(tracer, "span_processor", None)
        processors = getattr(multi, "_span_processors", None)
        if span_limits is None or getattr(span_limits, "max_span_attribute_length", 0) is not None:
            self.reason = "an attribute value length limit is set (values would be truncated)"
        elif not isinstance(processors, tuple) or not processors or not all(
                isinstance(p, own_processor_types) for p in processors):
            self.reason = "span processors other than edgesdk's"
        elif not all(_does_nothing(type(p), "on_start") and _does_nothing(type(p), "_on_ending") for p in processors):
            self.reason = "a span processor acts on span start or ending"
        elif NoOpTracerMetrics is None or not isinstance(getattr(tracer, "_tracer_metrics", None), NoOpTracerMetrics):
            self.reason = "SDK self-metrics are on"
        elif (_SdkSpan is None or getattr(tracer, "_instrumentation_scope", None) is None
              or not callable(getattr(tracer, "_is_enabled", None))):
            self.reason = "unexpected SDK tracer layout"
        if self.reason is not None:
            return
        self._tracer = tracer
        self._multi = multi
        self._processors = processors
        self._on_end = tuple(p.on_end for p in processors)
        self._sampler = tracer.sampler
        self._ids = tracer.id_generator
        self._resource = tracer.resource
        self._scope = tracer._instrumentation_scope
        self._info = getattr(tracer, "instrumentation_info", None)
        self._limits = span_limits
        self._max_attributes = span_limits.max_span_attributes

    def _storable(self, attributes) -> dict | None:
        """``plain_attributes`` within the span attribute limit; None: the SDK must store them."""
        return plain_attributes(attributes) if len(attributes) <= self._max_attributes else None

    def usable(self) -> bool:
        """Still the provider seen at setup (processors unchanged) and the tracer enabled."""
        return self._multi._span_processors is self._processors and self._tracer._is_enabled()

    def _decide(self, name, parent_context, attributes):
        """What ``start_span`` decides: (parent, context, sampling result)."""
        parent = trace_api.get_current_span(parent_context).get_span_context()
        ids = self._ids
        if parent is None or not parent.is_valid:
            parent = None
            trace_id = ids.generate_trace_id()
            random_id = ids.is_trace_id_random() if _RANDOM is not None else False
        else:
            trace_id = parent.trace_id
            random_id = getattr(parent.trace_flags, "random_trace_id", False) if _RANDOM is not None else False
        result = self._sampler.should_sample(parent_context, trace_id, name, SpanKind.INTERNAL, attributes, ())
        flags = _SAMPLED if result.decision.is_sampled() else _DEFAULT
        if random_id:
            flags = TraceFlags(flags | _RANDOM)
        context = SpanContext(trace_id, ids.generate_span_id(), is_remote=False, trace_flags=flags,
                              trace_state=result.trace_state)
        return parent, context, result

    def _hand_over(self, name, context, parent, attrs, start_ns, end_ns, status) -> None:
        """The ended span, as ``Span.end`` builds it, to every processor."""
        span = ReadableSpan(name=name, context=context, parent=parent, resource=self._resource, attributes=attrs,
                            kind=SpanKind.INTERNAL, instrumentation_info=self._info, status=status or _UNSET,
                            start_time=start_ns, end_time=end_ns, instrumentation_scope=self._scope)
        for on_end in self._on_end:
            on_end(span)

    def emit(self, name: str, parent_context, attributes: dict, start_ns: int, end_ns: int,
             status=None) -> SpanContext | None:
        """Sample, build and hand one ended INTERNAL span to the processors; its context, or None
        when the SDK must do it (nothing was done then)."""
        attrs = self._storable(attributes) if self.usable() else None
        if attrs is None:
            return None
        parent, context, result = self._decide(name, parent_context, attributes)
        if not result.decision.is_recording():
            return context
        sampled = result.attributes
        if sampled is not None and sampled != attributes:
            # A sampler that changed the attributes (the SDK's own samplers pass them through): its
            # set, if that is plain too; else the SDK's path (which asks the sampler again).
            attrs = self._storable(sampled)
            if attrs is None:
                return None
        self._hand_over(name, context, parent, attrs, start_ns, end_ns, status)
        return context

    def start(self, name: str, attributes: dict) -> DeferredSpan | NonRecordingSpan | None:
        """A non-streaming request's span, decided now (as ``start_span``: parent from the current
        context, sampling with the start attributes) and made when it ends; None: use the SDK."""
        if not self.usable():
            return None
        parent_context = otel_context.get_current()
        parent, context, result = self._decide(name, parent_context, attributes)
        if not result.decision.is_recording():
            return NonRecordingSpan(context)
        return DeferredSpan(self, name, context, parent, parent_context, result, time_ns())

    def sdk_span(self, deferred: DeferredSpan):
        """The SDK's own span for ``deferred`` (same context, parent, sampler attributes, start time),
        started: what ``start_span`` would have returned."""
        span = _SdkSpan(name=deferred.name, context=deferred.context, parent=deferred.parent, sampler=self._sampler,
                        resource=self._resource, attributes=deferred.result.attributes, span_processor=self._multi,
                        kind=SpanKind.INTERNAL, links=(), instrumentation_info=self._info, limits=self._limits,
                        instrumentation_scope=self._scope,
                        record_end_metrics=self._tracer._tracer_metrics.start_span(deferred.parent,
                                                                                    deferred.result.decision))
        span.start(start_time=deferred.start_ns, parent_context=deferred.parent_context)
        return span


class DeferredSpan(trace_api.Span):
    """The current span of a non-streaming request while it runs: its context and sampling decided
    at the start, the span itself made when it ends (:meth:`finish`, on the finishing thread).

    Nested spans only need its context. Anything else a caller does to it (an event — a runtime
    fallback —, an attribute, a status, a name, a link, an exception, ``end``) turns it into the
    SDK's own span, started with the same context and start time, and is passed on: from then on it
    is the SDK's path, exactly. ``finish`` makes the span in one step only if nobody touched it.
    """

    def __init__(self, direct: DirectSpans, name, context, parent, parent_context, result, start_ns):
        self.direct = direct
        self.name = name
        self.context = context
        self.parent = parent
        self.parent_context = parent_context
        self.result = result
        self.start_ns = start_ns
        self._sdk = None
        self._finished = False
        self._lock = threading.Lock()

    def _real(self):
        with self._lock:
            if self._sdk is None:
                if self._finished:
                    return _ENDED  # made and handed over already: like the SDK's ended span, ignore
                self._sdk = self.direct.sdk_span(self)
            return self._sdk

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return not self._finished if self._sdk is None else self._sdk.is_recording()

    def set_attributes(self, attributes) -> None:
        self._real().set_attributes(attributes)

    def set_attribute(self, key, value) -> None:
        self._real().set_attribute(key, value)

    def add_event(self, name, attributes=None, timestamp=None) -> None:
        self._real().add_event(name, attributes, timestamp)

    def add_link(self, context, attributes=None) -> None:
        self._real().add_link(context, attributes)

    def update_name(self, name) -> None:
        self._real().update_name(name)

    def set_status(self, status, description=None) -> None:
        self._real().set_status(status, description)

    def record_exception(self, exception, attributes=None, timestamp=None, escaped=False) -> None:
        self._real().record_exception(exception, attributes, timestamp, escaped)

    def end(self, end_time=None) -> None:
        self._real().end(end_time)

    def finish(self, attributes: dict, end_ns: int, status) -> None:
        """End it with the request's remaining attributes and status (the recorder's last step)."""
        direct = self.direct
        with self._lock:
            self._finished = True
            sdk = self._sdk
        if sdk is None and direct.usable() and self.result.decision.is_recording():
            merged = dict(self.result.attributes or {})
            for key, value in attributes.items():  # BoundedAttributes order: a re-set key moves last
                merged.pop(key, None)
                merged[key] = value
            attrs = direct._storable(merged)
            if attrs is not None:
                direct._hand_over(self.name, self.context, self.parent, attrs, self.start_ns, end_ns, status)
                return
        if sdk is None:
            with self._lock:
                sdk = self._sdk = self._sdk or direct.sdk_span(self)
        sdk.set_attributes(attributes)
        if status is not None:
            sdk.set_status(status)
        sdk.end(end_time=end_ns)
