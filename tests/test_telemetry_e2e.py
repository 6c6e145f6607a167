# SPDX-License-Identifier: Apache-2.0
"""Telemetry on real inference: the MiniLM ONNX bundle through edgesdk.load, and the CLI end to end
(``edgesdk run --trace-file`` then ``edgesdk check traces`` on what it wrote)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import edgesdk
from edgesdk import telemetry
from edgesdk.compliance.traces import check_trace_file


@pytest.fixture
def memory(monkeypatch):
    for key in list(os.environ):
        if key.startswith("OTEL_") or key in ("EDGESDK_TRACE_FILE", "EDGESDK_CAPTURE_CONTENT"):
            monkeypatch.delenv(key)
    telemetry.shutdown()
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
    checked = run_cli("check", "traces", trace_file, "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["conforming"] is True


def test_env_configured_otlp_file_from_cli(run_cli, minilm_orin_bundle, tmp_path):
    trace_file = tmp_path / "env.jsonl"
    res = run_cli("run", minilm_orin_bundle, "--input", "hi", "--json", env={"EDGESDK_TRACE_FILE": str(trace_file)})
    assert res.returncode == 0, res.stderr
    assert "embeddings" in trace_file.read_text()
