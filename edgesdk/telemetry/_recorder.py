# SPDX-License-Identifier: Apache-2.0
"""The per-request inference recorder: one INTERNAL span plus the GenAI metrics, and its stage spans.

Plain OpenTelemetry API calls only: ``tracer.start_span`` when the request starts (with every
attribute known then, so samplers see them), ``span.set_attributes`` / ``set_status`` / ``end`` and
one ``Histogram.record`` per value when it ends. During a stream ``chunk()`` appends a timestamp;
nothing else runs per token. Budget and measurements: docs/benchmarks.md (P6).
"""

from __future__ import annotations

from collections.abc import Iterable
from time import perf_counter
from types import TracebackType
from typing import Any, Literal, SupportsInt, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from edgesdk.telemetry import _names as N


class Instruments:
    """Histograms with the advised bucket boundaries (the semconv helpers set name/unit only)."""

    def __init__(self, meter):
        def hist(name, description, buckets=N.DURATION_BUCKETS, unit="s"):
            return meter.create_histogram(
                name, unit=unit, description=description, explicit_bucket_boundaries_advisory=buckets
            )

        self.duration = hist(N.CLIENT_OPERATION_DURATION, "GenAI operation duration")
        self.token_usage = hist(
            N.CLIENT_TOKEN_USAGE, "Number of input and output tokens used", N.TOKEN_BUCKETS, "{token}"
        )
        self.ttfc = hist(N.CLIENT_TIME_TO_FIRST_CHUNK, "Time to receive the first chunk")
        self.tpoc = hist(N.CLIENT_TIME_PER_OUTPUT_CHUNK, "Time between consecutive output chunks")
        self.server_ttft = hist(N.SERVER_TIME_TO_FIRST_TOKEN, "Time to generate the first token", N.TTFT_BUCKETS)
        self.server_tpot = hist(N.SERVER_TIME_PER_OUTPUT_TOKEN, "Time per output token after the first", N.TPOT_BUCKETS)
        self.build_stage_duration = hist(N.BUILD_STAGE_DURATION, "edgesdk build stage duration")


class StageSpan:
    """One inference stage of a request: an INTERNAL child span of the request's GenAI span.

    Use it as a context manager (``with rec.stage("prefill"):``) or end it yourself (``end()``, which
    is idempotent: a stage ended in a ``finally`` after an explicit ``end(exc)`` stays as it was)."""

    __slots__ = ("_span", "_ended")

    def __init__(self, span: trace.Span):
        self._span = span
        self._ended = False

    @property
    def span(self) -> trace.Span:
        return self._span

    def set_attribute(self, key: str, value: Any) -> None:
        if not self._ended:
            self._span.set_attributes(N.clean_attributes({key: value}))

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        if not self._ended:
            self._span.add_event(str(name), N.clean_attributes(attributes or {}))

    def end(self, error: BaseException | None = None) -> None:
        """End the stage; with ``error`` (not a stream's GeneratorExit) status ERROR and error.type."""
        if self._ended:
            return
        self._ended = True
        if error is not None and not isinstance(error, GeneratorExit):
            self._span.set_attribute(N.ERROR_TYPE, N.error_type(error))
            self._span.set_status(Status(StatusCode.ERROR, N.error_description(error)))
        self._span.end()

    def __enter__(self) -> StageSpan:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        self.end(exc)
        return False


_Self = TypeVar("_Self", bound="_Noop")


class _Noop:
    __slots__ = ()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        return False

    def _nothing(self, *args: object, **kwargs: object) -> None:
        pass

    @property
    def span(self) -> trace.Span:
        return trace.INVALID_SPAN


class _NoopStage(_Noop):
    """A stage when telemetry is off (or the request span is not recording): does nothing."""

    __slots__ = ()
    set_attribute = add_event = end = _Noop._nothing


NOOP_STAGE = _NoopStage()


class _NoopRecorder(_Noop):
    """Returned when telemetry is off: every method does nothing, so callers need no branches."""

    __slots__ = ()
    set_input_tokens = set_output_tokens = first_chunk = chunk = finish = _Noop._nothing
    set_response_model = set_response_id = set_attribute = set_error = add_event = _Noop._nothing
    capture_input = capture_output = _Noop._nothing

    def stage(self, name: str, attributes: dict[str, Any] | None = None) -> _NoopStage:
        return NOOP_STAGE


