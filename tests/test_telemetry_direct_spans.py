# SPDX-License-Identifier: Apache-2.0
"""A stream's span made in one step (_direct_spans) must be the span the SDK would make.

Each case runs twice on the same real SDK tracer, once through ``start_span`` + ``end`` and once
through ``DirectSpans.emit``, with an id generator that replays the same ids, and the ended spans
are compared field by field and through all three encoders (the SDK's protobuf, our OTLP-JSON and
our protobuf)."""

from __future__ import annotations

import json

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from edgesdk import telemetry
from edgesdk.telemetry._direct_spans import DirectSpans, plain_attributes
from edgesdk.telemetry._span_json import export_request_json
from edgesdk.telemetry._span_proto import export_request_bytes


class _ReplayIds(IdGenerator):
    """Deterministic ids: ``rewind()`` makes the next path draw the same ids as the last one."""

    def __init__(self):
        self.n = 0

    def rewind(self, n: int) -> None:
        self.n = n

    def generate_span_id(self) -> int:
        self.n += 1
        return 0x1000 + self.n

    def generate_trace_id(self) -> int:
        self.n += 1
        return (0x5A5A << 64) + self.n * 0x9E3779B97F4A7C15 % (1 << 64)

    def is_trace_id_random(self) -> bool:  # the SDK's own generator says True: exercise the flag
        return True


class _TaggingSampler(Sampler):
    """A sampler that adds an attribute and a trace state, and records without sampling every third span."""

    def __init__(self):
        self.calls = 0

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        self.calls += 1
        decision = Decision.RECORD_ONLY if self.calls % 3 == 0 else Decision.RECORD_AND_SAMPLE
        return SamplingResult(decision, {**(attributes or {}), "sampler.tag": "t"}, TraceState([("edge", "1")]))

    def get_description(self) -> str:
        return "tagging"


ATTRS = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "llama.cpp", "gen_ai.request.model": "gemma",
         "gen_ai.request.stream": True, "gen_ai.request.max_tokens": 128, "gen_ai.request.temperature": 0.0,
         "gen_ai.request.stop_sequences": ["\n\n", "###"], "edgesdk.scores": (1.5, 2.5), "edgesdk.mixed": [1, "a"],
         "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 0, "gen_ai.response.finish_reasons": ("length",),
         "gen_ai.response.time_to_first_chunk": 0.0123, "edgesdk.empty": (), "edgesdk.text": "héllo \"q\"\n"}


def _setup(sampler, limits=None):
    ids, memory = _ReplayIds(), InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler, resource=Resource.create({"service.name": "edge", "n": 3}),
                              id_generator=ids, span_limits=limits or SpanLimits(), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("edgesdk", "9.9", schema_url="https://opentelemetry.io/schemas/1.41.1")
    return ids, memory, provider, tracer


def _sdk_span(tracer, name, parent, attrs, start, end, status):
    span = tracer.start_span(name, context=parent, kind=SpanKind.INTERNAL, attributes=attrs, start_time=start)
    if status is not None:
        span.set_status(status)
    span.end(end_time=end)
    return span.get_span_context()


def _fields(span) -> dict:
    return {"name": span.name, "context": span.context, "flags": int(span.context.trace_flags),
            "state": span.context.trace_state, "parent": span.parent, "attributes": dict(span.attributes),
            "kind": span.kind, "status": (span.status.status_code, span.status.description),
            "times": (span.start_time, span.end_time), "resource": span.resource.attributes,
            "scope": span.instrumentation_scope, "events": [(e.name, dict(e.attributes), e.timestamp) for e in span.events], "links": tuple(span.links),
            "dropped": (span.dropped_attributes, span.dropped_events, span.dropped_links)}


def _parents():
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    unsampled = SpanContext(0xABD, 0xDEE, is_remote=True, trace_flags=TraceFlags(TraceFlags.DEFAULT))
    return {"root": otel_context.Context(),
            "sampled remote parent": trace.set_span_in_context(NonRecordingSpan(remote)),
            "unsampled parent": trace.set_span_in_context(NonRecordingSpan(unsampled))}


