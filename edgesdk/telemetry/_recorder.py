# SPDX-License-Identifier: Apache-2.0
"""The per-request inference recorder: one INTERNAL span plus GenAI metrics.

Budget (benchmark P6): <= 50 us per request and <= 5 us per generated token of total process CPU.
On the caller's thread a request costs timestamps (``chunk()`` appends one) and, for non-streaming
requests only, deciding the span with the sampling-relevant attributes (``start_span``, or
``DirectSpans.start`` on edgesdk's own provider) plus a context attach.
Everything else — the span of a streaming request, the remaining attributes, status,
``span.end(end_time=...)`` and the histogram values — happens in :class:`FinishWorker` on a
background thread, overlapping with the model's native compute; the worker hands a whole drain's
histogram values to the SDK in one batch (see ``_histograms``) and, on edgesdk's own provider, makes
each ended span in one step (see ``_direct_spans``).
"""

from __future__ import annotations

import collections
import threading
from time import perf_counter, time_ns

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanKind, Status, StatusCode

from edgesdk.telemetry import _names as N
from edgesdk.telemetry._direct_spans import DeferredSpan
from edgesdk.telemetry._histograms import HistogramRecorder


class Instruments:
    """Histograms with the advised bucket boundaries (the semconv helpers set name/unit only)."""

    def __init__(self, meter):
        self.recorder = HistogramRecorder()

        def hist(name, unit, description, buckets):
            return meter.create_histogram(name, unit=unit, description=description,
                                          explicit_bucket_boundaries_advisory=buckets)

        self.duration = hist(N.CLIENT_OPERATION_DURATION, "s", "GenAI operation duration", N.DURATION_BUCKETS)
        self.token_usage = hist(N.CLIENT_TOKEN_USAGE, "{token}", "Number of input and output tokens used",
                                N.TOKEN_BUCKETS)
        self.ttfc = hist(N.CLIENT_TIME_TO_FIRST_CHUNK, "s", "Time to receive the first chunk",
                         N.DURATION_BUCKETS)
        self.tpoc = hist(N.CLIENT_TIME_PER_OUTPUT_CHUNK, "s", "Time between consecutive output chunks",
                         N.DURATION_BUCKETS)
        self.server_ttft = hist(N.SERVER_TIME_TO_FIRST_TOKEN, "s", "Time to generate the first token",
                                N.TTFT_BUCKETS)
        self.server_tpot = hist(N.SERVER_TIME_PER_OUTPUT_TOKEN, "s",
                                "Time per output token after the first", N.TPOT_BUCKETS)
        self.build_stage_duration = hist(N.BUILD_STAGE_DURATION, "s", "edgesdk build stage duration",
                                         N.DURATION_BUCKETS)


