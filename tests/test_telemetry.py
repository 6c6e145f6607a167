# SPDX-License-Identifier: Apache-2.0
"""edgesdk.telemetry on the real OpenTelemetry SDK: spans, metrics, content capture, build traces.

Timing is real (sleeps stand in for model work); assertions read the SDK's in-memory exporter and
metric reader, and the JSON-lines file our exporter writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from edgesdk import telemetry
from edgesdk.telemetry import _names as N


@pytest.fixture
def memory(clean_env):
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    telemetry.configure(span_exporter=spans, metric_reader=reader)
    return spans, reader


def finished(exporter) -> list:
    assert telemetry.force_flush()
    return list(exporter.get_finished_spans())


def metric_points(reader) -> dict[str, list]:
    out: dict[str, list] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend((metric.unit, point) for point in metric.data.data_points)
    return out


def test_streaming_chat_span_and_metrics_follow_semconv(memory):
    spans, reader = memory
    step = 0.005
    with telemetry.inference(
        "chat",
        "gemma-3-270m",
        "llama.cpp",
        stream=True,
        request={"max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7},
        attributes={N.BACKEND: "llama.cpp", N.DEVICE_PROFILE: "orin", N.PRECISION: "q4_k_m", N.BUNDLE_ID: "abc123"},
    ) as rec:
        rec.set_input_tokens(12)
        time.sleep(step * 4)  # prefill
        for _ in range(6):
            rec.chunk()
            time.sleep(step)
        rec.set_output_tokens(6)
        rec.finish(["length"])
        rec.set_response_model("gemma-3-270m-q4_k_m")
    (span,) = finished(spans)
    assert span.name == "chat gemma-3-270m"
    assert span.kind is SpanKind.INTERNAL
    attrs = dict(span.attributes)
    assert attrs[N.OPERATION_NAME] == "chat" and attrs[N.PROVIDER_NAME] == "llama.cpp"
    assert attrs[N.REQUEST_MODEL] == "gemma-3-270m" and attrs[N.REQUEST_STREAM] is True
    assert attrs["gen_ai.request.max_tokens"] == 16 and attrs["gen_ai.request.seed"] == 7
    assert attrs["gen_ai.request.top_k"] == 40.0 and isinstance(attrs["gen_ai.request.top_k"], float)
    assert attrs[N.USAGE_INPUT_TOKENS] == 12 and attrs[N.USAGE_OUTPUT_TOKENS] == 6
    assert attrs[N.RESPONSE_FINISH_REASONS] == ("length",)
    assert attrs[N.RESPONSE_MODEL] == "gemma-3-270m-q4_k_m"
    assert attrs[N.BUNDLE_ID] == "abc123" and attrs[N.PRECISION] == "q4_k_m"
    # time to first chunk: the 4-step prefill, measured, not invented
    assert step * 4 <= attrs[N.RESPONSE_TIME_TO_FIRST_CHUNK] < step * 4 + 0.05
    assert N.ERROR_TYPE not in attrs and span.status.status_code is StatusCode.UNSET

    points = metric_points(reader)
    unit, duration = points[N.CLIENT_OPERATION_DURATION][0]
    assert unit == "s" and duration.count == 1 and list(duration.explicit_bounds) == N.DURATION_BUCKETS
    assert duration.sum >= step * 10
    assert dict(duration.attributes)[N.RESPONSE_MODEL] == "gemma-3-270m-q4_k_m"
    usage = {dict(p.attributes)[N.TOKEN_TYPE]: p for _, p in points[N.CLIENT_TOKEN_USAGE]}
    assert usage["input"].sum == 12 and usage["output"].sum == 6
    assert list(usage["input"].explicit_bounds) == N.TOKEN_BUCKETS
    ((_, per_chunk),) = points[N.CLIENT_TIME_PER_OUTPUT_CHUNK]
    assert per_chunk.count == 5 and per_chunk.sum >= step * 5  # one interval per chunk after the first
    ((_, tpot),) = points[N.SERVER_TIME_PER_OUTPUT_TOKEN]
    assert tpot.count == 1 and list(tpot.explicit_bounds) == N.TPOT_BUCKETS
    ((_, ttft),) = points[N.SERVER_TIME_TO_FIRST_TOKEN]
    assert list(ttft.explicit_bounds) == N.TTFT_BUCKETS and ttft.min >= step * 4


def test_exception_sets_error_type_status_and_still_records_duration(memory):
    spans, reader = memory
    with pytest.raises(RuntimeError, match="decode failed"):
        with telemetry.inference("embeddings", "all-MiniLM-L6-v2", "onnxruntime") as rec:
            rec.set_input_tokens(9)
            raise RuntimeError("decode failed")
    (span,) = finished(spans)
    assert span.name == "embeddings all-MiniLM-L6-v2"
    assert span.attributes[N.ERROR_TYPE] == "RuntimeError"
    assert span.status.status_code is StatusCode.ERROR
    ((_, duration),) = metric_points(reader)[N.CLIENT_OPERATION_DURATION]
    assert dict(duration.attributes)[N.ERROR_TYPE] == "RuntimeError"


def test_set_error_marks_failure_without_raising(memory):
    spans, _ = memory
    with telemetry.inference("text_completion", "m", "llama.cpp") as rec:
        rec.set_error("context_overflow")
    (span,) = finished(spans)
    assert span.attributes[N.ERROR_TYPE] == "context_overflow"
    assert span.status.status_code is StatusCode.ERROR


def test_content_capture_is_off_by_default(clean_env, tmp_path):
    trace_file = tmp_path / "t.jsonl"
    spans = InMemorySpanExporter()
    telemetry.configure(trace_file=trace_file, span_exporter=spans)
    assert not telemetry.capture_enabled()
    with telemetry.inference("chat", "m", "llama.cpp") as rec:
        rec.capture_input([{"role": "user", "content": "SECRET-PROMPT-1234"}])
        rec.capture_output("SECRET-OUTPUT-5678")
        rec.finish(["stop"])
    (span,) = finished(spans)
    telemetry.shutdown()
    text = trace_file.read_text()
    assert "chat m" in text  # the span was exported ...
    assert "SECRET" not in text  # ... without any content
    assert not any(key in span.attributes for key in (N.INPUT_MESSAGES, N.OUTPUT_MESSAGES, N.CAPTURE_MARKER))


@pytest.mark.parametrize("how", ["argument", "env"])
def test_content_capture_opt_in_writes_semconv_messages_and_marker(clean_env, how):
    spans = InMemorySpanExporter()
    if how == "env":
        clean_env.setenv("EDGESDK_CAPTURE_CONTENT", "1")
        telemetry.configure(span_exporter=spans)
    else:
        telemetry.configure(span_exporter=spans, capture_content=True)
    assert telemetry.capture_enabled()
    with telemetry.inference("chat", "m", "llama.cpp") as rec:
        rec.capture_input("hello there")
        rec.capture_output("general kenobi")
        rec.finish(["stop"])
    (span,) = finished(spans)
    assert span.attributes[N.CAPTURE_MARKER] is True
    assert json.loads(span.attributes[N.INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "hello there"}]}
    ]
    assert json.loads(span.attributes[N.OUTPUT_MESSAGES]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "general kenobi"}], "finish_reason": "stop"}
    ]


def test_nothing_configured_means_noop_and_no_spans(clean_env):
    rec = telemetry.inference("chat", "m", "llama.cpp")
    with rec as inner:
        inner.set_input_tokens(3)
        inner.chunk()
        inner.finish(["stop"])
    assert type(rec).__name__ == "_NoopRecorder"
    with telemetry.build_trace("m", "orin") as span:
        assert not span.is_recording()
    assert telemetry.stats()["enabled"] is False


def test_sdk_disabled_env_wins_over_arguments(clean_env, tmp_path):
    clean_env.setenv("OTEL_SDK_DISABLED", "true")
    telemetry.configure(trace_file=tmp_path / "t.jsonl")
    with telemetry.inference("chat", "m", "llama.cpp") as rec:
        rec.chunk()
    telemetry.shutdown()
    assert not (tmp_path / "t.jsonl").exists()


def test_env_trace_file_is_picked_up_without_configure(clean_env, tmp_path):
    path = tmp_path / "env.jsonl"
    clean_env.setenv("EDGESDK_TRACE_FILE", str(path))
    with telemetry.inference("chat", "m", "llama.cpp") as rec:  # first use configures from the environment
        rec.set_input_tokens(1)
    telemetry.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    spans = [s for doc in lines for rs in doc.get("resourceSpans", []) for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert [s["name"] for s in spans] == ["chat m"]
    assert any("resourceMetrics" in doc for doc in lines)  # metrics flushed at shutdown into the same file


def test_file_lines_use_otlp_json_encoding(clean_env, tmp_path):
    path = tmp_path / "t.jsonl"
    telemetry.configure(trace_file=path)
    with telemetry.inference("chat", "m", "llama.cpp") as rec:
        rec.set_input_tokens(5)
    telemetry.shutdown()
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    first = next(doc for doc in docs if "resourceSpans" in doc)  # metrics lines may come first
    span = first["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(span["traceId"]) == 32 and int(span["traceId"], 16)  # hex, not base64
    assert len(span["spanId"]) == 16 and int(span["spanId"], 16)
    assert span["kind"] == 1  # SPAN_KIND_INTERNAL as an integer
    assert isinstance(span["startTimeUnixNano"], str)  # fixed64 as a string
    tokens = {a["key"]: a["value"] for a in span["attributes"]}["gen_ai.usage.input_tokens"]
    assert tokens == {"intValue": "5"}


def test_build_trace_is_a_new_trace_with_stage_children(memory):
    spans, reader = memory
    outer_tracer = TracerProvider().get_tracer("app")
    with outer_tracer.start_as_current_span("app work"):
        with telemetry.build_trace("all-MiniLM-L6-v2", "orin", {"edgesdk.build.precision": "int8"}) as root:
            with telemetry.build_stage("export"):
                time.sleep(0.01)
            with telemetry.build_stage("quantize") as stage:
                stage.set_attribute(N.BUILD_STAGE_OUTCOME, "skipped")
            with pytest.raises(ValueError):
                with telemetry.build_stage("verify"):
                    raise ValueError("parity")
            telemetry.fallback_event("tensorrt", "onnxruntime", "TensorRT not installed")
            assert root.is_recording()
    by_name = {s.name: s for s in finished(spans)}
    build = by_name["edgesdk.build"]
    assert build.parent is None  # root even inside the app's span: one trace per build
    assert build.attributes[N.DEVICE_PROFILE] == "orin" and build.attributes[N.BUILD_OUTCOME] == "ok"
    for stage, outcome in (("export", "ok"), ("quantize", "skipped"), ("verify", "error")):
        span = by_name[f"edgesdk.build.{stage}"]
        assert span.parent.span_id == build.context.span_id
        assert span.context.trace_id == build.context.trace_id
        assert span.attributes[N.BUILD_STAGE_OUTCOME] == outcome
    assert by_name["edgesdk.build.verify"].attributes[N.ERROR_TYPE] == "ValueError"
    export = by_name["edgesdk.build.export"]
    assert (export.end_time - export.start_time) / 1e9 >= 0.01
    (event,) = build.events
    assert event.name == "edgesdk.fallback" and event.attributes[N.FALLBACK_TO] == "onnxruntime"
    stages = {dict(p.attributes)[N.BUILD_STAGE] for _, p in metric_points(reader)[N.BUILD_STAGE_DURATION]}
    assert stages == {"export", "quantize", "verify"}


def test_fallback_outside_any_span_gets_its_own_span(memory):
    spans, _ = memory
    telemetry.fallback_event("cuda", "cpu", "no CUDA libraries")
    (span,) = finished(spans)
    assert span.name == "edgesdk.fallback"
    assert span.events[0].attributes[N.FALLBACK_REASON] == "no CUDA libraries"


def test_fallback_inside_inference_lands_on_that_span(memory):
    spans, _ = memory
    with telemetry.inference("embeddings", "m", "onnxruntime"):
        telemetry.fallback_event("TensorrtExecutionProvider", "CPUExecutionProvider", "engine build failed")
    (span,) = finished(spans)
    assert [e.name for e in span.events] == ["edgesdk.fallback"]


def test_application_sdk_provider_is_used_when_nothing_else_configured(clean_env):
    # OTel's global provider is set-once per process, so this runs in a child interpreter.
    script = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from edgesdk import telemetry
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
with telemetry.inference("chat", "m", "llama.cpp"):
    pass
print([s.name for s in exporter.get_finished_spans()], telemetry.stats()["exporters"])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['chat m'] ['application']"


def test_configure_is_idempotent_and_reconfigurable(clean_env, tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    telemetry.configure(trace_file=first)
    telemetry.configure(trace_file=first)  # same settings: keeps the providers
    assert telemetry.stats()["exporters"] == [f"file:{first}"]
    telemetry.configure(trace_file=second)
    with telemetry.inference("chat", "m", "llama.cpp"):
        pass
    telemetry.shutdown()
    assert "chat m" in second.read_text()
    assert "chat m" not in first.read_text()


def test_bad_protocol_is_a_one_line_input_error(clean_env):
    from edgesdk.errors import InputError

    with pytest.raises(InputError, match="unsupported OTLP protocol"):
        telemetry.configure(otlp_endpoint="http://127.0.0.1:4317", otlp_protocol="carrier-pigeon")


def test_streaming_generator_closed_early_from_another_context(memory, caplog):
    """A backend's stream() runs the recorder inside a generator; the consumer may stop early and the
    generator may be closed elsewhere. That is a cancelled request, not an error, and no OTel errors."""
    import contextvars
    import logging

    spans, _ = memory

    def stream():
        with telemetry.inference("text_completion", "gemma", "llama.cpp", stream=True) as rec:
            n = 0
            try:
                for piece in ("a", "b", "c", "d"):
                    rec.chunk()
                    n += 1
                    yield piece
            finally:
                rec.set_output_tokens(n)
                rec.finish(["cancelled" if n < 4 else "stop"])

    generator = stream()
    assert next(generator) == "a"
    with caplog.at_level(logging.ERROR):
        contextvars.copy_context().run(generator.close)
    assert "Failed to detach" not in caplog.text
    (span,) = finished(spans)
    assert span.attributes[N.RESPONSE_FINISH_REASONS] == ("cancelled",)
    assert N.ERROR_TYPE not in span.attributes and span.status.status_code is StatusCode.UNSET
    with telemetry.inference("chat", "m", "llama.cpp"):  # the stream's span did not leak into this context
        pass
    later = finished(spans)[1]
    assert later.parent is None


def test_stream_span_is_not_current_but_takes_events(memory):
    spans, _ = memory
    with telemetry.inference("chat", "outer", "llama.cpp"):
        before = time.time_ns()
        with telemetry.inference("chat", "m", "llama.cpp", stream=True) as rec:
            time.sleep(0.02)
            rec.add_event(
                "edgesdk.fallback",
                {"edgesdk.fallback.from": "cuda", "edgesdk.fallback.to": "cpu", "edgesdk.fallback.reason": "OOM"},
            )
            time.sleep(0.02)
            assert trace.get_current_span() is not rec.span
            assert rec.span.is_recording()  # started with the request, never made current
        after = time.time_ns()
    by_name = {s.name: s for s in finished(spans)}
    stream = by_name["chat m"]
    assert stream.parent.span_id == by_name["chat outer"].context.span_id
    assert stream.context.trace_id == by_name["chat outer"].context.trace_id
    assert [e.name for e in stream.events] == ["edgesdk.fallback"]
    # The span's times are the request's: start before the event, end after it.
    assert before <= stream.start_time < stream.events[0].timestamp < stream.end_time <= after
    assert stream.events[0].timestamp - stream.start_time >= 15_000_000
    assert stream.attributes["gen_ai.operation.name"] == "chat" and stream.attributes["gen_ai.request.stream"]


def test_unwritable_trace_file_is_a_one_line_input_error(clean_env, tmp_path):
    from edgesdk.errors import InputError

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(InputError, match="cannot write trace file"):
        telemetry.configure(trace_file=blocker / "t.jsonl")


def test_bad_environment_disables_telemetry_instead_of_failing_inference(clean_env, caplog):
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "smoke-signals")
    with telemetry.inference("chat", "m", "llama.cpp") as rec:  # must not raise
        rec.chunk()
    assert telemetry.stats()["enabled"] is False
    assert "telemetry disabled" in caplog.text


def test_concurrent_requests_from_threads(memory):
    import threading

    spans, reader = memory

    def worker(i):
        for j in range(50):
            with telemetry.inference("chat", f"m{i}", "llama.cpp", stream=True) as rec:
                rec.set_input_tokens(j)
                rec.chunk()
                rec.chunk()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = finished(spans)
    assert len(done) == 200 and all(s.parent is None for s in done)
    durations = metric_points(reader)[N.CLIENT_OPERATION_DURATION]
    assert sum(p.count for _, p in durations) == 200


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_keeps_exporting(clean_env, tmp_path):
    path = tmp_path / "fork.jsonl"
    telemetry.configure(trace_file=path)
    with telemetry.inference("chat", "parent", "llama.cpp"):
        pass
    pid = os.fork()
    if pid == 0:  # child: inherited providers; the SDK's batch and metric reader threads restart
        code = 1
        try:
            with telemetry.inference("chat", "child", "llama.cpp") as rec:
                rec.set_input_tokens(1)
            telemetry.shutdown()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    telemetry.shutdown()
    names = [
        s["name"]
        for line in path.read_text().splitlines()
        for rs in json.loads(line).get("resourceSpans", [])
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]
    assert sorted(names) == ["chat child", "chat parent"]


def test_license_deny_in_a_stage_is_denied_not_error(memory):
    from edgesdk.errors import LicenseGateError

    spans, _ = memory
    with pytest.raises(LicenseGateError):
        with telemetry.build_trace("m", "orin"):
            with telemetry.build_stage("license_gate"):
                raise LicenseGateError("license gate: deny: GPL-3.0-only in model.gguf")
    by_name = {s.name: s for s in finished(spans)}
    gate = by_name["edgesdk.build.license_gate"]
    assert gate.attributes[N.BUILD_STAGE_OUTCOME] == "denied"
    assert gate.attributes[N.ERROR_TYPE] == "edgesdk.errors.LicenseGateError"
    assert by_name["edgesdk.build"].attributes[N.BUILD_OUTCOME] == "denied"


def test_names_match_the_semantic_conventions_package():
    """_names.py spells the GenAI names as strings (the base install has no semconv package): they
    must be the package's constants wherever that package is installed."""
    attrs = pytest.importorskip("opentelemetry.semconv._incubating.attributes.gen_ai_attributes")
    metrics = pytest.importorskip("opentelemetry.semconv._incubating.metrics.gen_ai_metrics")
    from opentelemetry.semconv.attributes import error_attributes, server_attributes

    known = {
        value
        for module in (attrs, metrics, error_attributes, server_attributes)
        for key, value in vars(module).items()
        if key.isupper() and isinstance(value, str)
    }
    ours = [
        value
        for key, value in vars(N).items()
        if key.isupper() and isinstance(value, str) and value.startswith(("gen_ai.", "error.", "server."))
    ]
    ours += [name for name, _ in N.REQUEST_PARAMS.values()]
    assert len(ours) > 25
    assert sorted(set(ours) - known) == []