@pytest.mark.parametrize("sampler_name", ["always_on", "always_off", "parent_based", "ratio", "tagging"])
def test_direct_span_is_the_sdk_span(sampler_name):
    sampler = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF, "parent_based": ParentBased(ALWAYS_ON),
               "ratio": TraceIdRatioBased(0.5), "tagging": _TaggingSampler()}[sampler_name]
    ids, memory, _, tracer = _setup(sampler)
    direct = DirectSpans(tracer, tracer._span_limits, (SimpleSpanProcessor,))
    assert direct.reason is None
    compared = 0
    for parent_name, parent in _parents().items():
        for i, status in enumerate([None, Status(StatusCode.ERROR, "TimeoutError: decode stalled")] * 4):
            attrs = {**ATTRS, "gen_ai.usage.output_tokens": i, "edgesdk.case": parent_name}
            mark, calls = ids.n, getattr(sampler, "calls", 0)
            memory.clear()
            sdk_context = _sdk_span(tracer, "chat gemma", parent, attrs, 1_000 + i, 5_000 + i, status)
            sdk_spans = memory.get_finished_spans()
            ids.rewind(mark)
            if isinstance(sampler, _TaggingSampler):
                sampler.calls = calls
            memory.clear()
            context = direct.emit("chat gemma", parent, attrs, 1_000 + i, 5_000 + i, status or Status(StatusCode.UNSET))
            direct_spans = memory.get_finished_spans()
            assert context == sdk_context, (parent_name, i)
            assert [_fields(s) for s in direct_spans] == [_fields(s) for s in sdk_spans], (parent_name, i)
            if sdk_spans:
                compared += 1
                assert encode_spans(direct_spans) == encode_spans(sdk_spans)
                assert export_request_bytes(direct_spans) == export_request_bytes(sdk_spans)
                assert json.loads(export_request_json(direct_spans)) == json.loads(export_request_json(sdk_spans))
    if sampler_name == "always_off":
        assert compared == 0
    elif sampler_name in ("always_on", "tagging"):
        assert compared == 24 if sampler_name == "always_on" else 0 < compared < 24  # RECORD_ONLY is not exported
    else:
        assert 0 < compared < 24  # the unsampled parent (parent-based) / about half the trace ids (ratio)


@pytest.mark.parametrize("value", [b"\x00", {"k": 1}, [1, b"x"], 1 + 2j, None, [None], object()],
                         ids=["bytes", "mapping", "bytes-in-list", "complex", "none", "none-in-list", "object"])
def test_values_the_sdk_would_clean_take_the_sdk_path(value):
    ids, memory, _, tracer = _setup(ALWAYS_ON)
    direct = DirectSpans(tracer, tracer._span_limits, (SimpleSpanProcessor,))
    mark = ids.n
    assert plain_attributes({"a": 1, "v": value}) is None
    assert direct.emit("s", otel_context.Context(), {"a": 1, "v": value}, 1, 2, Status(StatusCode.UNSET)) is None
    assert ids.n == mark and not memory.get_finished_spans()  # nothing drawn, nothing emitted