class FinishWorker:
    """Finishes requests on a background thread: end attributes, ``span.end``, histogram records.

    ``submit`` is a deque append. The backlog is bounded: past ``MAX_PENDING`` the caller finishes
    the request itself (counted as ``finished_inline`` in ``telemetry.stats()``), so nothing is lost.
    ``drain()`` (called by ``telemetry.force_flush`` and ``shutdown``) finishes everything pending.
    """

    MAX_PENDING = 8192
    WAKE_AT = 256
    BATCH = 256
    INTERVAL_S = 0.5

    def __init__(self, counters):
        self._pending = collections.deque()
        self._counters = counters
        self._drain_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread = None
        self._start()

    def _start(self):
        self._thread = threading.Thread(target=self._run, name="edgesdk-telemetry-finisher", daemon=True)
        self._thread.start()

    def after_fork(self):
        """In a forked child the thread is gone: start a fresh one (telemetry/__init__ registers this)."""
        self._pending.clear()
        self._drain_lock = threading.Lock()
        self._wake = threading.Event()
        if not self._stopped:
            self._start()

    def submit(self, recorder) -> bool:
        """Queue a finished request; False when the caller must finish it (backlog full, stopped)."""
        pending = self._pending
        if len(pending) >= self.MAX_PENDING or self._stopped:
            self._counters.add("finished_inline", 1)
            return False
        pending.append(recorder)
        if len(pending) >= self.WAKE_AT:
            self._wake.set()
        return True

    def _run(self):
        while not self._stopped:
            self._wake.wait(self.INTERVAL_S)
            self._wake.clear()
            self.drain()

    def drain(self) -> None:
        with self._drain_lock:
            pending = self._pending
            while pending:
                # The histogram values of up to BATCH requests go to the SDK in one call, which merges
                # the ones with the same instrument and attributes (see _histograms).
                points: list = []
                recorder = None
                for _ in range(self.BATCH):
                    try:
                        recorder = pending.popleft()
                    except IndexError:
                        break
                    self._guarded(recorder.complete, points)
                if points:
                    self._guarded(recorder.record_points, points)

    def _guarded(self, step, points) -> None:
        try:
            step(points)
        except Exception as exc:  # noqa: BLE001 - a telemetry bug must never surface in inference
            self._counters.add("export_errors", 1)
            self._counters.warn_once("finish", f"telemetry: finishing a request failed: {exc!r}")

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self.drain()


