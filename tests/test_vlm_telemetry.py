# SPDX-License-Identifier: Apache-2.0
"""Inference-stage child spans (preprocess, encode, prefill, decode) under a VLM request's GenAI span,
written by the real file exporter and checked by ``edgesdk check traces``; broken stage spans are
flagged. The VLM is the random-weight tiny LLaVA of tests/vlm_fixtures.py (a real build)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from edgesdk import telemetry
from edgesdk.tracecheck import check_trace_file

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
T0 = 1_764_662_400_000_000_000


# ------------------------------------------------------------------ the API, without a model


@pytest.fixture
def memory(clean_env):
    spans = InMemorySpanExporter()
    telemetry.configure(span_exporter=spans)
    yield spans
    telemetry.shutdown()


def test_stage_is_an_internal_child_of_the_request_span_also_for_streams(memory):
    with telemetry.inference("chat", "m", "llama.cpp", stream=True) as rec:  # a stream's span is never current
        with rec.stage("prefill", {"edgesdk.inference.stage.tokens": 7}):
            pass
        stage = rec.stage("decode")
        stage.end()
        stage.end()  # idempotent
    with pytest.raises(ValueError, match="unknown inference stage"):
        rec.stage("tokenize")
    assert telemetry.force_flush()
    spans = {s.name: s for s in memory.get_finished_spans()}
    request = spans["chat m"]
    for name in ("prefill", "decode"):
        child = spans[name]
        assert child.parent.span_id == request.context.span_id and child.context.trace_id == request.context.trace_id
        assert child.kind.name == "INTERNAL" and child.attributes["edgesdk.inference.stage"] == name
        assert not any(k.startswith("gen_ai.") for k in child.attributes)
        assert request.start_time <= child.start_time <= child.end_time <= request.end_time
    assert spans["prefill"].attributes["edgesdk.inference.stage.tokens"] == 7
    assert len(memory.get_finished_spans()) == 3  # the second end() made no span


def test_a_failed_stage_has_error_status_and_type(memory):
    with pytest.raises(RuntimeError):
        with telemetry.inference("chat", "m", "llama.cpp") as rec, rec.stage("encode"):
            raise RuntimeError("boom")
    assert telemetry.force_flush()
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert spans["encode"].status.status_code.name == "ERROR"
    assert spans["encode"].attributes["error.type"] == "RuntimeError"


def test_stage_is_a_shared_noop_when_telemetry_is_off(clean_env):
    clean_env.setenv("OTEL_SDK_DISABLED", "true")
    telemetry.configure()
    try:
        rec = telemetry.inference("chat", "m", "llama.cpp")
        assert rec is telemetry.NOOP_RECORDER
        with rec as r:
            assert r.stage("decode") is telemetry.NOOP_STAGE
            with r.stage("prefill") as s:
                s.set_attribute("x", 1)
    finally:
        telemetry.shutdown()


def test_stage_names_are_the_checker_rules():
    from edgesdk.tracecheck.checker import load_rules

    assert tuple(load_rules()["edgesdk_inference_stage"]["stages"]) == telemetry.INFERENCE_STAGES


# ------------------------------------------------------------------ the checker on broken stage spans


def _attr(key, value):
    kind = "intValue" if isinstance(value, int) else "stringValue"
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def _span(name, span_id, attrs, *, parent="", start=T0, end=T0 + 10**9, kind=1):
    return {
        "traceId": TRACE,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [_attr(k, v) for k, v in attrs.items()],
        "status": {"code": 0},
    }


REQUEST = _span(
    "chat tiny",
    "00f067aa0ba90200",
    {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "llama.cpp",
        "gen_ai.request.model": "tiny",
        "gen_ai.usage.input_tokens": 30,
        "gen_ai.usage.output_tokens": 4,
    },
)


def _stage(name, span_id, *, parent="00f067aa0ba90200", start=T0 + 1000, end=T0 + 2000, stage=None, **extra):
    return _span(
        name, span_id, {"edgesdk.inference.stage": stage or name, **extra}, parent=parent, start=start, end=end
    )


def _check(tmp_path, spans):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]}))
    return check_trace_file(path)


def test_well_formed_stage_children_are_clean(tmp_path):
    stages = [
        _stage(n, f"00f067aa0ba9020{i}", start=T0 + i * 1000, end=T0 + i * 1000 + 500)
        for i, n in enumerate(telemetry.INFERENCE_STAGES, 1)
    ]
    report = _check(tmp_path, [*stages, REQUEST])  # children first, as an SDK exports them
    assert report.stage_spans == 4 and report.genai_spans == 1
    assert not [f for f in report.findings if f.rule == "inference_stage"], report.findings
    assert report.count("violation") == 0, report.findings


@pytest.mark.parametrize(
    "span, message",
    [
        (_stage("prefill", "00f067aa0ba90211", parent="00f067aa0ba999ff"), "is not in trace"),
        (_stage("prefill", "00f067aa0ba90212", parent=""), "has no parent"),
        (_stage("tokenize", "00f067aa0ba90213"), "not a known stage"),
        (_stage("decode", "00f067aa0ba90214", stage="prefill"), "named after its stage"),
        (_stage("decode", "00f067aa0ba90215", start=T0 + 5000, end=T0 + 4000), "ends before it starts"),
        (_stage("decode", "00f067aa0ba90216", end=T0 + 2 * 10**9), "outside its request's span"),
        (_stage("decode", "00f067aa0ba90217", **{"gen_ai.usage.output_tokens": 3}), "not GenAI operations"),
        (_stage("decode", "00f067aa0ba90218", **{"edgesdk.inference.stage.tokens": -1}), "is negative"),
    ],
)
def test_broken_stage_spans_are_violations(tmp_path, span, message):
    report = _check(tmp_path, [span, REQUEST])
    found = [f for f in report.findings if f.rule == "inference_stage"]
    assert report.fails() and found and found[0].level == "violation"
    assert any(message in f.message for f in found), found


def test_a_stage_under_a_non_genai_parent_is_a_violation(tmp_path):
    other = _span("http work", "00f067aa0ba90300", {"http.request.method": "GET"})
    report = _check(tmp_path, [_stage("decode", "00f067aa0ba90301", parent="00f067aa0ba90300"), other, REQUEST])
    assert any("must be a GenAI span, found 'http work'" in f.message for f in report.findings)


# ------------------------------------------------------------------ a real VLM request


@pytest.fixture(scope="module")
def vlm_bundle(vlm_q8_bundle):
    """tests/conftest.py's tiny LLaVA Q8_0 build, once per session (read-only: copy it before changing it)."""
    return vlm_q8_bundle


