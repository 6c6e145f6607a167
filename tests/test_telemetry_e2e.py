# SPDX-License-Identifier: Apache-2.0
"""Telemetry on real inference: the MiniLM ONNX bundle through edgesdk.load, and the CLI end to end
(``edgesdk run --trace-file`` then ``edgesdk check traces`` on what it wrote)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from test_telemetry import _NO_SDK  # tests/ is on sys.path (rootdir conftest)

import edgesdk
from edgesdk import telemetry
from edgesdk.tracecheck import check_trace_file

pytestmark = pytest.mark.slow  # real models: a bundle build (shared fixture) and llama.cpp decoding


@pytest.fixture
def memory(clean_env):
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    telemetry.configure(span_exporter=spans, metric_reader=reader)
    yield spans, reader
    telemetry.shutdown()


def test_onnx_encoder_embed_is_traced_with_real_token_counts(memory, minilm_orin_bundle):
    from tokenizers import Tokenizer

    spans, reader = memory
    session = edgesdk.load(minilm_orin_bundle)
    texts = ["The quick brown fox jumps over the lazy dog.", "SECRET sentence that must not be exported"]
    embeddings = session.embed(texts)
    assert telemetry.force_flush()
    inference = [s for s in spans.get_finished_spans() if s.attributes.get("gen_ai.operation.name")]
    (span,) = inference
    attrs = dict(span.attributes)
    assert span.name == f"embeddings {attrs['gen_ai.request.model']}"
    assert span.kind is SpanKind.INTERNAL
    assert attrs["gen_ai.provider.name"] == "onnxruntime"
    # exact count from the bundle's own tokenizer, computed independently of the session
    tokenizer = Tokenizer.from_file(str(minilm_orin_bundle / "tokenizer.json"))
    tokenizer.no_padding()  # the file pads to a fixed length; padding is not input
    assert attrs["gen_ai.usage.input_tokens"] == sum(len(tokenizer.encode(t).ids) for t in texts)
    for key in ("edgesdk.backend", "edgesdk.precision", "edgesdk.bundle.id", "edgesdk.device.profile"):
        assert attrs.get(key), key
    assert embeddings.shape[0] == 2 and np.isfinite(embeddings).all()
    assert attrs["gen_ai.embeddings.dimension.count"] == embeddings.shape[1] == 384
    assert not any("SECRET" in str(v) for s in spans.get_finished_spans() for v in s.attributes.values())
    # the GPU execution providers this CPU machine lacks were recorded as fallbacks, not lost
    fallback_events = [e for s in spans.get_finished_spans() for e in s.events if e.name == "edgesdk.fallback"]
    assert len(fallback_events) == len(session.report()["fallbacks"])
    data = reader.get_metrics_data()
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"gen_ai.client.operation.duration", "gen_ai.client.token.usage"} <= names


def test_cli_run_trace_file_passes_check_traces(run_cli, minilm_orin_bundle, tmp_path):
    trace_file = tmp_path / "run.jsonl"
    res = run_cli("run", minilm_orin_bundle, "--input", "hello world", "--json", "--trace-file", trace_file)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(line) for line in trace_file.read_text().splitlines()]
    assert any("resourceSpans" in doc for doc in lines) and any("resourceMetrics" in doc for doc in lines)
    report = check_trace_file(trace_file)
    assert report.genai_spans == 1
    assert report.count("violation") == 0, report.findings
    assert not [f for f in report.findings if f.rule == "edgesdk_convention"], report.findings
    checked = run_cli("check", "traces", trace_file, "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["conforming"] is True


def test_env_configured_otlp_file_from_cli(run_cli, minilm_orin_bundle, tmp_path):
    trace_file = tmp_path / "env.jsonl"
    res = run_cli("run", minilm_orin_bundle, "--input", "hi", "--json", env={"EDGESDK_TRACE_FILE": str(trace_file)})
    assert res.returncode == 0, res.stderr
    assert "embeddings" in trace_file.read_text()


# --------------------------------------------------------------------------- GGUF LLM (llama.cpp)
# The backend is built straight on the registry GGUF (a full `edgesdk build` of it takes ~75 s here,
# mostly its perplexity verification): real llama.cpp decoding, real tokenizer counts.


@pytest.fixture(scope="module")
def gemma_backend(gemma_gguf):
    pytest.importorskip("llama_cpp")
    from edgesdk.runtime.backends.llamacpp import LlamaCppBackend, make_engine
    from edgesdk.runtime.batching import Weights

    weights = Weights(gemma_gguf)
    settings = {"n_gpu_layers": 0, "flash_attn": False, "n_ctx": 256, "threads": 2, "n_batch": 256, "n_ubatch": 256}
    backend = LlamaCppBackend(
        make_engine(weights, settings, {}, slots=1),
        weights,
        settings=settings,
        report={},
        model="gemma-3-270m",
        attributes={"edgesdk.backend": "llama.cpp", "edgesdk.precision": "q4_k_m"},
    )
    yield backend
    backend.close()


def test_gguf_generate_span_has_exact_tokens_and_timing(memory, gemma_backend):
    spans, reader = memory
    prompt = "The capital of France is"
    text = gemma_backend.generate(prompt, max_tokens=8, seed=1, temperature=0.0)
    assert telemetry.force_flush()
    (span,) = spans.get_finished_spans()
    attrs = dict(span.attributes)
    last = gemma_backend.last
    assert span.name == "text_completion gemma-3-270m"
    assert attrs["gen_ai.provider.name"] == "llama.cpp" and attrs["gen_ai.request.max_tokens"] == 8
    assert attrs["gen_ai.usage.input_tokens"] == len(gemma_backend.tokenize(prompt)) == last["input_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == last["output_tokens"] > 0
    assert attrs["gen_ai.response.finish_reasons"] == (last["finish_reason"],)
    duration = (span.end_time - span.start_time) / 1e9
    assert 0 < attrs["gen_ai.response.time_to_first_chunk"] < duration
    assert not any(text.strip() and text.strip() in str(v) for v in attrs.values())  # no content by default
    points = {
        m.name: m.data.data_points
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    # Client chunk metrics are for streaming calls only (semconv: SHOULD NOT be reported otherwise).
    assert "gen_ai.client.operation.time_per_output_chunk" not in points
    assert "gen_ai.client.operation.time_to_first_chunk" not in points
    (tpot,) = points["gen_ai.server.time_per_output_token"]
    assert tpot.count == 1 and 0 < tpot.sum < duration


def test_gguf_stream_records_one_chunk_metric_per_token(memory, gemma_backend):
    _, reader = memory
    pieces = list(gemma_backend.stream("The capital of France is", max_tokens=8, seed=1, temperature=0.0))
    assert telemetry.force_flush()
    points = {
        m.name: m.data.data_points
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    (per_chunk,) = points["gen_ai.client.operation.time_per_output_chunk"]
    (first,) = points["gen_ai.client.operation.time_to_first_chunk"]
    assert first.count == 1 and per_chunk.count >= gemma_backend.last["output_tokens"] - 1 >= len(pieces) - 2


def test_gguf_stream_stopped_early_is_cancelled_not_failed(memory, gemma_backend):
    spans, _ = memory
    stream = gemma_backend.stream("Count: one, two,", max_tokens=32, seed=1)
    first = next(stream)
    assert isinstance(first, str)
    stream.close()
    assert telemetry.force_flush()
    (span,) = spans.get_finished_spans()
    assert span.attributes["gen_ai.request.stream"] is True
    assert span.attributes["gen_ai.response.finish_reasons"] == ("cancelled",)
    assert "error.type" not in span.attributes


def test_gguf_content_capture_opt_in_records_the_real_output(monkeypatch, gemma_backend, tmp_path):
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    telemetry.shutdown()
    trace_file = tmp_path / "gguf.jsonl"
    monkeypatch.setenv("EDGESDK_CAPTURE_CONTENT", "1")
    telemetry.configure(trace_file=trace_file)
    try:
        text = gemma_backend.generate("Paris is the capital of", max_tokens=6, seed=2, temperature=0.0)
    finally:
        telemetry.shutdown()
    span = next(
        s
        for line in trace_file.read_text().splitlines()
        for rs in json.loads(line).get("resourceSpans", [])
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    )
    attrs = {a["key"]: a["value"] for a in span["attributes"]}
    output = json.loads(attrs["gen_ai.output.messages"]["stringValue"])
    assert output[0]["parts"][0]["content"] == text
    assert attrs["edgesdk.capture_content"] == {"boolValue": True}
    report = check_trace_file(trace_file)
    assert report.count("violation") == 0, report.findings
    assert any(f.rule == "content_captured" for f in report.findings)


def test_gguf_chat_capture_records_messages_with_roles(monkeypatch, gemma_backend):
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    telemetry.shutdown()
    spans = InMemorySpanExporter()
    telemetry.configure(span_exporter=spans, capture_content=True)
    try:
        messages = [{"role": "user", "content": "Name one colour."}]
        # This GGUF ships no chat template, so chat() refuses it; drive the same path chat() takes with
        # a hand-formatted prompt and the messages it captures.
        reply = "".join(
            gemma_backend._run(
                "User: Name one colour.\nAssistant:",
                "chat",
                stream=False,
                special=False,
                capture=messages,
                options={"max_tokens": 6, "seed": 3, "temperature": 0.0},
            )
        )
        assert telemetry.force_flush()
        (span,) = spans.get_finished_spans()
    finally:
        telemetry.shutdown()
    assert span.name == "chat gemma-3-270m"
    captured = json.loads(span.attributes["gen_ai.input.messages"])
    assert captured == [{"role": "user", "parts": [{"type": "text", "content": "Name one colour."}]}]
    assert json.loads(span.attributes["gen_ai.output.messages"])[0]["parts"][0]["content"] == reply


def test_gguf_stream_trace_file_passes_check_traces(clean_env, gemma_backend, tmp_path):
    """A streamed request's span is built on the finishing thread: it must still check clean, with
    its time to first chunk inside its own duration and the request's token counts."""
    trace_file = tmp_path / "stream.jsonl"
    telemetry.configure(trace_file=trace_file)
    try:
        pieces = list(gemma_backend.stream("The capital of France is", max_tokens=8, seed=1, temperature=0.0))
    finally:
        telemetry.shutdown()
    assert pieces
    report = check_trace_file(trace_file)
    assert report.genai_spans == 1
    assert report.count("violation") == 0, report.findings
    spans = [
        span
        for line in trace_file.read_text().splitlines()
        for rs in json.loads(line).get("resourceSpans", [])
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    (span,) = spans
    attrs = {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}
    duration_s = (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e9
    assert attrs["gen_ai.request.stream"] is True
    assert 0 < attrs["gen_ai.response.time_to_first_chunk"] <= duration_s
    assert int(attrs["gen_ai.usage.output_tokens"]) == gemma_backend.last["output_tokens"]


def test_base_install_runs_a_session_and_configure_fails_clearly(clean_env, tmp_path, minilm_orin_bundle):
    script = (
        _NO_SDK
        + f"""
import numpy as np
from edgesdk import telemetry
from edgesdk.errors import MissingExtraError
from edgesdk import load
session = load({str(minilm_orin_bundle)!r})
out = session.embed(["hello edge"])
assert np.asarray(out).shape[0] == 1
with telemetry.inference("chat", "m", "llama.cpp", stream=True) as rec:
    rec.chunk()
try:
    telemetry.configure(trace_file={str(tmp_path / "t.jsonl")!r})
except MissingExtraError as exc:
    print("ERROR", exc.one_line())
print(sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.semconv"))))
"""
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-2].startswith("ERROR exporting telemetry (--trace-file, OTEL_EXPORTER_OTLP_*) needs the otel extra")
    assert "pip install 'edgesdk[otel]'" in lines[-2]
    assert lines[-1] == "[]"