NOOP_RECORDER = _NoopRecorder()


class InferenceRecorder:
    """One request: a span started on entry and ended on exit, and its histogram values.

    A non-streaming request's span is the current span while the request runs, so fallback events
    and nested spans attach to it. A streaming request's span is never made current: its block lives
    in a generator across yields, and an attached context would leak into the consumer's code (and
    may be closed from another context). Use :meth:`add_event` for events on a stream's span.
    """

    __slots__ = (
        "_tracer",
        "_instruments",
        "_capture",
        "_operation",
        "_model",
        "_provider",
        "_stream",
        "_chunk_metric",
        "_span",
        "_token",
        "_t0",
        "_first",
        "_times",
        "_input_tokens",
        "_output_tokens",
        "_reasons",
        "_response_model",
        "_input_content",
        "_output_content",
        "_error_type",
        "_end_attrs",
        "_attach",
    )

    def __init__(
        self,
        tracer,
        instruments,
        capture,
        operation,
        model,
        provider,
        stream,
        request,
        attributes,
        chunk_metric=True,
        attach=True,
    ):
        self._tracer = tracer
        self._instruments = instruments
        self._capture = capture
        self._operation = operation
        self._model = model
        self._provider = provider
        self._stream = stream
        self._chunk_metric = chunk_metric
        self._attach = attach  # False: never made current (a request that ends on another thread)
        self._token = None
        self._first = None
        self._times = []
        self._input_tokens = self._output_tokens = self._reasons = self._response_model = None
        self._input_content = self._output_content = self._error_type = self._end_attrs = None
        self._span = (tracer, request, attributes)  # the span starts in __enter__

    # -- context manager --
    def __enter__(self) -> InferenceRecorder:
        tracer, request, attributes = self._span
        model = self._model
        attrs = {N.OPERATION_NAME: self._operation, N.PROVIDER_NAME: self._provider}
        if model:
            attrs[N.REQUEST_MODEL] = model
        if self._stream:
            attrs[N.REQUEST_STREAM] = True
        if request:
            attrs.update(N.request_attributes(request))
        if attributes:
            attrs.update(N.clean_attributes(attributes))
        self._span = tracer.start_span(
            f"{self._operation} {model}" if model else self._operation, kind=SpanKind.INTERNAL, attributes=attrs
        )
        if not self._stream and self._attach:
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
        self._t0 = perf_counter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        end = perf_counter()
        if self._token is not None:
            otel_context.detach(self._token)
        span = self._span
        if exc is not None and exc_type is not GeneratorExit:  # GeneratorExit: a stream stopped early
            self._error_type = N.error_type(exc)
            span.set_status(Status(StatusCode.ERROR, N.error_description(exc)))
        elif self._error_type is not None:
            span.set_status(Status(StatusCode.ERROR, self._error_type))
        metric_attrs = {N.OPERATION_NAME: self._operation, N.PROVIDER_NAME: self._provider}
        if self._model:
            metric_attrs[N.REQUEST_MODEL] = self._model
        attrs = self._end_attrs or {}
        if self._response_model:
            attrs[N.RESPONSE_MODEL] = metric_attrs[N.RESPONSE_MODEL] = self._response_model
        if self._error_type is not None:
            attrs[N.ERROR_TYPE] = metric_attrs[N.ERROR_TYPE] = self._error_type
        if self._input_tokens is not None:
            attrs[N.USAGE_INPUT_TOKENS] = self._input_tokens
        if self._output_tokens is not None:
            attrs[N.USAGE_OUTPUT_TOKENS] = self._output_tokens
        if self._reasons is not None:
            attrs[N.RESPONSE_FINISH_REASONS] = self._reasons
        times = self._times
        if self._first is None and times:
            self._first = times[0]
        if self._first is not None:
            attrs[N.RESPONSE_TIME_TO_FIRST_CHUNK] = self._first - self._t0
        if self._capture:
            reason = self._reasons[0] if self._reasons else ("error" if self._error_type else "stop")
            if self._input_content is not None:
                attrs[N.INPUT_MESSAGES] = N.text_messages("user", self._input_content)
            if self._output_content is not None:
                attrs[N.OUTPUT_MESSAGES] = N.text_messages("assistant", self._output_content, reason)
            if self._input_content is not None or self._output_content is not None:
                attrs[N.CAPTURE_MARKER] = True
        if attrs:
            span.set_attributes(attrs)
        span.end()
        if self._instruments is not None:
            self._record(metric_attrs, end)
        return False

    def _record(self, metric_attrs, end):
        inst, first, times = self._instruments, self._first, self._times
        inst.duration.record(end - self._t0, metric_attrs)
        if self._input_tokens is not None:
            inst.token_usage.record(self._input_tokens, {**metric_attrs, N.TOKEN_TYPE: "input"})
        if self._output_tokens is not None:
            inst.token_usage.record(self._output_tokens, {**metric_attrs, N.TOKEN_TYPE: "output"})
        if self._error_type is not None or first is None:
            return
        ttfc = first - self._t0
        inst.server_ttft.record(ttfc, metric_attrs)
        if self._stream:
            # The client chunk metrics SHOULD be reported for streaming calls only (semconv): one
            # value per chunk after the first.
            inst.ttfc.record(ttfc, metric_attrs)
            if self._chunk_metric and len(times) >= 2:
                record = inst.tpoc.record
                for before, now in zip(times, times[1:]):
                    record(now - before, metric_attrs)
        if len(times) >= 2:
            inst.server_tpot.record((times[-1] - times[0]) / (len(times) - 1), metric_attrs)

    # -- recording API --
    def set_input_tokens(self, n: SupportsInt) -> None:
        self._input_tokens = int(n)

    def set_output_tokens(self, n: SupportsInt) -> None:
        self._output_tokens = int(n)

    def first_chunk(self) -> None:
        if self._first is None:
            self._first = perf_counter()

    def chunk(self) -> None:
        self._times.append(perf_counter())

    def finish(self, reasons: str | Iterable[object]) -> None:
        self._reasons = [reasons] if isinstance(reasons, str) else [str(r) for r in reasons]

    def set_response_model(self, name: object) -> None:
        self._response_model = str(name)

    def set_response_id(self, response_id: object) -> None:
        self.set_attribute(N.RESPONSE_ID, str(response_id))

    def set_attribute(self, key: str, value: Any) -> None:
        """Any extra span attribute, set at the end (e.g. gen_ai.embeddings.dimension.count)."""
        if self._end_attrs is None:
            self._end_attrs = {}
        self._end_attrs.update(N.clean_attributes({key: value}))

    def set_error(self, error_type: object) -> None:
        """Mark the request failed without raising (error.type, span status ERROR)."""
        self._error_type = str(error_type)

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        """A span event on this request's span (streams are not the current span, so use this there)."""
        self.span.add_event(str(name), N.clean_attributes(attributes or {}))

    def capture_input(self, messages_or_text: object) -> None:
        if self._capture:
            self._input_content = messages_or_text

    def capture_output(self, text: str) -> None:
        if self._capture:
            self._output_content = text

    def stage(self, name: str, attributes: dict[str, Any] | None = None) -> StageSpan | _NoopStage:
        """Start the inference stage ``name`` (one of ``INFERENCE_STAGES``) as an INTERNAL child span of
        this request's span (its parent passed explicitly, never made current: streams work too); end it
        with ``end()`` or a ``with`` block before the request ends. The no-op stage when the request's
        span is not recording (sampled out, or the request not started / already ended)."""
        if name not in N.INFERENCE_STAGES:
            raise ValueError(f"unknown inference stage {name!r} (known: {', '.join(N.INFERENCE_STAGES)})")
        span = self.span
        if not span.is_recording():
            return NOOP_STAGE
        attrs = {N.INFERENCE_STAGE: name, **N.clean_attributes(attributes or {})}
        return StageSpan(
            self._tracer.start_span(
                name, context=trace.set_span_in_context(span), kind=SpanKind.INTERNAL, attributes=attrs
            )
        )

    @property
    def span(self) -> trace.Span:
        """The request's span (recording until the request ends; the invalid span before it starts)."""
        return self._span if not isinstance(self._span, tuple) else trace.INVALID_SPAN
