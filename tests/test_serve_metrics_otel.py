# SPDX-License-Identifier: Apache-2.0
"""``/metrics`` is the OpenTelemetry SDK's Prometheus reader over the server's OpenTelemetry instruments (issue
24: one metrics system, not a hand-written second one). A real ``edgesdk serve`` process with a real MiniLM
ONNX bundle answers real ``openai`` client requests; its ``/metrics`` text is parsed by ``prometheus_client``'s
parser and every figure checked against what the responses said. Then an application that installed its own
global MeterProvider serves the same app in-process (a subprocess of its own, since a global provider can be
set once per process): ``/metrics`` still answers, with the same figures."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
parser = pytest.importorskip("prometheus_client.parser")

from edgesdk.telemetry import _names as N  # noqa: E402
from tests.test_serve import ServerProcess  # noqa: E402

# The /metrics families docs/serve.md lists ("Prometheus metrics"), and their Prometheus types.
DOCUMENTED = {
    "edgesdk_serve_requests": "counter",
    "edgesdk_serve_rejected": "counter",
    "edgesdk_serve_cancelled": "counter",
    "edgesdk_serve_queue_depth": "gauge",
    "edgesdk_serve_embedding_batch_size": "histogram",
    "edgesdk_serve_prompt_cache_reused_tokens": "counter",
    "edgesdk_serve_prompt_cache_bytes": "gauge",
    "edgesdk_serve_slots": "gauge",
    "edgesdk_serve_slots_busy": "gauge",
    "edgesdk_serve_speculative_tokens": "counter",
    "gen_ai_server_request_duration_seconds": "histogram",
    "gen_ai_server_time_to_first_token_seconds": "histogram",
    "gen_ai_server_time_per_output_token_seconds": "histogram",
    "edgesdk_serve_token_usage": "counter",
}


@pytest.fixture(scope="module")
def minilm_bundle(minilm_cpu_fp32):
    """tests/conftest.py's FP32, built once per session (read-only: copy it before changing it)."""
    return minilm_cpu_fp32


def families(text: str) -> dict:
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def value(fams: dict, sample: str, **labels: str) -> float:
    """The one sample named ``sample`` whose labels are exactly ``labels`` (0 when absent)."""
    found = [s.value for f in fams.values() for s in f.samples if s.name == sample and s.labels == labels]
    assert len(found) <= 1, (sample, labels, found)
    return found[0] if found else 0.0


def check_histogram(fams: dict, name: str, buckets: list, **labels: str) -> float:
    """The bucket boundaries are ``buckets`` (the advised ones), the counts cumulative up to +Inf == _count;
    returns _count."""
    rows = sorted(
        (float(s.labels["le"]), s.value)
        for s in fams[name].samples
        if s.name == name + "_bucket" and {k: v for k, v in s.labels.items() if k != "le"} == labels
    )
    assert [b for b, _ in rows] == [float(b) for b in buckets] + [float("inf")], rows
    counts = [c for _, c in rows]
    assert counts == sorted(counts)
    assert counts[-1] == value(fams, name + "_count", **labels)
    return counts[-1]


