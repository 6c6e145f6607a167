# SPDX-License-Identifier: Apache-2.0
"""Export paths against real receivers on loopback: OTLP/gRPC (opentelemetry-proto + grpcio),
OTLP/HTTP (http.server + protobuf), a dead endpoint, a stalled exporter, the console."""

from __future__ import annotations

import gzip
import http.server
import json
import logging
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from edgesdk import telemetry


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self):
        self.traces: list = []
        self.metrics: list = []

    def Export(self, request, context):  # noqa: N802 - gRPC method name
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            self.traces.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()
        self.metrics.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@pytest.fixture
def grpc_receiver():
    receiver = _Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield receiver, f"http://127.0.0.1:{port}"
    server.stop(grace=None)


def _span_names(requests) -> list[str]:
    return [span.name for req in requests for rs in req.resource_spans for ss in rs.scope_spans for span in ss.spans]


def _one_request() -> None:
    with telemetry.inference("chat", "gemma-3-270m", "llama.cpp", stream=True) as rec:
        rec.set_input_tokens(4)
        for _ in range(3):
            rec.chunk()
        rec.set_output_tokens(3)
        rec.finish(["stop"])


@pytest.mark.parametrize("how", ["argument", "env"])
def test_otlp_grpc_receiver_gets_spans_and_metrics(clean_env, grpc_receiver, how):
    receiver, endpoint = grpc_receiver
    if how == "env":
        clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    else:
        telemetry.configure(otlp_endpoint=endpoint, otlp_protocol="grpc")
    _one_request()
    telemetry.shutdown()
    assert _span_names(receiver.traces) == ["chat gemma-3-270m"]
    span = receiver.traces[0].resource_spans[0].scope_spans[0].spans[0]
    attrs = {kv.key: kv.value for kv in span.attributes}
    assert attrs["gen_ai.provider.name"].string_value == "llama.cpp"
    assert attrs["gen_ai.usage.output_tokens"].int_value == 3
    names = {m.name for req in receiver.metrics for rm in req.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics}
    assert {"gen_ai.client.operation.duration", "gen_ai.client.token.usage",
            "gen_ai.client.operation.time_per_output_chunk"} <= names


class _HTTPReceiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP receiver: keeps (path, headers, raw body) of every POST; ``status`` is its answer."""

    def __init__(self):
        self.posts: list[tuple[str, dict, bytes]] = []
        self.status = 200
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                reply = b"" if receiver.status != 200 else (
                    metrics_service_pb2.ExportMetricsServiceResponse() if "metrics" in self.path
                    else trace_service_pb2.ExportTraceServiceResponse()).SerializeToString()
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def traces(self, path_part: str = "spans") -> list:
        out = []
        for path, headers, body in self.posts:
            if path_part in path or path.endswith("/v1/traces"):
                if headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                out.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
        return out


@pytest.fixture
def http_receiver():
    server = _HTTPReceiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("how", ["argument", "env-per-signal"])
def test_otlp_http_receiver_gets_spans(clean_env, how, http_receiver):
    receiver, base = http_receiver
    if how == "argument":  # a base URL: /v1/traces and /v1/metrics are appended
        telemetry.configure(otlp_endpoint=base, otlp_protocol="http/protobuf")
    else:  # per-signal variables are used exactly as given (OTLP exporter spec)
        clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        clean_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{base}/custom/spans")
        clean_env.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"{base}/v1/metrics")
    _one_request()
    telemetry.shutdown()
    assert _span_names(receiver.traces()) == ["chat gemma-3-270m"]
    assert [p for p, _, _ in receiver.posts if p == "/v1/metrics"], "metrics were not posted to /v1/metrics"


def test_otlp_http_exporter_posts_the_sdk_request(http_receiver, caplog):
    """Our OTLP/HTTP exporter posts bytes that parse to exactly what the SDK's encoder builds, through
    the SDK's client: gzip, headers, an HTTP error and the size limit behave as the SDK's own export."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from edgesdk.telemetry._span_proto import http_span_exporter_class

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "edge", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("edgesdk", "1.0")
    for i in range(40):
        span = tracer.start_span(f"chat m{i % 3}", attributes={"gen_ai.usage.output_tokens": i, "x": ("a", "b")})
        if i == 7:
            span.add_event("edgesdk.fallback", {"edgesdk.fallback.from": "cuda"})
        span.end()
    spans = memory.get_finished_spans()
    receiver, base = http_receiver
    fast_class = http_span_exporter_class()
    for compression in (Compression.NoCompression, Compression.Gzip):
        exporter = fast_class(endpoint=f"{base}/v1/traces", compression=compression, headers={"x-fleet": "orin-7"})
        assert exporter.fast_path
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        stock = OTLPSpanExporter(endpoint=f"{base}/v1/traces", compression=compression, headers={"x-fleet": "orin-7"})
        assert stock.export(spans) is SpanExportResult.SUCCESS
    (mine_path, mine_headers, _), (_, stock_headers, _) = receiver.posts[0], receiver.posts[1]
    assert mine_path == "/v1/traces" and mine_headers["x-fleet"] == "orin-7"
    assert mine_headers["content-type"] == stock_headers["content-type"] == "application/x-protobuf"
    assert receiver.posts[2][1].get("content-encoding") == "gzip"
    reference = encode_spans(spans)
    assert receiver.traces() == [reference] * 4
    # A receiver that refuses (HTTP 400: not retried) fails the batch, as the SDK's export does.
    receiver.status = 400
    assert fast_class(endpoint=f"{base}/v1/traces").export(spans) is SpanExportResult.FAILURE
    # Over max_request_size: dropped before sending, with the SDK's warning.
    receiver.status, before = 200, len(receiver.posts)
    small = fast_class(endpoint=f"{base}/v1/traces", max_request_size=100)
    with caplog.at_level(logging.WARNING):
        assert small.export(spans) is SpanExportResult.FAILURE
    assert len(receiver.posts) == before and "exceeds max_request_size" in caplog.text
    # Shut down: the SDK's own refusal.
    small.shutdown()
    assert small.export(spans) is SpanExportResult.FAILURE


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_dead_endpoint_does_not_block_inference(clean_env, caplog):
    telemetry.configure(otlp_endpoint=f"http://127.0.0.1:{_closed_port()}", otlp_protocol="grpc")
    start = time.perf_counter()
    for _ in range(300):
        _one_request()
    per_request = (time.perf_counter() - start) / 300
    # An export that blocked the caller would take the 2 s export timeout; the requests take microseconds.
    assert per_request < 0.005, f"{per_request * 1e3:.2f} ms per request with a dead collector"
    with caplog.at_level(logging.WARNING):
        start = time.perf_counter()
        telemetry.shutdown()
        shutdown_s = time.perf_counter() - start
    assert shutdown_s < 8.0  # bounded: export timeout 2 s, both providers in parallel
    stats = telemetry.stats()
    assert stats["spans_exported"] == 0 and stats["spans_failed"] == 300
    assert "export failed" in caplog.text