def test_keys_limits_and_foreign_processors_take_the_sdk_path():
    import numpy as np

    _, memory, provider, tracer = _setup(ALWAYS_ON, SpanLimits(max_span_attributes=4))
    direct = DirectSpans(tracer, tracer._span_limits, (SimpleSpanProcessor,))
    root = otel_context.Context()
    assert direct.emit("s", root, {"": 1}, 1, 2, Status(StatusCode.UNSET)) is None  # the SDK drops an empty key
    assert direct.emit("s", root, {1: 1}, 1, 2, Status(StatusCode.UNSET)) is None  # ... and str()s a non-str one
    assert direct.emit("s", root, {"x": np.float32(1.5)}, 1, 2, Status(StatusCode.UNSET)) is None
    assert direct.emit("s", root, {f"k{i}": i for i in range(5)}, 1, 2, Status(StatusCode.UNSET)) is None  # > limit
    assert direct.emit("s", root, {f"k{i}": i for i in range(4)}, 1, 2, Status(StatusCode.UNSET)) is not None
    assert len(memory.get_finished_spans()) == 1
    # A processor added after setup (it might use on_start): the SDK's path from then on.
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    assert direct.emit("s", root, {"a": 1}, 1, 2, Status(StatusCode.UNSET)) is None
    # Set up on a provider it cannot reproduce: it says why and is never used.
    _, _, _, truncating = _setup(ALWAYS_ON, SpanLimits(max_span_attribute_length=8))
    assert "length limit" in DirectSpans(truncating, truncating._span_limits, (SimpleSpanProcessor,)).reason
    assert "processors" in DirectSpans(tracer, tracer._span_limits, (type(None),)).reason

    class Starting(SimpleSpanProcessor):  # a processor of the accepted type that acts on start
        def on_start(self, span, parent_context=None):
            span.set_attribute("started", True)

    _, _, starting_provider, starting = _setup(ALWAYS_ON)
    starting_provider.add_span_processor(Starting(InMemorySpanExporter()))
    assert "start" in DirectSpans(starting, starting._span_limits, (SimpleSpanProcessor,)).reason


def _stream_once(attributes=None):
    with telemetry.inference("chat", "gemma", "llama.cpp", stream=True, request={"max_tokens": 4},
                             attributes=attributes) as rec:
        rec.set_input_tokens(3)
        for _ in range(4):
            rec.chunk()
        rec.set_output_tokens(4)
        rec.finish(["length"])
    return rec


def test_telemetry_uses_it_for_streams_and_says_so(clean_env):
    memory = InMemorySpanExporter()
    telemetry.configure(span_exporter=memory)
    assert telemetry.stats()["direct_spans"] is True
    caller = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(caller)))
    try:
        rec = _stream_once({"edgesdk.backend": "llama.cpp"})
    finally:
        otel_context.detach(token)
    assert telemetry.force_flush()
    (span,) = memory.get_finished_spans()
    assert type(span._attributes) is dict  # made in one step
    assert span.parent == caller and span.context.trace_id == 0xABC
    assert rec.span.get_span_context() == span.context and not rec.span.is_recording()
    assert dict(span.attributes)["gen_ai.usage.output_tokens"] == 4 and span.status.status_code is StatusCode.UNSET
    # Events added while streaming need the SDK's span: that request takes the SDK path.
    with telemetry.inference("chat", "gemma", "llama.cpp", stream=True) as rec:
        rec.add_event("edgesdk.fallback", {"edgesdk.fallback.from": "cuda"})
        rec.chunk()
    assert telemetry.force_flush()
    evented = memory.get_finished_spans()[-1]
    assert type(evented._attributes) is not dict and [e.name for e in evented.events] == ["edgesdk.fallback"]


def test_value_length_limit_turns_it_off(clean_env):
    clean_env.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "5")
    memory = InMemorySpanExporter()
    telemetry.configure(span_exporter=memory)
    assert "length limit" in telemetry.stats()["direct_spans"]
    _stream_once({"edgesdk.backend": "llama.cpp"})
    assert telemetry.force_flush()
    (span,) = memory.get_finished_spans()
    assert dict(span.attributes)["edgesdk.backend"] == "llama"  # truncated by the SDK, as configured


START = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "onnxruntime", "gen_ai.request.model": "minilm"}


def _deferred_cases():
    """(label, end attributes, what is done to the span while the request runs)."""
    end = {k: v for k, v in ATTRS.items() if k not in START}
    return [
        ("untouched", end, None),
        ("a start key set again", {**end, "gen_ai.request.model": "minilm-int8"}, None),
        ("an event (a runtime fallback)", end, lambda s: s.add_event("edgesdk.fallback", {"edgesdk.fallback.to": "cpu"},
                                                                      timestamp=1_500)),
        ("an attribute and a new name", end, lambda s: (s.set_attribute("app.k", [1, 2]), s.update_name("chat x"))),
        ("a value the SDK cleans", {**end, "edgesdk.raw": b"\x00\x01"}, None),
    ]


