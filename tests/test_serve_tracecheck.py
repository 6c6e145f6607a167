# SPDX-License-Identifier: Apache-2.0
"""``edgesdk check traces`` on a model server's SERVER spans: a GenAI span of kind SERVER is accepted
when it is an HTTP server span (``http.request.method``), and then held to the HTTP conventions
(required attributes, types, method names, span status for 4xx/5xx). Fast: hand-built OTLP/JSON."""

from __future__ import annotations

import pytest

from edgesdk.tracecheck import check_trace_file
from tests.test_check_traces import _span, _write

SERVER = 2
HTTP = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "llama.cpp",
    "gen_ai.request.model": "gemma",
    "gen_ai.usage.input_tokens": 10,
    "gen_ai.usage.output_tokens": 4,
    "gen_ai.response.finish_reasons": ["stop"],
    "http.request.method": "POST",
    "http.route": "/v1/chat/completions",
    "url.path": "/v1/chat/completions",
    "url.scheme": "http",
    "http.response.status_code": 200,
    "server.address": "127.0.0.1",
    "server.port": 8080,
    "network.protocol.version": "1.1",
}


def _rules(report):
    return {(f.rule, f.attribute) for f in report.findings if f.level == "violation"}


def test_http_server_span_with_genai_attributes_conforms(tmp_path):
    report = check_trace_file(_write(tmp_path, [_span("chat gemma", HTTP, kind=SERVER)]))
    assert not report.fails(), report.findings
    assert not [f for f in report.findings if f.level == "improvement"], report.findings


def test_refused_request_span_conforms_without_usage(tmp_path):
    attrs = {
        k: v for k, v in HTTP.items() if not k.startswith("gen_ai.usage") and k != "gen_ai.response.finish_reasons"
    }
    attrs["http.response.status_code"] = 429
    report = check_trace_file(_write(tmp_path, [_span("chat gemma", attrs, kind=SERVER)]))
    assert not report.fails() and not [f for f in report.findings if f.level == "improvement"], report.findings


@pytest.mark.parametrize(
    "change,status,rule",
    [
        ({"http.request.method": None}, 0, ("span_kind_unexpected", "")),  # SERVER without HTTP: not a server span
        ({"url.path": None}, 0, ("missing_attribute", "url.path")),
        ({"url.scheme": None}, 0, ("missing_attribute", "url.scheme")),
        ({"http.request.method": "FETCH"}, 0, ("undefined_enum_variant", "http.request.method")),
        ({"http.response.status_code": "200"}, 0, ("attribute_type_mismatch", "http.response.status_code")),
        ({"http.response.status_code": 404}, 2, ("span_status", "http.response.status_code")),
        ({"http.response.status_code": 700}, 0, ("value_inconsistent", "http.response.status_code")),
        ({"http.response.status_code": 500}, 2, ("missing_attribute", "error.type")),
    ],
)
def test_server_span_violations(tmp_path, change, status, rule):
    attrs = {**HTTP, **change}
    attrs = {k: v for k, v in attrs.items() if v is not None}
    report = check_trace_file(_write(tmp_path, [_span("chat gemma", attrs, kind=SERVER, status=status)]))
    assert rule in _rules(report), report.findings


def test_5xx_without_error_status_is_an_improvement(tmp_path):
    report = check_trace_file(
        _write(tmp_path, [_span("chat gemma", {**HTTP, "http.response.status_code": 503}, kind=SERVER)])
    )
    assert not report.fails()
    assert ("span_status", "http.response.status_code") in {(f.rule, f.attribute) for f in report.findings}
