# SPDX-License-Identifier: Apache-2.0
"""``edgesdk check traces``: conforming files pass, each kind of violation is found, bad files exit 1.

Conforming input comes from our real exporter (edgesdk.telemetry writing OTLP/JSON lines) and from
a hand-written file in another instrumentation's shape; violations from files shaped like
OpenLLMetry's and vLLM's output and from small documents built here, one rule each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk import telemetry
from edgesdk.commands.check_traces import traces_command
from edgesdk.tracecheck import check_trace_file
from edgesdk.tracecheck.otlp_json import TraceFileError, read_otlp_json

DATA = Path(__file__).parent / "data" / "traces"


def _value(value):
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": value}


def _span(
    name,
    attrs,
    *,
    kind=1,
    status=0,
    span_id="00f067aa0ba902b7",
    parent="",
    events=(),
    start=1_764_662_400_000_000_000,
    duration_s=0.5,
):
    return {
        "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + int(duration_s * 1e9)),
        "attributes": [{"key": k, "value": _value(v)} for k, v in attrs.items()],
        "events": [
            {"name": n, "attributes": [{"key": k, "value": _value(v)} for k, v in a.items()]} for n, a in events
        ],
        "status": {"code": status},
    }


def _write(tmp_path, spans=(), metrics=(), resource=None) -> Path:
    doc = {}
    if spans:
        doc["resourceSpans"] = [
            {
                "resource": {"attributes": [{"key": k, "value": _value(v)} for k, v in (resource or {}).items()]},
                "scopeSpans": [{"scope": {"name": "t"}, "spans": list(spans)}],
            }
        ]
    if metrics:
        doc["resourceMetrics"] = [{"scopeMetrics": [{"scope": {"name": "t"}, "metrics": list(metrics)}]}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return path


GOOD = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "llama.cpp",
    "gen_ai.request.model": "gemma",
    "gen_ai.usage.input_tokens": 5,
    "gen_ai.usage.output_tokens": 3,
    "gen_ai.response.finish_reasons": ["stop"],
}


def _rules(report, level="violation") -> set[tuple[str, str]]:
    return {(f.rule, f.attribute) for f in report.findings if f.level == level}


def test_our_own_exported_file_conforms(clean_env, tmp_path):
    path = tmp_path / "ours.jsonl"
    telemetry.configure(trace_file=path)
    with telemetry.build_trace("all-MiniLM-L6-v2", "orin"):
        for stage in ("export", "verify", "package"):
            with telemetry.build_stage(stage):
                pass
        telemetry.fallback_event("tensorrt", "onnxruntime", "TensorRT not installed")
    ours = {
        "edgesdk.device.profile": "orin",
        "edgesdk.backend": "llama.cpp",
        "edgesdk.precision": "q4_k_m",
        "edgesdk.bundle.id": "abc",
    }
    with telemetry.inference(
        "chat", "gemma-3-270m", "llama.cpp", stream=True, request={"max_tokens": 8}, attributes=ours
    ) as rec:
        rec.set_input_tokens(5)
        for _ in range(4):
            rec.chunk()
        rec.set_output_tokens(4)
        rec.finish(["stop"])
    with pytest.raises(ValueError):
        with telemetry.inference("embeddings", "all-MiniLM-L6-v2", "onnxruntime", attributes=ours) as rec:
            rec.set_input_tokens(7)
            raise ValueError("bad shape")
    telemetry.shutdown()
    report = check_trace_file(path)
    assert report.genai_spans == 2 and report.build_spans == 4 and report.metrics >= 5
    assert report.count("violation") == 0, [f for f in report.findings if f.level == "violation"]
    assert report.count("improvement") == 0, report.findings


def test_edgesdk_spans_missing_where_they_ran_is_an_improvement(clean_env, tmp_path):
    path = tmp_path / "bare.jsonl"
    telemetry.configure(trace_file=path)
    with telemetry.inference("chat", "m", "llama.cpp", attributes={"edgesdk.backend": "llama.cpp"}):
        pass
    telemetry.shutdown()
    report = check_trace_file(path)
    assert report.count("violation") == 0
    assert {
        ("edgesdk_convention", "edgesdk.device.profile"),
        ("edgesdk_convention", "edgesdk.precision"),
        ("edgesdk_convention", "edgesdk.bundle.id"),
    } == {(f.rule, f.attribute) for f in report.findings if f.rule == "edgesdk_convention"}


def test_other_tool_conforming_document_passes():
    report = check_trace_file(DATA / "conforming_client_chat.json")
    assert report.genai_spans == 1 and report.findings == []


def test_openllmetry_shaped_file_deprecated_names_and_unconsented_content():
    violations = _rules(check_trace_file(DATA / "openllmetry_style.json"))
    assert {
        ("deprecated", "gen_ai.system"),
        ("deprecated", "gen_ai.usage.prompt_tokens"),
        ("deprecated", "gen_ai.usage.completion_tokens"),
        ("deprecated", "gen_ai.prompt.0.content"),
        ("content_without_opt_in", "gen_ai.prompt.0.content"),
        ("content_without_opt_in", "gen_ai.completion.0.content"),
        ("missing_attribute", "gen_ai.operation.name"),
        ("missing_attribute", "gen_ai.provider.name"),
    } <= violations


def test_vllm_shaped_snake_case_file_is_read_and_checked():
    report = check_trace_file(DATA / "vllm_style_snake.json")
    assert report.spans == 1
    assert {("span_kind_unexpected", ""), ("deprecated", "gen_ai.usage.prompt_tokens")} <= _rules(report)
    improvements = _rules(report, "improvement")
    assert ("type_mismatch", "gen_ai.request.temperature") in improvements  # int where double is defined
    assert ("not_in_registry", "gen_ai.latency.time_to_first_token") in improvements


@pytest.mark.parametrize(
    ("name", "attrs", "kwargs", "expected"),
    [
        ("chat gemma", {**GOOD, "gen_ai.usage.input_tokens": "5"}, {}, ("type_mismatch", "gen_ai.usage.input_tokens")),
        ("chat gemma", {**GOOD, "gen_ai.request.stream": "yes"}, {}, ("type_mismatch", "gen_ai.request.stream")),
        (
            "summarize gemma",
            {**GOOD, "gen_ai.operation.name": "summarize"},
            {},
            ("undefined_enum_variant", "gen_ai.operation.name"),
        ),
        ("gemma chat", GOOD, {}, ("span_name_format", "")),
        ("chat gemma", GOOD, {"kind": 2}, ("span_kind_unexpected", "")),
        (
            "chat gemma",
            {k: v for k, v in GOOD.items() if k != "gen_ai.provider.name"},
            {},
            ("missing_attribute", "gen_ai.provider.name"),
        ),
        (
            "chat gemma",
            {k: v for k, v in GOOD.items() if k != "gen_ai.request.model"},
            {},
            ("missing_attribute", "gen_ai.request.model"),
        ),
        ("chat gemma", GOOD, {"status": 2}, ("missing_attribute", "error.type")),
        ("chat gemma", {**GOOD, "server.address": "10.0.0.2"}, {}, ("missing_attribute", "server.port")),
        (
            "chat gemma",
            {**GOOD, "gen_ai.usage.output_tokens": -3},
            {},
            ("token_count_negative", "gen_ai.usage.output_tokens"),
        ),
        (
            "chat gemma",
            {**GOOD, "gen_ai.request.max_tokens": 2},
            {},
            ("token_count_inconsistent", "gen_ai.usage.output_tokens"),
        ),
        (
            "chat gemma",
            {**GOOD, "gen_ai.usage.reasoning.output_tokens": 9},
            {},
            ("token_count_inconsistent", "gen_ai.usage.reasoning.output_tokens"),
        ),
        (
            "chat gemma",
            {**GOOD, "gen_ai.response.time_to_first_chunk": 3.0},
            {"duration_s": 0.5},
            ("value_inconsistent", "gen_ai.response.time_to_first_chunk"),
        ),
        (
            "chat gemma",
            {**GOOD, "gen_ai.input.messages": '[{"role":"user"}]'},
            {},
            ("content_without_opt_in", "gen_ai.input.messages"),
        ),
        (
            "chat gemma",
            GOOD,
            {"events": [("gen_ai.user.message", {"content": "hi"})]},
            ("deprecated", "gen_ai.user.message"),
        ),
        ("chat gemma", {**GOOD, "gen_ai.system": "llama.cpp"}, {}, ("deprecated", "gen_ai.system")),
    ],
)
def test_each_violation_kind_is_found(tmp_path, name, attrs, kwargs, expected):
    report = check_trace_file(_write(tmp_path, [_span(name, attrs, **kwargs)]))
    assert expected in _rules(report), report.findings
    clean = check_trace_file(_write(tmp_path, [_span("chat gemma", GOOD)]))
    assert clean.count("violation") == 0  # the same span without the defect passes


def test_content_with_opt_in_marker_is_information_only(tmp_path):
    attrs = {**GOOD, "gen_ai.output.messages": "[]", "edgesdk.capture_content": True}
    report = check_trace_file(_write(tmp_path, [_span("chat gemma", attrs)]))
    assert report.count("violation") == 0
    assert ("content_captured", "gen_ai.output.messages") in _rules(report, "information")


def test_build_span_conventions(tmp_path):
    root = _span(
        "edgesdk.build",
        {"edgesdk.build.model": "m", "edgesdk.device.profile": "orin", "edgesdk.build.outcome": "error"},
        span_id="1111111111111111",
    )
    orphan = _span(
        "edgesdk.build.export",
        {"edgesdk.build.stage": "export", "edgesdk.build.stage.outcome": "ok"},
        span_id="2222222222222222",
    )
    failed = _span(
        "edgesdk.build.verify",
        {"edgesdk.build.stage": "verify", "edgesdk.build.stage.outcome": "error"},
        span_id="3333333333333333",
        parent="1111111111111111",
    )
    odd = _span(
        "edgesdk.build.package",
        {"edgesdk.build.stage": "package", "edgesdk.build.stage.outcome": "maybe"},
        span_id="4444444444444444",
        parent="1111111111111111",
        events=[("edgesdk.fallback", {"edgesdk.fallback.from": "tensorrt"})],
    )
    violations = _rules(check_trace_file(_write(tmp_path, [root, orphan, failed, odd])))
    assert ("build_convention", "") in violations  # stage without the build span as parent
    assert ("missing_attribute", "error.type") in violations
    assert ("build_convention", "edgesdk.build.stage.outcome") in violations
    assert ("build_convention", "edgesdk.fallback.reason") in violations


def _histogram(name, unit, attrs, bounds):
    return {
        "name": name,
        "unit": unit,
        "histogram": {
            "dataPoints": [
                {
                    "attributes": [{"key": k, "value": _value(v)} for k, v in attrs.items()],
                    "count": "1",
                    "sum": 1.0,
                    "explicitBounds": bounds,
                    "bucketCounts": ["1"] * (len(bounds) + 1),
                }
            ],
            "aggregationTemporality": 2,
        },
    }


def test_metric_checks(tmp_path):
    base = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "llama.cpp"}
    metrics = [
        _histogram("gen_ai.client.operation.duration", "ms", base, [1.0, 10.0]),
        _histogram("gen_ai.client.token.usage", "{token}", {**base, "gen_ai.system": "x"}, [1.0, 4.0]),
    ]
    report = check_trace_file(_write(tmp_path, metrics=metrics))
    violations = _rules(report)
    assert ("metric_unit_mismatch", "") in violations
    assert ("missing_attribute", "gen_ai.token.type") in violations
    assert ("deprecated", "gen_ai.system") in violations
    assert ("metric_buckets_not_advised", "") in _rules(report, "improvement")


def test_json_lines_and_single_document_read_the_same(tmp_path):
    doc = json.loads((DATA / "conforming_client_chat.json").read_text())
    lines = tmp_path / "two.jsonl"
    lines.write_text(json.dumps(doc) + "\n\n" + json.dumps(doc) + "\n")
    assert len(read_otlp_json(lines).spans) == 2
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([doc, doc]))
    assert len(read_otlp_json(listed).spans) == 2


def test_gzip_and_bom_files_are_read(tmp_path):
    import gzip

    text = (DATA / "conforming_client_chat.json").read_text()
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert len(read_otlp_json(packed).spans) == 1
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert len(read_otlp_json(bom).spans) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not found"),
        ("", "empty"),
        ("{not json\n", "not JSON"),
        ('{"spans": []}', "not OTLP"),
        (b"\x1f\x8b\x08\x00garbage", "cannot read"),
        (b"\xff\xfe\x00bad", "cannot read"),
    ],
)
def test_unreadable_or_non_otlp_files_are_errors_with_exit_1(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(TraceFileError, match=message) as info:
        check_trace_file(path)
    assert info.value.exit_code == 1


def test_command_exit_codes_and_json_output():
    runner = CliRunner()
    ok = runner.invoke(traces_command, [str(DATA / "conforming_client_chat.json")], standalone_mode=False)
    assert ok.exception is None and ok.return_value == 0 and "OK:" in ok.output
    bad = runner.invoke(traces_command, [str(DATA / "openllmetry_style.json"), "--json"], standalone_mode=False)
    assert bad.return_value == 2
    report = json.loads(bad.output)
    assert report["conforming"] is False and report["summary"]["violation"] >= 8
    assert {"level", "rule", "message", "span", "attribute", "line", "count"} <= set(report["findings"][0])
    strict = runner.invoke(
        traces_command, [str(DATA / "vllm_style_snake.json"), "--fail-on", "improvement"], standalone_mode=False
    )
    assert strict.return_value == 2


def test_real_cli_exit_codes(tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "edgesdk.cli", "check", "traces", *args], capture_output=True, text=True, timeout=120
        )

    assert run(str(DATA / "conforming_client_chat.json")).returncode == 0
    assert run(str(DATA / "openllmetry_style.json")).returncode == 2
    missing = run(str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: trace file not found") and "Traceback" not in missing.stderr
    directory = run(str(tmp_path))
    assert directory.returncode == 1 and "is a directory" in directory.stderr


def _big_jsonl(path: Path, lines: int, spans_per_line: int = 20, opener=open) -> int:
    """A JSON-lines trace of ``lines`` export requests (distinct span ids); returns its size in bytes."""
    attrs = [{"key": k, "value": _value(v)} for k, v in {**GOOD, "edgesdk.padding": "x" * 400}.items()]
    size = 0
    with opener(path, "wt", encoding="utf-8") as out:
        for i in range(lines):
            spans = [
                {
                    "traceId": f"{i:032x}",
                    "spanId": f"{i * spans_per_line + j + 1:016x}",
                    "name": "chat gemma",
                    "kind": 1,
                    "startTimeUnixNano": "1",
                    "endTimeUnixNano": "2",
                    "attributes": attrs,
                }
                for j in range(spans_per_line)
            ]
            line = json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]})
            size += len(line) + 1
            out.write(line + "\n")
    return size


@pytest.mark.slow
def test_large_trace_is_checked_as_a_stream(tmp_path):
    """Memory follows one line and the per-span id index, not the file: a 200 MB trace must not need GBs."""
    import tracemalloc

    path = tmp_path / "big.jsonl"
    size = _big_jsonl(path, lines=1000)
    assert size > 20 * 1024**2
    tracemalloc.start()
    try:
        report = check_trace_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.spans == report.genai_spans == 20_000 and report.count("violation") == 0
    # Reading it whole and parsing it takes several times its size; the stream a small fraction.
    assert peak < size / 4, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"


@pytest.mark.slow
def test_gzip_trace_is_streamed_with_a_size_bound(tmp_path):
    import gzip
    import tracemalloc

    packed = tmp_path / "big.jsonl.gz"
    size = _big_jsonl(packed, lines=200, opener=gzip.open)
    assert check_trace_file(packed).spans == 4000
    # Past the bound on decompressed bytes: a one-line error, found while streaming.
    with pytest.raises(TraceFileError, match="larger than") as info:
        check_trace_file(packed, max_bytes=size // 2)
    assert info.value.exit_code == 1
    # A gzip bomb (256 MiB of blanks in a few hundred KiB) stops at the bound, without holding it.
    bomb = tmp_path / "bomb.jsonl.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as out:
        line = json.dumps({"resourceSpans": []}).encode() + b" " * (1024**2 - 20) + b"\n"
        for _ in range(256):
            out.write(line)
    assert bomb.stat().st_size < 2 * 1024**2
    tracemalloc.start()
    try:
        with pytest.raises(TraceFileError, match="larger than"):
            check_trace_file(bomb, max_bytes=32 * 1024**2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024**2


def test_build_stage_parent_is_checked_in_either_order(tmp_path):
    """The SDK exports a parent after its children; a reordered file has it first: both are checked."""
    root = _span(
        "edgesdk.build",
        {"edgesdk.build.model": "m", "edgesdk.device.profile": "orin", "edgesdk.build.outcome": "ok"},
        span_id="00000000000000aa",
    )
    wrong = _span("other", {}, span_id="00000000000000bb")
    stage = {"edgesdk.build.stage": "export", "edgesdk.build.stage.outcome": "ok"}
    for order in ((0, 1), (1, 0)):
        for parent, expect in ((root, False), (wrong, True)):
            child = _span("edgesdk.build.export", stage, span_id="00000000000000cc", parent=parent["spanId"])
            spans = [child, parent]
            report = check_trace_file(_write(tmp_path, spans=[spans[i] for i in order]))
            found = any("parent should be" in f.message for f in report.findings)
            assert found is expect, (order, parent["name"], report.findings)