class _StalledExporter(SpanExporter):
    """Stands in for a collector that accepts slowly (each batch takes 0.2 s)."""

    def __init__(self):
        self.exported = 0

    def export(self, spans):
        time.sleep(0.2)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def test_full_queue_drops_and_counts_instead_of_blocking(clean_env):
    exporter = _StalledExporter()
    telemetry.configure(span_exporter=exporter)
    total = 4000
    start = time.perf_counter()
    for _ in range(total):
        with telemetry.inference("embeddings", "m", "onnxruntime"):
            pass
    elapsed = time.perf_counter() - start
    assert elapsed < 4.0, f"{total} requests took {elapsed:.2f} s behind a stalled exporter"
    telemetry.shutdown()
    stats = telemetry.stats()
    assert stats["spans_dropped"] > 0
    # Nothing lost silently: every span is either exported or counted as dropped.
    assert stats["spans_exported"] == exporter.exported
    assert stats["spans_exported"] + stats["spans_dropped"] == total


def test_console_exporter(clean_env, capsys):
    telemetry.configure(console=True)
    _one_request()
    telemetry.shutdown()
    assert '"name": "chat gemma-3-270m"' in capsys.readouterr().out


def test_direct_json_encoder_matches_the_otlp_protobuf_json_mapping(clean_env):
    """The file exporter's fast encoder must write exactly what OTLP protobuf -> JSON would."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from edgesdk.telemetry._exporters import to_otlp_json
    from edgesdk.telemetry._span_json import export_request, export_request_json

    memory = InMemorySpanExporter()
    telemetry.configure(span_exporter=memory, capture_content=True)
    with telemetry.inference("chat", "gemma", "llama.cpp", stream=True,
                             request={"max_tokens": 8, "temperature": 0.5, "stop_sequences": ["\n", "END"]},
                             attributes={"edgesdk.bundle.id": "", "edgesdk.flag": False}) as rec:
        rec.set_input_tokens(3)
        rec.chunk()
        rec.capture_input("héllo")
        rec.add_event("edgesdk.fallback", {"edgesdk.fallback.latency_ratio": float("nan")})
        rec.finish(["stop"])
    with pytest.raises(KeyError):
        with telemetry.build_trace("m", "orin"):
            with telemetry.build_stage("export"):
                raise KeyError("x")
    telemetry.force_flush()
    spans = memory.get_finished_spans()
    assert len(spans) == 3
    reference = to_otlp_json(encode_spans(spans))
    assert export_request(spans) == reference
    assert json.loads(export_request_json(spans)) == reference
    plain = [s for s in spans if not s.events]  # the text path's own branch (no events/links)
    assert plain and json.loads(export_request_json(plain)) == to_otlp_json(encode_spans(plain))


def test_direct_json_encoder_caches_never_mix_up_equal_values_of_other_types():
    """1, 1.0 and True are equal dict keys: the encoder's text caches must still keep their types."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from edgesdk.telemetry._exporters import to_otlp_json
    from edgesdk.telemetry._span_json import export_request_json

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    shapes = [
        {"a": "1", "b": ("x", "y"), "c": "héllo\n\"q\"", "d": (), "e": 2**62, "f": float("inf")},
        {"a": 1, "b": (1, 2), "c": True, "d": ("",), "e": -5, "f": 1.0},
        {"a": True, "b": (True,), "c": 1.0, "d": (1.5, 2.5), "e": "2", "f": float("nan")},
        {"a": 1.0, "b": ("x", "y"), "c": 1, "d": "", "e": 0, "f": False},
    ]
    for _ in range(2):  # the second pass is served from the caches
        for attrs in shapes:
            tracer.start_span("s", attributes=attrs).end()
    spans = memory.get_finished_spans()
    for span in spans:
        assert json.loads(export_request_json([span])) == to_otlp_json(encode_spans([span]))
    assert json.loads(export_request_json(spans)) == to_otlp_json(encode_spans(spans))