@pytest.mark.parametrize("sampler_name", ["always_on", "parent_based", "tagging"])
def test_deferred_span_of_a_non_streaming_request_is_the_sdk_span(sampler_name):
    sampler = {"always_on": ALWAYS_ON, "parent_based": ParentBased(ALWAYS_ON), "tagging": _TaggingSampler()}[sampler_name]
    ids, memory, _, tracer = _setup(sampler)
    direct = DirectSpans(tracer, tracer._span_limits, (SimpleSpanProcessor,))
    compared = 0
    for parent_name, parent in _parents().items():
        for label, end_attrs, touch in _deferred_cases():
            for status in (None, Status(StatusCode.ERROR, "OSError: device lost")):
                mark, calls = ids.n, getattr(sampler, "calls", 0)
                memory.clear()
                token = otel_context.attach(parent)
                try:
                    sdk = tracer.start_span("chat minilm", kind=SpanKind.INTERNAL, attributes=START, start_time=1_000)
                    if touch:
                        touch(sdk)
                    sdk.set_attributes(end_attrs)
                    if status is not None:
                        sdk.set_status(status)
                    sdk.end(end_time=9_000)
                    sdk_spans = memory.get_finished_spans()
                    ids.rewind(mark)
                    if isinstance(sampler, _TaggingSampler):
                        sampler.calls = calls
                    memory.clear()
                    mine = direct.start("chat minilm", START)
                finally:
                    otel_context.detach(token)
                assert mine.get_span_context() == sdk.get_span_context(), (parent_name, label)
                if isinstance(mine, NonRecordingSpan):  # the sampler dropped it, as for the SDK
                    assert not sdk.is_recording() and not sdk_spans
                    continue
                mine.start_ns = 1_000  # the request's start instant, fixed for the comparison
                assert mine.is_recording()
                if touch:
                    touch(mine)
                mine.finish(end_attrs, 9_000, status)
                assert not mine.is_recording()
                mine.add_event("too late")  # after the end: ignored, as by the SDK's ended span
                direct_spans = memory.get_finished_spans()
                assert [_fields(s) for s in direct_spans] == [_fields(s) for s in sdk_spans], (parent_name, label)
                if direct_spans:
                    compared += 1
                    one_step = type(direct_spans[0]._attributes) is dict
                    assert one_step == (touch is None and label != "a value the SDK cleans"), label
                    assert encode_spans(direct_spans) == encode_spans(sdk_spans)
                    assert export_request_bytes(direct_spans) == export_request_bytes(sdk_spans)
    assert compared > 0


def test_non_streaming_requests_use_it_and_fallback_events_land(clean_env):
    memory = InMemorySpanExporter()
    telemetry.configure(span_exporter=memory)
    with telemetry.inference("embeddings", "minilm", "onnxruntime", attributes={"edgesdk.backend": "onnxruntime"}) as rec:
        assert trace.get_current_span() is rec.span and rec.span.is_recording()
        rec.set_input_tokens(7)
    with telemetry.inference("embeddings", "minilm", "onnxruntime") as rec:
        telemetry.fallback_event("cuda", "cpu", "no CUDA device")
        rec.set_input_tokens(7)
    assert telemetry.force_flush()
    plain, with_event = memory.get_finished_spans()
    assert type(plain._attributes) is dict and dict(plain.attributes)["gen_ai.usage.input_tokens"] == 7
    assert type(with_event._attributes) is not dict  # became the SDK's span for the event
    assert [e.name for e in with_event.events] == ["edgesdk.fallback"]
    assert dict(with_event.attributes)["gen_ai.usage.input_tokens"] == 7
    assert plain.name == with_event.name == "embeddings minilm"