class _NoopRecorder:
    """Returned when telemetry is off: every method does nothing, so callers need no branches."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return False

    def set_input_tokens(self, n):
        pass

    def set_output_tokens(self, n):
        pass

    def first_chunk(self):
        pass

    def chunk(self):
        pass

    def finish(self, reasons):
        pass

    def set_response_model(self, name):
        pass

    def set_response_id(self, response_id):
        pass

    def set_attribute(self, key, value):
        pass

    def set_error(self, error_type):
        pass

    def add_event(self, name, attributes=None):
        pass

    def capture_input(self, messages_or_text):
        pass

    def capture_output(self, text):
        pass

    @property
    def span(self):
        return trace.INVALID_SPAN


NOOP_RECORDER = _NoopRecorder()


class InferenceRecorder:
    """One request. The caller's thread takes timestamps; the span's attributes, status, end and the
    histograms happen in :meth:`complete` on the worker thread.

    A non-streaming request starts its span on the caller's thread (with the sampling-relevant
    attributes, as the conventions ask) and makes it the current span while the request runs, so
    fallback events and nested spans attach to it. A streaming request is never the current span (its
    block lives in a generator across yields), so nothing can attach to it while it runs: its span is
    created on the worker, with the parent context and start time captured at the start and every
    attribute at once: the same span, at a seventh of the caller-thread cost (P6: 14 -> 2 us). Until
    then ``span`` is the invalid span and :meth:`add_event` keeps events (with their time) for the
    worker to add.
    """

    __slots__ = ("_tracer", "_instruments", "_worker", "_capture", "_operation", "_model", "_provider",
                 "_stream", "_request", "_attributes", "_span", "_token", "_t0", "_end", "_end_ns", "_first",
                 "_times", "_input_tokens", "_output_tokens", "_reasons", "_response_model", "_input_content",
                 "_output_content", "_error_type", "_error_text", "_end_attrs", "_parent", "_start_ns", "_events",
                 "_direct")

    def __init__(self, tracer, instruments, worker, capture, operation, model, provider, stream, request,
                 attributes, direct=None):
        self._tracer = tracer
        self._direct = direct  # _direct_spans.DirectSpans on edgesdk's own provider, else None
        self._instruments = instruments
        self._worker = worker
        self._capture = capture
        self._operation = operation
        self._model = model
        self._provider = provider
        self._stream = stream
        self._request = request
        self._attributes = attributes
        self._first = None
        self._times = []
        self._input_tokens = None
        self._output_tokens = None
        self._reasons = None
        self._response_model = None
        self._input_content = None
        self._output_content = None
        self._error_type = None
        self._error_text = None
        self._end_attrs = None
        self._span = None
        self._token = None
        self._parent = None
        self._start_ns = None
        self._events = None

    def _name_and_start_attributes(self):
        model = self._model
        if model:
            return f"{self._operation} {model}", {N.OPERATION_NAME: self._operation,
                                                   N.PROVIDER_NAME: self._provider, N.REQUEST_MODEL: model}
        return self._operation, {N.OPERATION_NAME: self._operation, N.PROVIDER_NAME: self._provider}

    # -- context manager --
    def __enter__(self):
        if self._stream:
            # Deferred to the worker (see the class docstring). Not attached either: an attached
            # context would leak into the consumer's code across yields and may be closed from
            # another context.
            self._parent = otel_context.get_current()
            self._start_ns = time_ns()
        else:
            name, start = self._name_and_start_attributes()
            direct = self._direct
            span = direct.start(name, start) if direct is not None else None  # decided now, made at the end
            self._span = span if span is not None else self._tracer.start_span(name, kind=SpanKind.INTERNAL,
                                                                               attributes=start)
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
        self._t0 = perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._end = perf_counter()
        self._end_ns = time_ns()
        token = self._token
        if token is not None:
            var = getattr(token, "var", None)  # a contextvars.Token with the default runtime context
            if var is None:
                otel_context.detach(token)
            else:
                try:
                    var.reset(token)
                except ValueError:
                    pass  # exited from another context (a generator closed elsewhere): nothing to restore
        if exc is not None and exc_type is not GeneratorExit:  # GeneratorExit: a stream stopped early
            self._error_type = N.error_type(exc)
            self._error_text = N.error_description(exc)
        worker = self._worker
        if worker is None or not worker.submit(self):
            self.complete()
        return False

    def complete(self, points: list | None = None):
        """Attributes, status, end and histograms of this finished request (normally on the worker).

        With ``points`` the histogram values are appended there for the caller to record in one
        batch (:meth:`record_points`); without, they are recorded now.
        """
        span = self._span
        attrs = {}
        if self._stream:
            attrs[N.REQUEST_STREAM] = True
        if self._request:
            attrs.update(N.request_attributes(self._request))
        if self._attributes:
            attrs.update(N.clean_attributes(self._attributes))
        if self._end_attrs:
            attrs.update(self._end_attrs)
        metric_attrs = {N.OPERATION_NAME: self._operation, N.PROVIDER_NAME: self._provider}
        if self._model:
            metric_attrs[N.REQUEST_MODEL] = self._model
        if self._response_model:
            attrs[N.RESPONSE_MODEL] = self._response_model
            metric_attrs[N.RESPONSE_MODEL] = self._response_model
        error_type = self._error_type
        if error_type is not None:
            attrs[N.ERROR_TYPE] = error_type
            metric_attrs[N.ERROR_TYPE] = error_type
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
            self._add_content(attrs)
        status = Status(StatusCode.ERROR, self._error_text or error_type) if error_type is not None else None
        if span is None:  # a stream: the whole span now, every attribute at creation
            name, start = self._name_and_start_attributes()
            start.update(attrs)
            direct = self._direct
            context = None
            if direct is not None and not self._events:  # the SDK's span in one step (_direct_spans)
                context = direct.emit(name, self._parent, start, self._start_ns, self._end_ns, status)
            if context is not None:
                self._span, span = NonRecordingSpan(context), None
            else:
                span = self._span = self._tracer.start_span(name, context=self._parent, kind=SpanKind.INTERNAL,
                                                            attributes=start, start_time=self._start_ns)
                for event_name, event_attrs, event_ns in self._events or ():
                    span.add_event(event_name, event_attrs, timestamp=event_ns)
        elif type(span) is DeferredSpan:  # decided at the start, made now (or the SDK's, if it was used)
            span.finish(attrs, self._end_ns, status)
            span = None
        else:
            span.set_attributes(attrs)
        if span is not None:
            if status is not None:
                span.set_status(status)
            span.end(end_time=self._end_ns)
        if self._instruments is None:
            return
        if points is None:
            points = []
            self._metric_points(metric_attrs, points)
            self.record_points(points)
        else:
            self._metric_points(metric_attrs, points)

    def record_points(self, points: list) -> None:
        # Same data points as one Histogram.record per value, a fraction of the CPU (_histograms).
        self._instruments.recorder.record_points(points)

    def _add_content(self, attrs):
        reason = self._reasons[0] if self._reasons else ("error" if self._error_type else "stop")
        if self._input_content is not None:
            attrs[N.INPUT_MESSAGES] = N.text_messages("user", self._input_content)
        if self._output_content is not None:
            attrs[N.OUTPUT_MESSAGES] = N.text_messages("assistant", self._output_content, reason)
        if self._input_content is not None or self._output_content is not None:
            attrs[N.CAPTURE_MARKER] = True

    def _metric_points(self, metric_attrs, points):
        inst = self._instruments
        first, times = self._first, self._times
        points.append((inst.duration, metric_attrs, (self._end - self._t0,)))
        if self._input_tokens is not None:
            points.append((inst.token_usage, {**metric_attrs, N.TOKEN_TYPE: "input"}, (self._input_tokens,)))
        if self._output_tokens is not None:
            points.append((inst.token_usage, {**metric_attrs, N.TOKEN_TYPE: "output"}, (self._output_tokens,)))
        if self._error_type is not None or first is None:
            return
        ttfc = first - self._t0
        points.append((inst.server_ttft, metric_attrs, (ttfc,)))
        if self._stream:
            # The client chunk metrics SHOULD be reported for streaming calls only (semconv): one
            # value per chunk after the first.
            points.append((inst.ttfc, metric_attrs, (ttfc,)))
            if len(times) >= 2:
                points.append((inst.tpoc, metric_attrs, [now - before for before, now in zip(times, times[1:])]))
        if len(times) >= 2:
            points.append((inst.server_tpot, metric_attrs, ((times[-1] - times[0]) / (len(times) - 1),)))

    # -- recording API --
    def set_input_tokens(self, n):
        self._input_tokens = int(n)

    def set_output_tokens(self, n):
        self._output_tokens = int(n)

    def first_chunk(self):
        if self._first is None:
            self._first = perf_counter()

    def chunk(self):
        self._times.append(perf_counter())

    def finish(self, reasons):
        self._reasons = [reasons] if isinstance(reasons, str) else [str(r) for r in reasons]

    def set_response_model(self, name):
        self._response_model = str(name)

    def set_response_id(self, response_id):
        self.set_attribute(N.RESPONSE_ID, str(response_id))

    def set_attribute(self, key, value):
        """Any extra span attribute, set at the end (e.g. gen_ai.embeddings.dimension.count)."""
        if self._end_attrs is None:
            self._end_attrs = {}
        self._end_attrs.update(N.clean_attributes({key: value}))

    def set_error(self, error_type):
        """Mark the request failed without raising (error.type, span status ERROR)."""
        self._error_type = str(error_type)

    def add_event(self, name, attributes=None):
        """A span event on this request's span (streams are not the current span, so use this there)."""
        if self._span is not None:
            self._span.add_event(str(name), N.clean_attributes(attributes or {}))
        elif self._stream:
            if self._events is None:
                self._events = []
            self._events.append((str(name), N.clean_attributes(attributes or {}), time_ns()))

    def capture_input(self, messages_or_text):
        if self._capture:
            self._input_content = messages_or_text

    def capture_output(self, text):
        if self._capture:
            self._output_content = text

    @property
    def span(self):
        """The request's span; for a stream, the invalid span until the worker has created it (then a
        non-recording span with its context when it was made in one step: it has ended anyway)."""
        return self._span if self._span is not None else trace.INVALID_SPAN
