# SPDX-License-Identifier: Apache-2.0
"""Issue 34, round three: one request must not hold the server (items 3 and 4), against real servers on loopback.

Item 3: every generation request has a server-side wall-clock deadline (``serve --request-timeout``); a request
past it ends with a 504 (or an error event mid-stream) naming the limit and the option, its slot is freed, and
the server goes on serving. Both LLM paths: continuous batching (``--parallel 4``) and one request at a time
(``--parallel 1``).
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from test_serve import ServerProcess, gemma_chat_bundle  # noqa: E402,F401  (gemma_chat_bundle: a fixture)

pytestmark = pytest.mark.slow

# Gemma-3's end-of-generation tokens (<eos> 1, <end_of_turn> 106) banned: the reply runs to max_tokens (2,000
# tokens: over 30 s on 2 CPU cores), far past a 1 s limit.
ENDLESS = {
    "model": "gemma",
    "prompt": "Count from one to one thousand in words: one, two,",
    "max_tokens": 2000,
    "temperature": 0,
    "logit_bias": {"1": -100, "106": -100},
}


@pytest.fixture(scope="module", params=["4", "1"], ids=["batched", "one-at-a-time"])
def timed_server(request, gemma_chat_bundle, tmp_path_factory):  # noqa: F811 - the imported fixture
    srv = ServerProcess(
        [gemma_chat_bundle, "--name", "gemma", "--parallel", request.param, "--request-timeout", "1"],
        tmp_path_factory.mktemp("serve-timeout"),
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def _says_the_limit(error: dict) -> None:
    assert error["code"] == "request_timeout", error
    assert "limit of 1 s per request" in error["message"], error
    assert "edgesdk serve --request-timeout" in error["message"], error


def test_a_request_past_the_deadline_gets_504_naming_the_limit(timed_server):
    t0 = time.monotonic()
    r = httpx.post(timed_server.url + "/v1/completions", json=ENDLESS, timeout=120)
    took = time.monotonic() - t0
    assert r.status_code == 504, r.text
    _says_the_limit(r.json()["error"])
    assert took < 20, took  # the deadline, not the 2,000 tokens (generous: 2 shared cores)


def test_a_stream_past_the_deadline_ends_with_an_error_event(timed_server):
    events = []
    with httpx.stream("POST", timed_server.url + "/v1/completions", json={**ENDLESS, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert len(errors) == 1, events[-3:]
    _says_the_limit(errors[0])
    assert events[-1] != "[DONE]"  # as every mid-stream error: the error event ends the stream
    assert any("choices" in json.loads(e) for e in events[:-1])  # pieces went out before it


def test_the_server_keeps_serving_after_a_timeout(timed_server):
    r = httpx.post(timed_server.url + "/v1/completions", json=ENDLESS, timeout=120)
    assert r.status_code == 504
    assert httpx.get(timed_server.url + "/health", timeout=5).status_code == 200
    short = httpx.post(
        timed_server.url + "/v1/completions",
        json={"model": "gemma", "prompt": "Hello", "max_tokens": 2, "temperature": 0},
        timeout=60,
    )
    assert short.status_code == 200, short.text
    assert short.json()["usage"]["completion_tokens"] >= 1
    text = httpx.get(timed_server.url + "/metrics", timeout=10).text
    busy = [ln for ln in text.splitlines() if ln.startswith('edgesdk_serve_slots_busy{model="gemma"}')]
    assert not busy or busy[0].endswith(" 0.0"), busy  # the timed-out request's slot is free (batched)
