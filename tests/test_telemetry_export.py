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
    names = {
        m.name for req in receiver.metrics for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    assert {
        "gen_ai.client.operation.duration",
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.time_per_output_chunk",
    } <= names


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
                reply = (
                    b""
                    if receiver.status != 200
                    else (
                        metrics_service_pb2.ExportMetricsServiceResponse()
                        if "metrics" in self.path
                        else trace_service_pb2.ExportTraceServiceResponse()
                    ).SerializeToString()
                )
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


def test_otlp_http_receiver_gets_what_the_sdk_encoder_builds(clean_env, http_receiver):
    """The stock OTLP/HTTP exporter, as configured by edgesdk, posts exactly encode_spans(...) of the
    spans the SDK finished (the same spans reach a caller's in-memory exporter)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    receiver, base = http_receiver
    memory = InMemorySpanExporter()
    telemetry.configure(otlp_endpoint=base, otlp_protocol="http/protobuf", span_exporter=memory)
    assert telemetry.stats()["exporters"][0] == f"otlp-http/protobuf:{base}"
    for _ in range(3):
        _one_request()
    telemetry.shutdown()
    posted = [
        span
        for request in receiver.traces()
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    reference = [
        span
        for rs in encode_spans(memory.get_finished_spans()).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    assert len(posted) == 3 and sorted(posted, key=lambda s: s.span_id) == sorted(reference, key=lambda s: s.span_id)
    assert telemetry.stats()["spans_exported"] == 6  # both exporters, counted


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


def _reference_otlp_json(spans) -> list[dict]:
    """OTLP/JSON of SDK spans written out here, independently of edgesdk: the SDK exporter's encoder,
    protobuf's JSON mapping, then OTLP/JSON's hex ids (the OTLP spec's one change to that mapping)."""
    import base64

    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    out = []
    for rs in MessageToDict(encode_spans(spans), use_integers_for_enums=True)["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
                out.append(span)
    return sorted(out, key=lambda span: span["spanId"])


def test_trace_file_lines_are_the_exporter_encoding_in_otlp_json(clean_env, tmp_path):
    """The JSON-lines file holds exactly the OTLP/JSON of the SDK's spans: the exporter package's
    public encoder and protobuf's json_format, ids in hex, enums as integers, 64-bit ints as strings."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    path = tmp_path / "t.jsonl"
    memory = InMemorySpanExporter()
    telemetry.configure(trace_file=path, span_exporter=memory, capture_content=True)
    with telemetry.inference(
        "chat",
        "gemma",
        "llama.cpp",
        stream=True,
        request={"max_tokens": 8, "temperature": 0.5, "stop_sequences": ["\n", "END"]},
        attributes={"edgesdk.bundle.id": "", "edgesdk.flag": False},
    ) as rec:
        rec.set_input_tokens(3)
        rec.chunk()
        rec.capture_input("héllo")
        rec.add_event("edgesdk.fallback", {"edgesdk.fallback.latency_ratio": float("nan")})
        rec.finish(["stop"])
    with pytest.raises(KeyError):
        with telemetry.build_trace("m", "orin"):
            with telemetry.build_stage("export"):
                raise KeyError("x")
    telemetry.shutdown()
    spans = memory.get_finished_spans()
    assert len(spans) == 3
    docs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    written = sorted(
        (
            span
            for doc in docs
            for rs in doc.get("resourceSpans", [])
            for ss in rs["scopeSpans"]
            for span in ss["spans"]
        ),
        key=lambda span: span["spanId"],
    )
    assert written == _reference_otlp_json(spans)
    chat = next(span for span in written if span["name"] == "chat gemma")
    attrs = {a["key"]: a["value"] for a in chat["attributes"]}
    assert len(chat["traceId"]) == 32 and int(chat["traceId"], 16) and chat["kind"] == 1
    assert attrs["gen_ai.usage.input_tokens"] == {"intValue": "3"}
    assert attrs["gen_ai.request.stop_sequences"] == {
        "arrayValue": {"values": [{"stringValue": "\n"}, {"stringValue": "END"}]}
    }
    assert chat["events"][0]["attributes"][0]["value"] == {"doubleValue": "NaN"}
    assert "héllo" in json.dumps(attrs["gen_ai.input.messages"], ensure_ascii=False)
    assert any("resourceMetrics" in doc for doc in docs)
