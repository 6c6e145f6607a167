# SPDX-License-Identifier: Apache-2.0
"""Issue 34, round three: one request must not hold the server (items 3 and 4), against real servers on loopback.

Item 3: every generation request has a server-side wall-clock deadline (``serve --request-timeout``); a request
past it ends with a 504 (or an error event mid-stream) naming the limit and the option, its slot is freed, and
the server goes on serving. Both LLM paths: continuous batching (``--parallel 4``) and one request at a time
(``--parallel 1``).

Item 4: a VLM request's images are counted (image tokens, from their headers) before any is decoded, and decoded
on a thread: a request of many 4096 x 4096 PNGs is refused at once while ``/health`` keeps answering.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time

import httpx
import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from test_serve import ServerProcess  # noqa: E402  (gemma_chat_bundle: tests/conftest.py, once per session)
from test_serve_vlm import vlm_bundle  # noqa: E402,F401  (a fixture: the tiny LLaVA, 16 image tokens per image)

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
def timed_server(request, gemma_chat_bundle, tmp_path_factory):
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


# ------------------------------------------------------------------------------ item 4: images counted, then decoded
@pytest.fixture(scope="module")
def vlm_server(vlm_bundle, tmp_path_factory):  # noqa: F811 - the imported fixture
    srv = ServerProcess(
        [vlm_bundle, "--name", "vlm", "--max-body-bytes", str(16 << 20)], tmp_path_factory.mktemp("serve-vlm-r3")
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def _png_4096() -> str:
    """A 4096 x 4096 PNG as a data URL (grey, 16 MB of pixels in ~16 KB: decoding is the cost, not the upload)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (4096, 4096), 128).save(buf, "PNG", compress_level=9)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _health_while(url: str, call):
    """``call()``'s result and the slowest /health answer (seconds) asked every 0.1 s while it ran."""
    slowest, done = [0.0], threading.Event()

    def poll() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            try:
                httpx.get(url + "/health", timeout=30)
            finally:
                slowest[0] = max(slowest[0], time.monotonic() - t0)
            time.sleep(0.1)

    t = threading.Thread(target=poll)
    t.start()
    try:
        result = call()
    finally:
        done.set()
        t.join()
    return result, slowest[0]


def test_many_large_images_are_refused_from_their_headers_while_health_answers(vlm_server, vlm_bundle):  # noqa: F811
    n_ctx = json.loads((vlm_bundle / "manifest.json").read_text())["extras"]["llm"]["n_ctx"]
    n = n_ctx // 16 + 16  # 16 image tokens each: well over the context
    url = _png_4096()
    body = {
        "model": "vlm",
        "max_tokens": 4,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}} for _ in range(n)]
                + [{"type": "text", "text": "What is on the table?"}],
            }
        ],
    }
    t0 = time.monotonic()
    r, slowest = _health_while(
        vlm_server.url, lambda: httpx.post(vlm_server.url + "/v1/chat/completions", json=body, timeout=300)
    )
    took = time.monotonic() - t0
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages", err
    assert f"the {n} images take at least {16 * n:,} image tokens" in err["message"], err
    assert "refused before decoding them" in err["message"], err
    assert slowest < 1.0, f"/health took {slowest:.2f} s while the request was read"  # was several seconds
    assert took < 30, took


def test_images_that_fit_are_decoded_off_the_event_loop_and_answered(vlm_server):
    """Eight 4096 x 4096 PNGs (128 image tokens) are taken: decoded on a thread, then answered."""
    url = _png_4096()
    body = {
        "model": "vlm",
        "max_tokens": 2,
        "temperature": 0,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}} for _ in range(8)]
                + [{"type": "text", "text": "What is on the table?"}],
            }
        ],
    }
    r, slowest = _health_while(
        vlm_server.url, lambda: httpx.post(vlm_server.url + "/v1/chat/completions", json=body, timeout=300)
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] >= 8 * 16
    assert slowest < 5.0, slowest  # generous: the model's own preprocessing runs on the worker thread


def test_an_image_whose_pixels_cannot_be_decoded_names_its_field(vlm_server):
    """A PNG with a valid header and cut-off pixel data passes the header checks; decoding it (on a thread) fails,
    and the 400 still names the part."""
    from PIL import Image

    buf = io.BytesIO()
    Image.effect_noise((256, 256), 64).save(buf, "PNG")
    cut = buf.getvalue()[: len(buf.getvalue()) // 2]
    url = "data:image/png;base64," + base64.b64encode(cut).decode("ascii")
    body = {
        "model": "vlm",
        "max_tokens": 2,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is on the table?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
    }
    r = httpx.post(vlm_server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[0].content[1].image_url.url", err
    assert "not a readable image" in err["message"], err
    assert httpx.get(vlm_server.url + "/health", timeout=5).status_code == 200
