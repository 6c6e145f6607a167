# SPDX-License-Identifier: Apache-2.0
"""SERVER spans for the requests that are not GenAI operations (``/metrics``, ``/v1/models``, unknown
paths, wrong methods, refused API keys) and the ``/health`` decision, on a real ``edgesdk serve``
subprocess writing a real trace file, which ``edgesdk check traces`` then accepts (exit 0).

The model is a real MiniLM ONNX bundle (embeddings); no LLM is needed for these routes."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from tests.test_serve import ServerProcess, _spans  # noqa: E402

pytestmark = pytest.mark.slow

KEY = "sk-test-spans"
TRACE_ID, PARENT_ID = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
UNSET = (None, 0, "STATUS_CODE_UNSET")


@pytest.fixture(scope="module")
def minilm_bundle(minilm_cpu_fp32):
    """tests/conftest.py's FP32, built once per session (read-only: copy it before changing it)."""
    return minilm_cpu_fp32


def _status(span: dict):
    return (span.get("status") or {}).get("code")


def _check_traces(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgesdk", "check", "traces", str(path)], capture_output=True, text=True, timeout=120
    )


def test_plain_http_requests_get_server_spans_and_pass_check_traces(minilm_bundle, tmp_path, clean_env):
    trace = tmp_path / "traces.jsonl"
    srv = ServerProcess([minilm_bundle, "--name", "minilm", "--trace-file", trace, "--api-key", KEY], tmp_path)
    auth = {"Authorization": f"Bearer {KEY}"}
    tp = {**auth, "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "User-Agent": "spans-test/1"}
    try:
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
        assert httpx.get(srv.url + "/metrics", headers=tp, timeout=10).status_code == 200
        assert httpx.get(srv.url + "/v1/models", headers=auth, timeout=10).status_code == 200
        assert httpx.get(srv.url + "/v1/models/minilm", headers=auth, timeout=10).status_code == 200
        assert httpx.get(srv.url + "/no/such/path", headers=tp, timeout=10).status_code == 404
        assert httpx.get(srv.url + "/v1/embeddings", headers=auth, timeout=10).status_code == 405
        assert httpx.request("BREW", srv.url + "/metrics", headers=auth, timeout=10).status_code == 405
        assert (
            httpx.post(srv.url + "/v1/embeddings", json={"model": "minilm", "input": "hi"}, timeout=10).status_code
            == 401
        )
        ok = httpx.post(srv.url + "/v1/embeddings", json={"model": "minilm", "input": "hi"}, headers=auth, timeout=60)
        assert ok.status_code == 200, ok.text
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]
    servers = [s for s in _spans(trace) if s["kind"] == 2]
    names = sorted(s["name"] for s in servers)
    # /health is not traced by default (probes); every other request has exactly one SERVER span.
    assert names == sorted(
        [
            "GET /metrics",
            "GET /v1/models",
            "GET /v1/models/{model}",
            "GET",
            "GET /v1/embeddings",
            "HTTP /metrics",
            "POST /v1/embeddings",
            "embeddings minilm",
        ]
    ), names
    by = {s["name"]: s for s in servers}
    m = by["GET /metrics"]
    a = m["attrs"]
    assert m["traceId"] == TRACE_ID and m["parentSpanId"] == PARENT_ID
    assert a["http.request.method"] == "GET" and a["http.route"] == "/metrics" and a["url.path"] == "/metrics"
    assert a["url.scheme"] == "http" and int(a["http.response.status_code"]) == 200
    assert a["server.address"] == "127.0.0.1" and int(a["server.port"]) == srv.port
    assert a["network.protocol.version"] == "1.1" and a["user_agent.original"] == "spans-test/1"
    assert a["client.address"] == "127.0.0.1" and int(a["client.port"]) > 0
    assert not any(k.startswith("gen_ai.") for s in servers if s["name"] != "embeddings minilm" for k in s["attrs"])
    assert by["GET /v1/models/{model}"]["attrs"]["url.path"] == "/v1/models/minilm"
    unknown = by["GET"]  # no route matched: the name is the method alone, no http.route, status unset (4xx)
    assert int(unknown["attrs"]["http.response.status_code"]) == 404 and "http.route" not in unknown["attrs"]
    assert unknown["attrs"]["url.path"] == "/no/such/path" and _status(unknown) in UNSET
    assert unknown["traceId"] == TRACE_ID and unknown["parentSpanId"] == PARENT_ID
    wrong = by["GET /v1/embeddings"]
    assert int(wrong["attrs"]["http.response.status_code"]) == 405 and _status(wrong) in UNSET
    other = by["HTTP /metrics"]["attrs"]  # a method outside the conventions' list
    assert other["http.request.method"] == "_OTHER" and other["http.request.method_original"] == "BREW"
    refused = by["POST /v1/embeddings"]
    assert int(refused["attrs"]["http.response.status_code"]) == 401 and _status(refused) in UNSET
    assert by["GET /v1/models"]["traceId"] != TRACE_ID  # no traceparent: a trace of its own
    proc = _check_traces(trace)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_exclusion_follows_the_opentelemetry_variable(minilm_bundle, tmp_path, clean_env):
    """OTEL_PYTHON_EXCLUDED_URLS replaces the default: here /health is traced and /metrics is not."""
    trace = tmp_path / "traces.jsonl"
    srv = ServerProcess(
        [minilm_bundle, "--name", "minilm", "--trace-file", trace],
        tmp_path,
        env={"OTEL_PYTHON_EXCLUDED_URLS": "/metrics$"},
    )
    try:
        assert httpx.get(srv.url + "/metrics", timeout=10).status_code == 200
        assert httpx.get(srv.url + "/v1/models", timeout=10).status_code == 200
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]
    servers = [s for s in _spans(trace) if s["kind"] == 2]
    names = {s["name"] for s in servers}
    assert "GET /health" in names and "GET /v1/models" in names and "GET /metrics" not in names, names
    health = [s for s in servers if s["name"] == "GET /health"]
    assert all(s["attrs"]["http.route"] == "/health" for s in health)
    # the start-up's polls while the models load answer 503 (serve/loading.py), the ones after 200
    codes = {int(s["attrs"]["http.response.status_code"]) for s in health}
    assert 200 in codes and codes <= {200, 503}, codes
    proc = _check_traces(trace)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_untraced_patterns(monkeypatch):
    from edgesdk.errors import InputError
    from edgesdk.telemetry.serve_spans import untraced_patterns

    for var in ("OTEL_PYTHON_EXCLUDED_URLS", "OTEL_PYTHON_STARLETTE_EXCLUDED_URLS"):
        monkeypatch.delenv(var, raising=False)
    assert [p.pattern for p in untraced_patterns()] == ["/health$"]
    monkeypatch.setenv("OTEL_PYTHON_EXCLUDED_URLS", "")  # set and empty: nothing excluded
    assert untraced_patterns() == ()
    monkeypatch.setenv("OTEL_PYTHON_STARLETTE_EXCLUDED_URLS", "healthz,client/.*/info")  # the specific one wins
    monkeypatch.setenv("OTEL_PYTHON_EXCLUDED_URLS", "other")
    assert [p.pattern for p in untraced_patterns()] == ["healthz", "client/.*/info"]
    assert [p.pattern for p in untraced_patterns(("a", "b/.*"))] == ["a", "b/.*"]
    with pytest.raises(InputError):
        untraced_patterns(("(",))