_NO_SDK = """
import sys

class _Blocker:  # the base install: opentelemetry-api only, no SDK, exporters or semconv package
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[:2] in (["opentelemetry", "sdk"], ["opentelemetry", "exporter"],
                                   ["opentelemetry", "semconv"]):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Blocker())
"""


def test_base_install_cli_trace_file_is_a_one_line_error(clean_env, tmp_path):
    script = (
        _NO_SDK
        + f"""
from edgesdk.cli import main
sys.argv = ["edgesdk", "run", {str(tmp_path / "missing-bundle")!r}, "--input", "hi",
            "--trace-file", {str(tmp_path / "t.jsonl")!r}]
main()
"""
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 10, done.stdout + done.stderr  # MissingExtraError (docs/exit-codes.md)
    assert done.stderr.startswith(
        "error: exporting telemetry (--trace-file, OTEL_EXPORTER_OTLP_*) needs the otel "
        "extra: pip install 'edgesdk[otel]'"
    )
    assert "Traceback" not in done.stderr


def test_application_providers_are_kept_and_used(clean_env):
    """An application that installed its own TracerProvider and MeterProvider (after importing
    edgesdk, even after a first request) gets edgesdk's spans and metrics there; edgesdk never
    replaces or shuts them down."""
    script = """
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from edgesdk import telemetry
with telemetry.inference("chat", "early", "llama.cpp"):  # nothing installed yet: not recorded
    pass
exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
with telemetry.inference("chat", "m", "llama.cpp") as rec:
    rec.set_input_tokens(3)
telemetry.shutdown()
assert trace.get_tracer_provider() is provider
names = sorted(m.name for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics)
print([s.name for s in exporter.get_finished_spans()], names)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("['chat m'] ['gen_ai.client.operation.duration', 'gen_ai.client.token.usage']")