def exercise(url: str) -> tuple[int, int]:
    """Three good embeddings requests (1, 2 and 3 inputs), one 400, one 404; returns (inputs, usage tokens)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    tokens = 0
    for inputs in (["one"], ["two words", "three more words"], ["a", "b c", "d e f g"]):
        tokens += client.embeddings.create(model="minilm", input=inputs).usage.prompt_tokens
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="minilm", input=[""])
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input=["x"])
    return 6, tokens


def check_figures(text: str, inputs: int, tokens: int) -> None:
    fams = families(text)
    kinds = {name: f.type for name, f in fams.items()}
    assert set(kinds) <= set(DOCUMENTED), set(kinds) - set(DOCUMENTED)  # nothing undocumented
    assert all(DOCUMENTED[n] == k for n, k in kinds.items()), kinds
    # No resource (target_info) series and no otel_scope_* labels: only the server's own labels.
    assert not any(k.startswith("otel_") for f in fams.values() for s in f.samples for k in s.labels)
    req = "edgesdk_serve_requests_total"
    assert value(fams, req, route="/v1/embeddings", model="minilm", status="200") == 3
    assert value(fams, req, route="/v1/embeddings", model="minilm", status="400") == 1
    assert value(fams, req, route="/v1/embeddings", model="", status="404") == 1
    genai = {
        "gen_ai_operation_name": "embeddings",
        "gen_ai_request_model": "minilm",
        "gen_ai_provider_name": "onnxruntime",
    }
    assert check_histogram(fams, "gen_ai_server_request_duration_seconds", N.DURATION_BUCKETS, **genai) == 3
    assert value(fams, "gen_ai_server_request_duration_seconds_sum", **genai) > 0
    tok = {k: v for k, v in genai.items() if k != "gen_ai_operation_name"}
    assert value(fams, "edgesdk_serve_token_usage_total", **tok, gen_ai_token_type="input") == tokens
    batches = check_histogram(fams, "edgesdk_serve_embedding_batch_size", [1, 2, 4, 8, 16, 32, 64, 128], model="minilm")
    assert 3 <= batches <= inputs  # each request is at least one batch (they came one after another)
    assert value(fams, "edgesdk_serve_embedding_batch_size_sum", model="minilm") == inputs


def test_metrics_are_the_otel_figures_on_a_real_server(minilm_bundle, tmp_path, clean_env):
    # --trace-file: edgesdk also builds its own OpenTelemetry providers (the OTLP file); /metrics is unaffected.
    srv = ServerProcess([minilm_bundle, "--name", "minilm", "--trace-file", tmp_path / "t.jsonl"], tmp_path)
    try:
        empty = httpx.get(srv.url + "/metrics", timeout=10)
        assert empty.status_code == 200 and empty.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert (
            value(
                families(empty.text),
                "edgesdk_serve_requests_total",
                route="/v1/embeddings",
                model="minilm",
                status="200",
            )
            == 0
        )
        inputs, tokens = exercise(srv.url)
        r = httpx.get(srv.url + "/metrics", timeout=10)
        check_figures(r.text, inputs, tokens)
        again = httpx.get(srv.url + "/metrics", timeout=10).text  # cumulative: a scrape does not reset them
        check_figures(again, inputs, tokens)
    finally:
        assert srv.stop() == 0
    # The OTLP file gets the runtime's own GenAI metrics (scope edgesdk), not the server's (docs/serve.md).
    scopes = {
        sm["scope"]["name"]: {m["name"] for m in sm.get("metrics", [])}
        for line in (tmp_path / "t.jsonl").read_text().splitlines()
        for rm in json.loads(line).get("resourceMetrics", [])
        for sm in rm.get("scopeMetrics", [])
    }
    assert "gen_ai.client.operation.duration" in scopes.get("edgesdk", set()), scopes
    assert "edgesdk.serve" not in scopes


APP_WITH_ITS_OWN_PROVIDER = textwrap.dedent("""
    import json, sys
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from starlette.testclient import TestClient

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    metrics.get_meter("the-app").create_counter("app.requests").add(1)

    from edgesdk.serve import create_app, load_models

    entries = load_models([sys.argv[1]], ["minilm"], threads=2)
    results = {}
    with TestClient(create_app(entries), base_url="http://127.0.0.1:8080") as client:
        tokens = 0
        for inputs in (["one"], ["two words", "three more words"], ["a", "b c", "d e f g"]):
            r = client.post("/v1/embeddings", json={"model": "minilm", "input": inputs})
            tokens += r.json()["usage"]["prompt_tokens"]
        results["bad"] = client.post("/v1/embeddings", json={"model": "minilm", "input": [""]}).status_code
        results["missing"] = client.post("/v1/embeddings", json={"model": "nope", "input": ["x"]}).status_code
        m = client.get("/metrics")
        results.update(status=m.status_code, text=m.text, tokens=tokens)
    data = reader.get_metrics_data()
    results["app_metrics"] = sorted(m.name for rm in data.resource_metrics for sm in rm.scope_metrics
                                    for m in sm.metrics)
    for e in entries:
        e.session.close()
    print(json.dumps(results))
""")


def test_metrics_when_the_application_brings_its_own_meter_provider(minilm_bundle, tmp_path, clean_env):
    script = tmp_path / "app.py"
    script.write_text(APP_WITH_ITS_OWN_PROVIDER)
    done = subprocess.run(
        [sys.executable, str(script), str(minilm_bundle)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["status"] == 200 and got["bad"] == 400 and got["missing"] == 404
    check_figures(got["text"], 6, got["tokens"])
    # The application's provider keeps its own figures; the server's go to /metrics (its own provider).
    assert got["app_metrics"] == ["app.requests"]
