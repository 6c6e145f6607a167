# SPDX-License-Identifier: Apache-2.0
"""Ended spans made in one step, for streamed requests on edgesdk's own tracer provider.

A streamed request's span is created on the finishing thread after the request is over, with every
attribute known (see ``_recorder``). Going through ``Tracer.start_span`` + ``Span.end`` for that
costs about twice a bare SDK span here: the SDK cleans every attribute value into a locked
``BoundedAttributes`` (12 us for 16 attributes), takes the span's lock several times and calls the
processors twice. :meth:`DirectSpans.emit` does what ``start_span`` does (parent, trace id, the
sampler's decision and trace state, W3C random-trace-id flag, span id) and hands the processors the
same ``ReadableSpan`` that ``Span.end`` would, with the attributes checked instead of cleaned.

It applies only where the result is provably the SDK's:
- the provider is edgesdk's own (never installed globally, so nobody else adds processors), its
  processors are edgesdk's batch processors (``on_start`` and ``_on_ending`` do nothing) and the
  list is the one seen at setup;
- the tracer is enabled, with no SDK self-metrics (``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``);
- no attribute value length limit, and no more attributes than the limit;
- every key is a non-empty ``str`` and every value an exact ``str``/``bool``/``int``/``float`` or a
  list/tuple of those (which the SDK would store as a tuple: so do we), and no events.
Anything else goes through the SDK (``emit`` returns ``None``). ``tests/test_telemetry_direct_spans.py``
compares the two paths field by field and through both of our encoders, under several samplers.
"""

from __future__ import annotations

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

_PLAIN = frozenset((str, bool, int, float))
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
        elif NoOpTracerMetrics is None or not isinstance(getattr(tracer, "_tracer_metrics", None), NoOpTracerMetrics):
            self.reason = "SDK self-metrics are on"
        elif getattr(tracer, "_instrumentation_scope", None) is None or not callable(getattr(tracer, "_is_enabled", None)):
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
        self._max_attributes = span_limits.max_span_attributes

    def emit(self, name: str, parent_context, attributes: dict, start_ns: int, end_ns: int, status) -> SpanContext | None:
        """Sample, build and hand one ended INTERNAL span to the processors; its context, or None
        when the SDK must do it (nothing was done then)."""
        if self._multi._span_processors is not self._processors or not self._tracer._is_enabled():
            return None
        if len(attributes) > self._max_attributes:
            return None
        attrs = plain_attributes(attributes)
        if attrs is None:
            return None
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
        if not result.decision.is_recording():
            return context
        sampled = result.attributes
        if sampled is not None and sampled != attributes:
            # A sampler that changed the attributes (the SDK's own samplers pass them through): its
            # set, if that is plain too; else the SDK's path (which asks the sampler again).
            attrs = plain_attributes(sampled)
            if attrs is None or len(attrs) > self._max_attributes:
                return None
        span = ReadableSpan(name=name, context=context, parent=parent, resource=self._resource, attributes=attrs,
                            kind=SpanKind.INTERNAL, instrumentation_info=self._info, status=status,
                            start_time=start_ns, end_time=end_ns, instrumentation_scope=self._scope)
        for on_end in self._on_end:
            on_end(span)
        return context