def test_direct_json_encoder_pieces_over_resources_scopes_and_many_spans():
    """Big batches are written in pieces; joined, they must equal the protobuf encoding."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from edgesdk.telemetry._exporters import to_otlp_json
    from edgesdk.telemetry._span_json import export_request_json, export_request_parts

    memory = InMemorySpanExporter()
    tracers = []
    for name in ("a", "b"):
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracers += [provider.get_tracer("scope-1"), provider.get_tracer("scope-2", schema_url="https://x/1.0")]
    for i in range(150):
        tracers[i % 3].start_span(f"s{i}", attributes={"i": i, "m": "model"}).end()
    spans = memory.get_finished_spans()
    assert len(export_request_parts(spans)) > 6
    assert json.loads(export_request_json(spans)) == to_otlp_json(encode_spans(spans))


def test_direct_protobuf_encoder_matches_the_sdk_encoder_byte_for_byte():
    """The OTLP/gRPC exporter's request bytes must be what the SDK's encode_spans would send."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, Status, StatusCode

    from edgesdk.telemetry._span_proto import export_request_bytes, grpc_span_exporter_class

    memory = InMemorySpanExporter()
    tracers = []
    for name in ("a", "b"):
        provider = TracerProvider(resource=Resource.create({"service.name": name, "n": 3, "f": 0.5}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracers += [provider.get_tracer("scope-1", "1.2"), provider.get_tracer("scope-2", schema_url="https://x/1.0")]
    shapes = [
        {"a": "1", "b": ("x", "y"), "c": "héllo\n\"q\"", "d": (), "e": 2**62, "f": float("inf")},
        {"a": 1, "b": (1, 2), "c": True, "d": ("",), "e": -5, "f": 1.0, "g": b"\x00\xff"},
        {"a": True, "b": (True,), "c": 1.0, "d": (1.5, 2.5), "e": "2", "f": float("nan"), "g": 2**63 - 1},
        {"a": 1.0, "b": ("x", "y"), "c": 1, "d": "", "e": 0, "f": False, "g": -(2**63), "long": "x" * 300},
    ]
    for i in range(3):  # later passes are served from the caches
        for j, attrs in enumerate(shapes):
            tracer = tracers[(i + j) % len(tracers)]
            with tracer.start_as_current_span("parent", kind=SpanKind.SERVER):
                span = tracer.start_span("" if j == 3 else f"s{j}", attributes=attrs, kind=SpanKind(j % 5))
                if j == 1:
                    span.set_status(Status(StatusCode.ERROR, "boom"))
                if j == 2:
                    span.add_event("e", {"k": 1})  # rare shape: the SDK's own encoder, spliced in
                span.end()
    spans = memory.get_finished_spans()
    reference = encode_spans(spans)
    mine = ExportTraceServiceRequest.FromString(export_request_bytes(spans))
    assert mine == reference
    assert mine.SerializeToString(deterministic=True) == reference.SerializeToString(deterministic=True)
    for span in spans:
        one = ExportTraceServiceRequest.FromString(export_request_bytes([span]))
        assert one.SerializeToString(deterministic=True) == encode_spans([span]).SerializeToString(deterministic=True)
    exporter = grpc_span_exporter_class()(endpoint="http://127.0.0.1:9", insecure=True)
    assert exporter._translate_data(spans) == reference
