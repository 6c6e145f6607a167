# SPDX-License-Identifier: Apache-2.0
"""`edgesdk serve` against a real uvicorn server on loopback: the real `openai` client (sync, async,
streaming) and curl, on the real Gemma-3-270M GGUF bundle and a real MiniLM ONNX bundle.

The Gemma GGUF on the registry carries no chat template; the chat fixture (tests/conftest.py's gemma_chat_bundle)
adds Gemma's turn format (``<start_of_turn>user ... <end_of_turn>``) with gguf-py's ``gguf_new_metadata``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_fixtures import THREADS

pytest.importorskip("llama_cpp")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Write one sentence about the sea."}]


# ------------------------------------------------------------------------------ fixtures
# The bundles are tests/conftest.py's, built once per session (gemma_chat_bundle: the registry GGUF with Gemma's
# turn format added; minilm_cpu_fp32). This module-level gemma_chat_bundle hands conftest's on, so that modules
# importing it from here (``from test_serve import gemma_chat_bundle``) share the one build too.
@pytest.fixture(scope="session")
def gemma_chat_bundle(gemma_chat_bundle: Path) -> Path:
    return gemma_chat_bundle


@pytest.fixture(scope="module")
def minilm_cpu_bundle(minilm_cpu_fp32: Path) -> Path:
    return minilm_cpu_fp32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m edgesdk serve ...` on a free loopback port, ready when /health answers."""

    def __init__(
        self, args: list, tmp: Path, env: dict | None = None, *, argv: list[str] | None = None, port: int | None = None
    ):
        """``args`` after ``edgesdk serve`` (port, threads and log level added); or a whole ``argv`` that
        serves on ``port``."""
        self.args = list(args)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        self._fh = open(self.log, "w")  # noqa: SIM115 - closed in stop()
        cmd = argv or [
            sys.executable,
            "-m",
            "edgesdk",
            "serve",
            *map(str, args),
            "--port",
            str(self.port),
            "--threads",
            str(THREADS),
            "--log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(cmd, stdout=self._fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise AssertionError(f"server did not start: {self.log.read_text()[-3000:]}")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._fh.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(gemma_chat_bundle, minilm_cpu_bundle, tmp_path_factory):
    srv = ServerProcess(
        [gemma_chat_bundle, minilm_cpu_bundle, "--name", "gemma", "--name", "minilm"], tmp_path_factory.mktemp("serve")
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.fixture(scope="module")
def gemma_session(gemma_chat_bundle):
    import edgesdk

    with edgesdk.load(gemma_chat_bundle, threads=THREADS) as s:
        yield s


@pytest.fixture(scope="module")
def minilm_session(minilm_cpu_bundle):
    import edgesdk

    with edgesdk.load(minilm_cpu_bundle) as s:
        yield s


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def curl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    return subprocess.run(["curl", "-sS", *args], capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------ API with the openai client
def test_models_and_health(server, client):
    assert sorted(m.id for m in client.models.list().data) == ["gemma", "minilm"]
    assert client.models.retrieve("gemma").id == "gemma"
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and set(health["models"]) == {"gemma", "minilm"}


def test_chat_greedy_is_token_identical_to_the_session(client, gemma_session):
    r = client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=24, temperature=0)
    direct = gemma_session.chat(MESSAGES, max_tokens=24, temperature=0)
    last = gemma_session.backend.last
    assert r.choices[0].message.content == direct and direct.strip()
    assert r.choices[0].message.role == "assistant" and r.object == "chat.completion"
    assert r.usage.prompt_tokens == last["input_tokens"] and r.usage.completion_tokens == last["output_tokens"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason == ("length" if last["finish_reason"] == "length" else "stop")


def test_chat_streaming_matches_non_streaming(client):
    full = client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=16, temperature=0)
    stream = client.chat.completions.create(
        model="gemma",
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # really streamed
    assert text == full.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_completions_with_stop_and_seed(client, gemma_session):
    prompt = "The capital of France is"
    r = client.completions.create(model="gemma", prompt=prompt, max_tokens=8, temperature=0)
    assert r.choices[0].text == gemma_session.generate(prompt, max_tokens=8, temperature=0)
    words = r.choices[0].text.split()
    if len(words) >= 2:
        stop = " " + words[1]
        cut = client.completions.create(model="gemma", prompt=prompt, max_tokens=8, temperature=0, stop=[stop])
        assert cut.choices[0].text == r.choices[0].text[: r.choices[0].text.index(stop)]
        assert cut.choices[0].finish_reason == "stop"
    a = client.completions.create(model="gemma", prompt=prompt, max_tokens=8, temperature=0.9, seed=7)
    b = client.completions.create(model="gemma", prompt=prompt, max_tokens=8, temperature=0.9, seed=7)
    assert a.choices[0].text == b.choices[0].text  # same seed, same sample


def test_embeddings_equal_the_session(client, minilm_session):
    texts = ["A cat sits on the mat.", "Edge devices run small models.", "hi"]
    r = client.embeddings.create(model="minilm", input=texts)  # the client asks for base64 by default
    got = np.asarray([d.embedding for d in r.data], dtype=np.float32)
    ref = minilm_session.embed(texts)
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert got.shape == ref.shape and cos.min() > 0.9999
    assert [d.index for d in r.data] == [0, 1, 2] and r.usage.prompt_tokens > len(texts)
    single = client.embeddings.create(model="minilm", input="hi", encoding_format="float")
    assert np.dot(single.data[0].embedding, ref[2]) > 0.9999


def test_async_client_concurrent_chat_and_embeddings(server):
    import asyncio

    async def main():
        a = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        chats = [
            a.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=6, temperature=0) for _ in range(4)
        ]
        embs = [a.embeddings.create(model="minilm", input=f"sentence number {i}") for i in range(16)]
        return await asyncio.gather(*chats, *embs)

    results = asyncio.run(main())
    texts = {r.choices[0].message.content for r in results[:4]}
    assert len(texts) == 1  # serialised on one context: the same greedy reply each time
    assert all(len(r.data[0].embedding) == 384 for r in results[4:])
    metrics = httpx.get(server.url + "/metrics").text
    batches = _sample(metrics, 'edgesdk_serve_embedding_batch_size_count{model="minilm"}')
    inputs = _sample(metrics, 'edgesdk_serve_embedding_batch_size_sum{model="minilm"}')
    assert inputs >= 16 and batches < inputs  # concurrent requests shared batches


# ------------------------------------------------------------------------------ curl, errors, metrics
def test_curl_chat_stream_is_server_sent_events(server):
    body = json.dumps({"model": "gemma", "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "stream": True})
    out = curl("-N", server.url + "/v1/chat/completions", "-H", "Content-Type: application/json", "-d", body)
    events = [line[len("data: ") :] for line in out.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")


def test_curl_completions_and_embeddings(server):
    json_type = ("-H", "Content-Type: application/json")  # curl -d alone says form-urlencoded: 415
    out = curl(
        server.url + "/v1/completions",
        *json_type,
        "-d",
        json.dumps({"model": "gemma", "prompt": "Hello", "max_tokens": 4, "temperature": 0}),
    )
    r = json.loads(out.stdout)
    assert r["object"] == "text_completion" and r["usage"]["completion_tokens"] <= 4
    out = curl(
        server.url + "/v1/embeddings", *json_type, "-d", json.dumps({"model": "minilm", "input": ["hi", "there"]})
    )
    r = json.loads(out.stdout)
    assert len(r["data"]) == 2 and len(r["data"][1]["embedding"]) == 384


@pytest.mark.parametrize(
    "path,body,status,code,param",
    [
        ("/v1/chat/completions", {"model": "nope", "messages": MESSAGES}, 404, "model_not_found", "model"),
        ("/v1/chat/completions", {"messages": MESSAGES}, 400, None, "model"),
        ("/v1/chat/completions", {"model": "gemma", "messages": []}, 400, None, "messages"),
        (
            "/v1/chat/completions",
            {"model": "gemma", "messages": MESSAGES, "max_tokens": 10**6},
            400,
            None,
            "max_tokens",
        ),
        ("/v1/chat/completions", {"model": "gemma", "messages": MESSAGES, "temperature": 5}, 400, None, "temperature"),
        ("/v1/chat/completions", {"model": "gemma", "messages": MESSAGES, "n": 2}, 400, None, "n"),
        ("/v1/chat/completions", {"model": "minilm", "messages": MESSAGES}, 400, None, "model"),
        (
            "/v1/chat/completions",
            {"model": "gemma", "messages": [{"role": "user", "content": "word " * 5000}]},
            400,
            "context_length_exceeded",
            "messages",
        ),
        ("/v1/embeddings", {"model": "gemma", "input": "x"}, 400, None, "model"),
        ("/v1/embeddings", {"model": "minilm", "input": ["a", [1, 2]]}, 400, None, "input"),
        ("/v1/embeddings", {"model": "minilm", "input": ""}, 400, None, "input"),
        ("/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": 12}, 400, None, "dimensions"),
    ],
)
def test_errors_have_openai_shape_and_status(server, path, body, status, code, param):
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == code and err["param"] == param


def test_bad_json_too_large_body_and_unknown_route(server):
    json_type = {"Content-Type": "application/json"}
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", headers=json_type, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    big = json.dumps({"model": "gemma", "messages": [{"role": "user", "content": "x" * (2 << 20)}]})
    r = httpx.post(server.url + "/v1/chat/completions", content=big, headers=json_type, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.get(server.url + "/v1/nothing-here", timeout=30)
    assert r.status_code == 404 and "error" in r.json()


_DEEP = b"[" * 100_000 + b"]" * 100_000
_GEN = b'"model": "gemma", "prompt": "Hi", "max_tokens": 2'


@pytest.mark.parametrize(
    "path,raw,param",
    [
        ("/v1/chat/completions", _DEEP, None),
        ("/v1/completions", b"{" + _GEN + b', "stream": true, "stream_options": "yes"}', "stream_options"),
        ("/v1/completions", b"{" + _GEN + b', "stream": true, "stream_options": [1]}', "stream_options"),
        ("/v1/completions", b"{" + _GEN + b', "seed": ' + b"9" * 4000 + b"}", "seed"),
        ("/v1/completions", b"{" + _GEN + b', "seed": -1}', "seed"),
        ("/v1/completions", b'{"model": "gemma", "prompt": "Hi", "max_tokens": 1' + b"0" * 400 + b"}", "max_tokens"),
        ("/v1/completions", b"{" + _GEN + b', "temperature": 1' + b"0" * 400 + b"}", "temperature"),
        ("/v1/completions", b"{" + _GEN + b', "top_p": 0}', "top_p"),
        ("/v1/completions", b'{"model": "gemma", "prompt": "\\ud800", "max_tokens": 2}', None),
        ("/v1/chat/completions", b'{"model": "gemma", "messages": [{"role": "user", "content": "a\\udfffb"}]}', None),
        ("/v1/embeddings", b'{"model": "minilm", "input": "\\ud800"}', None),
        ("/v1/embeddings", b'{"model": "minilm\\ud800", "input": "x"}', None),
    ],
)
def test_malformed_input_is_400_not_500(server, path, raw, param):
    """Issue 25, finding 7: each of these was a 500 (RecursionError, AttributeError, OverflowError,
    TypeError, or an error message that could not be encoded) or an error only from the model."""
    r = httpx.post(server.url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and len(err["message"]) < 400


def test_fuzzed_requests_never_get_a_5xx(server):
    """The request parser's fuzz strategies (tests/test_serve_fuzz.py) against the real server, bounded: a
    valid body with up to two fields replaced by fuzzed values (valid, junk of any JSON shape, or left out);
    every answer is 200 or a 4xx in OpenAI's shape. Generation stays at 2 tokens (sizes are fuzzed in-process)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_serve_fuzz import _COMMON, _field, _message, _text, _wire

    common = {k: v for k, v in _COMMON.items() if k not in ("max_tokens", "max_completion_tokens")}
    common["model"] = _field(st.sampled_from(["gemma", "minilm", "nope"]))
    routes = {
        "/v1/chat/completions": (
            {"model": "gemma", "messages": MESSAGES, "max_tokens": 2, "temperature": 0},
            {**common, "messages": _field(st.lists(_message, min_size=1, max_size=3))},
        ),
        "/v1/completions": (
            {"model": "gemma", "prompt": "Hi", "max_tokens": 2, "temperature": 0},
            {**common, "prompt": _field(_text | st.lists(_text, max_size=2)), "echo": _field(st.booleans())},
        ),
        "/v1/embeddings": (
            {"model": "minilm", "input": ["hi", "there"]},
            {
                "model": common["model"],
                "input": _field(_text | st.lists(_text, max_size=4)),
                "encoding_format": _field(st.sampled_from(["float", "base64"])),
                "dimensions": _field(st.integers(-1, 500)),
            },
        ),
    }
    seen: list[int] = []

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data(), path=st.sampled_from(sorted(routes)))
    def one(data, path):
        base, fields = routes[path]
        body = dict(base)
        for key in data.draw(st.lists(st.sampled_from(sorted(fields)), max_size=2, unique=True)):
            body[key] = data.draw(fields[key])
        r = httpx.post(
            server.url + path, content=_wire(body), headers={"Content-Type": "application/json"}, timeout=120
        )
        seen.append(r.status_code)
        assert r.status_code in (200, 400, 404), (r.status_code, r.text[:300], body)
        if r.status_code != 200:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}

    one()
    assert 200 in seen and 400 in seen, seen


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=10**6)


_PROM_LINE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
    r"(-?[0-9.e+-]+|\+Inf|-Inf|NaN)$"
)


def _sample(text: str, series: str, default: float | None = None) -> float:
    """The value of the one sample of ``text`` (Prometheus text, parsed by prometheus_client) named as
    ``series`` whose labels include ``series``'s labels (label order does not matter in Prometheus)."""
    from prometheus_client.parser import text_string_to_metric_families

    want = next(iter(next(iter(text_string_to_metric_families(series + " 0\n"))).samples))
    found = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == want.name and want.labels.items() <= s.labels.items()
    ]
    if not found and default is not None:
        return default
    assert len(found) == 1, f"{series}: {len(found)} samples in /metrics"
    return found[0]


def test_metrics_are_prometheus_text(server, client):
    before = httpx.get(server.url + "/metrics").text
    n0 = _sample(before, 'edgesdk_serve_requests_total{route="/v1/completions",model="gemma",status="200"}', 0)
    client.completions.create(model="gemma", prompt="Hi", max_tokens=3, temperature=0)
    r = httpx.get(server.url + "/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = [ln for ln in r.text.splitlines() if ln and not ln.startswith("#")]
    assert lines and all(_PROM_LINE.match(ln) for ln in lines), [ln for ln in lines if not _PROM_LINE.match(ln)]
    assert _sample(r.text, 'edgesdk_serve_requests_total{route="/v1/completions",model="gemma",status="200"}') == n0 + 1
    # Histogram buckets are cumulative and end at +Inf == _count.
    series = (
        'gen_ai_server_request_duration_seconds_count{gen_ai_operation_name="text_completion",'
        'gen_ai_request_model="gemma"}'
    )
    count = _sample(r.text, series)
    inf = _sample(
        r.text,
        'gen_ai_server_request_duration_seconds_bucket{gen_ai_operation_name="text_completion",'
        'gen_ai_request_model="gemma",le="+Inf"}',
    )
    assert count == inf >= 1


# ------------------------------------------------------------------------------ back-pressure, auth, shutdown
@pytest.fixture(scope="module")
def small_server(gemma_chat_bundle, tmp_path_factory):
    """One LLM served one request at a time (--parallel 1), no waiting room (--max-queue 0), an API key from
    the environment. (The batched path's back-pressure: tests/test_serve_batching.py.)"""
    srv = ServerProcess(
        [gemma_chat_bundle, "--name", "gemma", "--max-queue", "0", "--parallel", "1"],
        tmp_path_factory.mktemp("serve-small"),
        env={"EDGESDK_API_KEY": "s3cret"},
    )
    yield srv
    srv.stop()


AUTH = {"Authorization": "Bearer s3cret"}


def test_api_key_is_required_except_for_health(small_server):
    url = small_server.url
    assert httpx.get(url + "/health").status_code == 200
    r = httpx.get(url + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url + "/v1/models", headers=AUTH).status_code == 200
    c = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
    assert c.models.list().data[0].id == "gemma"


def _long_stream(url: str):
    # Greedy counting runs to max_tokens on this model (no early end of sequence).
    body = {"model": "gemma", "prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 400, "temperature": 0, "stream": True}
    return httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH, timeout=120)


def test_full_queue_answers_429_with_retry_after(small_server):
    # The busy state is established, then probed; if the long stream has already ended when the probe
    # arrives (a very slow machine), the probe proves nothing and the scenario is repeated.
    seen = []
    for _attempt in range(3):
        _wait_idle(small_server.url)
        with _long_stream(small_server.url) as resp:
            assert resp.status_code == 200
            # Hold the iterator: a dropped httpx line iterator closes the connection when collected, which the
            # server rightly treats as a client disconnect and cancels the stream.
            lines = resp.iter_lines()
            next(lines)  # generating now
            assert httpx.get(small_server.url + "/health").json()["models"]["gemma"] == 1
            r = httpx.post(
                small_server.url + "/v1/completions",
                headers=AUTH,
                timeout=30,
                json={"model": "gemma", "prompt": "Hi", "max_tokens": 2},
            )
            still_busy = httpx.get(small_server.url + "/health").json()["models"]["gemma"] == 1
        seen.append((r.status_code, still_busy))
        if r.status_code == 429:
            assert int(r.headers["Retry-After"]) >= 1 and r.json()["error"]["type"] == "rate_limit_error"
            return
        assert not still_busy, f"a request was accepted while the only slot was busy: {r.status_code} {r.text}"
    pytest.fail(f"never saw the server busy when probing: {seen}")


def _wait_idle(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(url + "/health").json()["models"]["gemma"] and time.monotonic() < deadline:
        time.sleep(0.02)


def _next_request(url: str) -> tuple[httpx.Response, float]:
    """A 2-token completion, retried while the model answers 429 (up to 3 s): the answer and the seconds it took."""
    t0 = time.monotonic()
    while True:
        r = httpx.post(
            url + "/v1/completions",
            headers=AUTH,
            timeout=60,
            json={"model": "gemma", "prompt": "Hi", "max_tokens": 2, "temperature": 0},
        )
        if r.status_code != 429 or time.monotonic() - t0 > 3:
            return r, time.monotonic() - t0
        time.sleep(0.02)


def test_client_disconnect_cancels_the_generation(small_server):
    url = small_server.url
    _wait_idle(url)
    with _long_stream(url) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        while not next(lines).startswith("data: "):
            pass
    # 400 tokens would take several seconds; the next request must be accepted almost at once.
    r, accepted_after = _next_request(url)
    assert r.status_code == 200, r.text
    assert accepted_after < 1.5, f"next request accepted only after {accepted_after:.2f} s"
    metrics = httpx.get(url + "/metrics", headers=AUTH).text
    assert _sample(metrics, 'edgesdk_serve_cancelled_total{model="gemma"}') >= 1


def test_abandoned_non_streaming_request_is_cancelled(small_server):
    """A "stream": false request whose client goes away stops at the next token (ASGI http.disconnect),
    as a stream does: the next request is accepted at once, not after the abandoned one's 400 tokens."""
    url = small_server.url
    _wait_idle(url)
    before = httpx.get(url + "/metrics", headers=AUTH).text
    series = 'edgesdk_serve_cancelled_total{model="gemma"}'
    cancelled0 = _sample(before, series, 0)
    body = json.dumps(
        {"model": "gemma", "prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 400, "temperature": 0, "stream": False}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{small_server.port}\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer s3cret\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", small_server.port), timeout=30) as sock:
        sock.sendall(head + body)
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health").json()["models"]["gemma"] != 1:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.02)
        time.sleep(0.5)  # generating now: a few tokens of 400
    r, accepted_after = _next_request(url)
    assert r.status_code == 200, r.text
    assert accepted_after < 1.5, f"next request accepted only after {accepted_after:.2f} s"
    metrics = httpx.get(url + "/metrics", headers=AUTH).text
    assert _sample(metrics, series) == cancelled0 + 1
    assert _sample(metrics, 'edgesdk_serve_requests_total{route="/v1/completions",model="gemma",status="499"}') >= 1


def test_sigterm_finishes_the_stream_in_flight(gemma_chat_bundle, tmp_path):
    trace = tmp_path / "traces.jsonl"
    srv = ServerProcess(
        [gemma_chat_bundle, "--name", "gemma", "--trace-file", trace, "--shutdown-timeout", "60"], tmp_path
    )
    try:
        body = {"model": "gemma", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as resp:
            lines = resp.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            srv.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        done = [json.loads(x[6:]) for x in [first, *rest[:-1]]]
        assert done[-1]["choices"][0]["finish_reason"] in ("length", "stop")
        assert srv.proc.wait(60) == 0
        with pytest.raises(httpx.HTTPError):
            httpx.get(srv.url + "/health", timeout=2)
    finally:
        srv.stop()
    # The stream's inference span reached the trace file before the process exited.
    spans = [
        s
        for line in trace.read_text().splitlines()
        for rs in json.loads(line).get("resourceSpans", [])
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]
    assert any(s["name"].startswith("text_completion") for s in spans), [s["name"] for s in spans]


# ------------------------------------------------------------------------------ telemetry (in-process server)
def test_server_span_joins_the_client_trace(gemma_chat_bundle, minilm_cpu_bundle, clean_env):
    import threading

    import uvicorn
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    from edgesdk import telemetry
    from edgesdk.serve import ServeConfig, create_app, load_models

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(span_exporter=exporter)
    entries = load_models([gemma_chat_bundle, minilm_cpu_bundle], ["gemma", "minilm"], threads=THREADS)
    port = free_port()
    app = create_app(entries, ServeConfig(port=port, tracer_provider=provider))
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not srv.started and time.monotonic() < deadline:
            time.sleep(0.05)
        trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        headers = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, default_headers=headers)
        r = c.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=5, temperature=0, stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in r if ch.choices)
        c.embeddings.create(model="minilm", input=["hello"])
    finally:
        srv.should_exit = True
        thread.join(30)
        for e in entries:
            e.session.close()
    assert telemetry.force_flush()
    spans = exporter.get_finished_spans()
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    by_op = {s.attributes["gen_ai.operation.name"]: s for s in servers}
    chat = by_op["chat"]
    assert chat.name == "chat gemma" and format(chat.context.trace_id, "032x") == trace_id
    assert format(chat.parent.span_id, "016x") == parent_id
    a = chat.attributes
    assert a["gen_ai.request.model"] == "gemma" and a["gen_ai.provider.name"] == "llama.cpp"
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == port
    assert a["gen_ai.usage.output_tokens"] >= 1 and a["gen_ai.usage.input_tokens"] > 1
    assert a["gen_ai.request.stream"] is True and a["http.response.status_code"] == 200
    # The backend's own inference span is a child of the server span.
    inner = [
        s
        for s in spans
        if s.kind != SpanKind.SERVER
        and s.context.trace_id == chat.context.trace_id
        and s.parent is not None
        and s.parent.span_id == chat.context.span_id
    ]
    assert inner, [(s.name, s.kind) for s in spans]
    emb = by_op["embeddings"]
    assert emb.attributes["gen_ai.embeddings.dimension.count"] == 384
    assert emb.attributes["gen_ai.usage.input_tokens"] == 3


# ------------------------------------------------------------------------------ trace file, prompt cache
TRACE_ID, PARENT_ID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


def _spans(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    s["attrs"] = {a["key"]: next(iter(a["value"].values())) for a in s.get("attributes", [])}
                    out.append(s)
    return out


def test_trace_file_holds_server_spans_that_pass_check_traces(gemma_chat_bundle, minilm_cpu_bundle, tmp_path):
    trace = tmp_path / "traces.jsonl"
    srv = ServerProcess(
        [
            gemma_chat_bundle,
            minilm_cpu_bundle,
            "--name",
            "gemma",
            "--name",
            "minilm",
            "--trace-file",
            trace,
            "--prompt-cache-mb",
            "32",
        ],
        tmp_path,
    )
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        tp = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        history = [
            {"role": "system", "content": "You answer in one short sentence about the sea and ships."},
            {"role": "user", "content": "Name a sea."},
        ]
        first = c.chat.completions.create(
            model="gemma", messages=history, max_tokens=8, temperature=0, extra_headers=tp
        )
        history += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And another one?"},
        ]
        stream = c.chat.completions.create(
            model="gemma",
            messages=history,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        c.embeddings.create(model="minilm", input=["hello"], extra_headers=tp)
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="nope", messages=history, extra_headers=tp)
        # The second turn reused the first turn's KV state (prompt cache on), and says so in usage.
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]
    spans = _spans(trace)
    servers = [s for s in spans if s["kind"] == 2]
    assert len(servers) == 4, [(s["name"], s["kind"]) for s in spans]
    by_name = {}
    for s in servers:
        by_name.setdefault(s["name"], []).append(s)
    chat = by_name["chat gemma"][0]
    assert chat["traceId"] == TRACE_ID and chat["parentSpanId"] == PARENT_ID
    a = chat["attrs"]
    assert a["http.request.method"] == "POST" and a["http.route"] == "/v1/chat/completions"
    assert a["url.path"] == "/v1/chat/completions" and a["url.scheme"] == "http"
    assert int(a["http.response.status_code"]) == 200 and a["network.protocol.version"] == "1.1"
    assert a["server.address"] == "127.0.0.1" and int(a["server.port"]) == srv.port
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "gemma"
    assert a["gen_ai.provider.name"] == "llama.cpp" and int(a["gen_ai.usage.output_tokens"]) >= 1
    assert int(a["gen_ai.usage.cache_read.input_tokens"]) == 0
    second = by_name["chat gemma"][1]["attrs"]
    assert int(second["gen_ai.usage.cache_read.input_tokens"]) > 0 and second["gen_ai.request.stream"] is True
    assert by_name["chat gemma"][1]["traceId"] != TRACE_ID  # no traceparent: a trace of its own
    emb = by_name["embeddings minilm"][0]
    assert emb["traceId"] == TRACE_ID and int(emb["attrs"]["http.response.status_code"]) == 200
    refused = by_name["chat"][0]  # unknown model: the client's string is not put in the span name
    assert int(refused["attrs"]["http.response.status_code"]) == 404 and refused["traceId"] == TRACE_ID
    assert refused.get("status", {}).get("code", 0) in (0, "STATUS_CODE_UNSET")  # 4xx: status left unset
    # The runtime's inference span is a child of the SERVER span.
    inner = [s for s in spans if s["kind"] != 2 and s.get("parentSpanId") == chat["spanId"]]
    assert inner and inner[0]["traceId"] == TRACE_ID
    proc = subprocess.run(
        [sys.executable, "-m", "edgesdk", "check", "traces", str(trace)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_one_slot_prefix_reuse_computes_what_llama_cpp_prefix_reuse_computes(gemma_chat_bundle):
    """``serve --parallel 1 --prompt-cache-mb N``: the engine's one slot keeps the last request's KV cells, and a
    prompt sharing their prefix gives the same greedy tokens as llama-cpp-python continuing from that prefix in a
    live context. (Whole-prompt evaluation may differ in the last bits: docs/serve.md.)"""
    import llama_cpp

    import edgesdk

    pre = "Here is a story that a grandmother told her grandchildren on a cold winter evening by the fire. "
    p1, p2 = pre + "Once upon a time", pre + "def fibonacci(n):"
    with edgesdk.load(gemma_chat_bundle, threads=THREADS) as s:
        gguf = str(s.bundle.artifact_path("model"))
        n_ctx = s.backend.settings["n_ctx"]
        s.backend.batch_engine(slots=1, max_queue=4, reuse_prefix=True)
        s.generate(p1, max_tokens=12, temperature=0)
        assert s.backend.last["cached_tokens"] == 0
        got = s.generate(p2, max_tokens=16, temperature=0)
        assert s.backend.last["cached_tokens"] >= 20
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=n_ctx, n_threads=THREADS, n_threads_batch=THREADS, verbose=False)
    try:
        llm.create_completion(p1, max_tokens=12, temperature=0)  # the live context keeps p1 + its reply
        ref = llm.create_completion(p2, max_tokens=16, temperature=0)["choices"][0]["text"]  # prefix reuse
    finally:
        llm.close()
    assert got == ref