def _spans(trace_file: Path) -> list[dict]:
    return [
        s
        for line in trace_file.read_text().splitlines()
        for rs in json.loads(line).get("resourceSpans", [])
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]


def _attrs(span: dict) -> dict:
    return {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}


@pytest.mark.slow
def test_vlm_request_has_four_stage_children_and_checks_clean(clean_env, vlm_bundle, tmp_path, run_cli):
    from vlm_fixtures import make_test_images

    import edgesdk

    image = make_test_images(tmp_path / "images")[2]
    trace_file = tmp_path / "vlm.jsonl"
    telemetry.configure(trace_file=trace_file)
    session = edgesdk.load(vlm_bundle)
    try:
        session.generate("What is on the table?", images=[image], max_tokens=4, temperature=0)
        first = dict(session.backend.last)
        streamed = "".join(session.backend.stream("And its colour?", images=[image], max_tokens=4, temperature=0))
        assert isinstance(streamed, str)
    finally:
        session.close()
        telemetry.shutdown()
    spans = _spans(trace_file)
    requests = [s for s in spans if "gen_ai.operation.name" in _attrs(s)]
    assert len(requests) == 2
    one, two = sorted(requests, key=lambda s: int(s["startTimeUnixNano"]))

    def children(parent):
        return {
            s["name"]: s
            for s in spans
            if s.get("parentSpanId") == parent["spanId"] and s["traceId"] == parent["traceId"]
        }

    kids = children(one)
    assert set(kids) == {"preprocess", "encode", "prefill", "decode"}
    for name, kid in kids.items():
        assert _attrs(kid)["edgesdk.inference.stage"] == name and kid["kind"] in (1, "SPAN_KIND_INTERNAL")
        assert (
            int(one["startTimeUnixNano"])
            <= int(kid["startTimeUnixNano"])
            <= int(kid["endTimeUnixNano"])
            <= int(one["endTimeUnixNano"])
        )
    order = sorted(kids, key=lambda n: int(kids[n]["startTimeUnixNano"]))
    assert order == ["preprocess", "encode", "prefill", "decode"]
    req = _attrs(one)
    assert int(req["edgesdk.vlm.image_tokens"]) == first["image_tokens"] == 16
    assert int(req["gen_ai.usage.input_tokens"]) == first["input_tokens"] > 16  # image tokens included
    assert int(_attrs(kids["encode"])["edgesdk.inference.stage.tokens"]) == 16
    assert int(_attrs(kids["decode"])["edgesdk.inference.stage.tokens"]) == first["output_tokens"]
    # question 2 (a stream) about the same image: the encoder does not run, an event says the image was cached
    kids2 = children(two)
    assert set(kids2) == {"preprocess", "prefill", "decode"}
    events = [e["name"] for e in two.get("events", [])]
    assert events == ["edgesdk.vlm.image_cached"]
    report = check_trace_file(trace_file)
    assert report.stage_spans == 7 and report.genai_spans == 2
    assert report.count("violation") == 0, report.findings
    checked = run_cli("check", "traces", trace_file)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "7 inference-stage" in checked.stdout
