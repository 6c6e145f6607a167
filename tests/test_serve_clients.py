# SPDX-License-Identifier: Apache-2.0
"""What OpenAI-client and llama-server users send (issue 39, items 7, 8, 10, 11), against a real ``edgesdk serve``
of the Gemma-3-270M GGUF with the shipped ``gemma`` chat template (which refuses roles it does not know), driven by
the real ``openai`` client and httpx:

- the ``developer`` role is a system turn (it was a 400 from the template);
- the neutral fields the openai 3.x client sends are accepted and do not change the reply; bad values and fields
  that would change it are 400 naming them;
- llama-server's ``/tokenize``, ``/detokenize``, ``/apply-template``, ``/props``, ``/slots``, and ``/v1/completions``
  reading special tokens in its prompt;
- the Responses API through ``client.responses.create``, whole and streamed.
"""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("starlette")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_serve import ServerProcess  # noqa: E402  (gemma_chat_bundle: tests/conftest.py, once per session)

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Name one colour."}]
COLOUR = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def served(gemma_chat_bundle, tmp_path_factory):
    srv = ServerProcess(
        [gemma_chat_bundle, "--name", "gemma", "--chat-template", "gemma", "--parallel", "2"],
        tmp_path_factory.mktemp("serve-clients"),
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _post(served, path: str, body: dict) -> httpx.Response:
    return httpx.post(served.url + path, json=body, timeout=120)


def _chat(client, messages, **kw) -> str:
    r = client.chat.completions.create(model="gemma", messages=messages, max_tokens=8, temperature=0, **kw)
    return r.choices[0].message.content


# ------------------------------------------------------------------------------ item 8: developer
def test_the_developer_role_is_a_system_turn(served, client):
    sys_msgs = [{"role": "system", "content": "Answer in French."}, *HI]
    dev_msgs = [{"role": "developer", "content": "Answer in French."}, *HI]
    assert _chat(client, dev_msgs) == _chat(client, sys_msgs)
    a = _post(served, "/apply-template", {"messages": dev_msgs})
    b = _post(served, "/apply-template", {"messages": sys_msgs})
    assert a.status_code == 200, a.text
    assert a.json() == b.json() and "Answer in French." in a.json()["prompt"]


# ------------------------------------------------------------------------------ item 10: neutral fields
NEUTRAL = {
    "metadata": {"team": "edge", "run": "42"},
    "prompt_cache_key": "conversation-7",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "reasoning_effort": "low",
    "verbosity": "low",
    "safety_identifier": "user-hash-1",
}


def test_neutral_fields_are_accepted_and_change_nothing(client):
    plain = _chat(client, HI)
    assert _chat(client, HI, **NEUTRAL) == plain
    stream = client.chat.completions.create(
        model="gemma",
        messages=HI,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
        **NEUTRAL,
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain
    assert chunks[-1].usage is not None and all(getattr(c, "obfuscation", None) is None for c in chunks)


@pytest.mark.parametrize(
    "field,value,param",
    [
        ("reasoning_effort", "extreme", "reasoning_effort"),
        ("verbosity", 3, "verbosity"),
        ("metadata", {f"k{i}": "v" for i in range(17)}, "metadata"),
        ("metadata", {"k": 1}, "metadata"),
        ("prompt_cache_key", 7, "prompt_cache_key"),
        ("prompt_cache_options", {"mode": "sometimes"}, "prompt_cache_options"),
        ("stream_options", {"include_obfuscation": "no"}, "stream_options.include_obfuscation"),
        ("stream_options", {"include_everything": True}, "stream_options.include_everything"),
        ("moderation", {"model": "omni-moderation-latest"}, "moderation"),  # would change the reply: refused
        ("web_search_options", {}, "web_search_options"),
    ],
)
def test_bad_neutral_values_and_answer_changing_fields_are_400(served, field, value, param):
    r = _post(served, "/v1/chat/completions", {"model": "gemma", "messages": HI, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


# ------------------------------------------------------------------------------ item 11: llama-server endpoints
def test_tokenize_and_detokenize(served):
    text = "<start_of_turn>user\nHi"
    special = _post(served, "/tokenize", {"content": text}).json()["tokens"]
    plain = _post(served, "/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
    assert len(plain) >= len(special) + 5  # '<start_of_turn>' is one token, or many pieces of text
    with_bos = _post(served, "/tokenize", {"content": text, "add_special": True}).json()["tokens"]
    assert with_bos[1:] == special and with_bos[0] not in special
    pieces = _post(served, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == special
    assert "".join(p["piece"] for p in pieces if isinstance(p["piece"], str)) == text
    back = _post(served, "/detokenize", {"tokens": special})
    assert back.status_code == 200 and back.json() == {"content": text}
    assert _post(served, "/detokenize", {"tokens": []}).json() == {"content": ""}
    # bad input: 400 naming the field, never a crash; the body limit holds
    for path, body, param in (
        ("/tokenize", {"content": 5}, "content"),
        ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
        ("/tokenize", {"content": "x", "shout": True}, "shout"),
        ("/tokenize", {"content": "x", "model": "nope"}, "model"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": [10**30]}, "tokens"),
        ("/detokenize", {"tokens": ["a"]}, "tokens"),
        ("/apply-template", {"messages": []}, "messages"),
        ("/apply-template", {"messages": HI, "frobnicate": 1}, "frobnicate"),
    ):
        r = _post(served, path, body)
        assert r.status_code in (400, 404), (path, body, r.text)
        assert r.json()["error"]["param"] == param, (path, body, r.text)
    big = httpx.post(served.url + "/tokenize", json={"content": "a" * (1 << 20)}, timeout=60)
    assert big.status_code == 413
    assert httpx.get(served.url + "/health", timeout=10).status_code == 200


def test_completions_read_special_tokens_as_llama_server_does(served, client):
    """The chat's own prompt text (``/apply-template``) sent to ``/v1/completions`` is the same tokens as the chat:
    its ``<start_of_turn>`` markers are special tokens, not text, and its leading ``<bos>`` is not doubled."""
    prompt = _post(served, "/apply-template", {"messages": HI}).json()["prompt"]
    assert prompt.startswith("<bos><start_of_turn>user\n") and prompt.endswith("<start_of_turn>model\n")
    chat = client.chat.completions.create(model="gemma", messages=HI, max_tokens=8, temperature=0)
    comp = client.completions.create(model="gemma", prompt=prompt, max_tokens=8, temperature=0, stop=["<end_of_turn>"])
    assert comp.usage.prompt_tokens == chat.usage.prompt_tokens
    assert comp.choices[0].text == chat.choices[0].message.content


def test_props_and_slots(served, client):
    props = httpx.get(served.url + "/props", timeout=10).json()
    assert props["total_slots"] == 2 and props["model_alias"] == "gemma"
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] > 0 and settings["params"]["temperature"] == pytest.approx(0.8)
    idle = httpx.get(served.url + "/slots", timeout=10).json()
    assert [s["id"] for s in idle] == [0, 1] and not any(s["is_processing"] for s in idle)
    assert all("prompt" not in s for s in idle)  # no prompt text
    assert httpx.get(served.url + "/slots?fail_on_no_slot=1", timeout=10).status_code == 200
    assert httpx.get(served.url + "/props?model=nope", timeout=10).status_code == 404
    # while a long stream runs, one slot is busy
    seen: list[int] = []
    stream = client.chat.completions.create(
        model="gemma", messages=HI, max_tokens=200, temperature=0, stream=True, logit_bias={"106": -100, "1": -100}
    )
    got = threading.Event()
    for n, _chunk in enumerate(stream):
        if n == 3 and not got.is_set():
            seen.append(sum(s["is_processing"] for s in httpx.get(served.url + "/slots", timeout=10).json()))
            got.set()
    assert seen == [1]


# ------------------------------------------------------------------------------ item 7: the Responses API
def test_responses_text_input_and_instructions(client):
    chat = _chat(client, HI)
    r = client.responses.create(model="gemma", input=HI[0]["content"], max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output_text == chat
    assert r.usage.input_tokens > 0 and r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # instructions = a system turn first; a message list with a developer turn is the same chat
    with_sys = _chat(client, [{"role": "system", "content": "Answer in one word."}, *HI])
    r2 = client.responses.create(
        model="gemma", instructions="Answer in one word.", input=HI, max_output_tokens=8, temperature=0
    )
    assert r2.output_text == with_sys and r2.instructions == "Answer in one word."
    r3 = client.responses.create(
        model="gemma",
        input=[
            {"role": "developer", "content": "Answer in one word."},
            {"role": "user", "content": [{"type": "input_text", "text": HI[0]["content"]}]},
        ],
        max_output_tokens=8,
        temperature=0,
        metadata={"k": "v"},
        store=True,
    )
    assert r3.output_text == with_sys and r3.metadata == {"k": "v"} and r3.store is False
    cut = client.responses.create(model="gemma", input="Count from one to fifty.", max_output_tokens=2, temperature=0)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


def test_responses_stream_events(client):
    whole = client.responses.create(model="gemma", input=HI, max_output_tokens=12, temperature=0)
    events = list(client.responses.create(model="gemma", input=HI, max_output_tokens=12, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if whole.status == "completed" else "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    # the client's own stream helper accumulates the same response; it wants response.completed, and this base
    # model rambles to any limit, so a schema of one enum property makes the reply end
    fmt = {"format": {"type": "json_schema", "name": "c", "schema": COLOUR}}
    done = client.responses.create(model="gemma", input=HI, max_output_tokens=60, temperature=0, text=fmt)
    assert done.status == "completed", done.output_text
    with client.responses.stream(model="gemma", input=HI, max_output_tokens=60, temperature=0, text=fmt) as s:
        final = s.get_final_response()
    assert final.output_text == done.output_text and final.status == "completed"
    assert json.loads(final.output_text)["colour"] in ("red", "green", "blue")


def test_responses_structured_output_and_tools(client):
    r = client.responses.create(
        model="gemma",
        input=HI,
        max_output_tokens=60,
        temperature=0.7,
        text={"format": {"type": "json_schema", "name": "c", "schema": COLOUR, "strict": True}},
    )
    assert r.status == "completed" and json.loads(r.output_text)["colour"] in ("red", "green", "blue")
    obj = client.responses.create(
        model="gemma", input=HI, max_output_tokens=60, temperature=0, text={"format": {"type": "json_object"}}
    )
    assert obj.output_text.lstrip().startswith("{")
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    r = client.responses.create(
        model="gemma", input="Weather in Paris?", tools=[tool], tool_choice="required", max_output_tokens=60
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    # the call and its output go back as input items
    follow = client.responses.create(
        model="gemma",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"},
        ],
        tools=[tool],
        tool_choice="none",
        max_output_tokens=12,
        temperature=0,
    )
    assert follow.output_text
    streamed = list(
        client.responses.create(
            model="gemma",
            input="Weather in Paris?",
            tools=[tool],
            tool_choice="required",
            max_output_tokens=60,
            stream=True,
        )
    )
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].name == "get_weather"


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "hi", "conversation": "conv_1"}, "conversation"),
        ({"input": "hi", "include": ["message.output_text.logprobs"]}, "include"),
        ({"input": "hi", "truncation": "auto"}, "truncation"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]"),
        ({"input": []}, "input"),
        ({"input": "hi", "max_output_tokens": 10**6}, "max_output_tokens"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format"),
        ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning"),
        ({"input": "hi", "temperature": 3}, "temperature"),
        ({"input": "hi", "frobnicate": True}, "frobnicate"),
    ],
)
def test_responses_refusals_name_the_field(served, body, param):
    r = _post(served, "/v1/responses", {"model": "gemma", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


# ------------------------------------------------------------------------------ item 9: /health while loading
def test_health_answers_loading_until_the_models_are_in(gemma_chat_bundle, tmp_path):
    """A real ``edgesdk serve`` probed from its first moment: refused until the port is bound, then 503
    ``{"status": "loading"}`` (other routes 503 ``model_loading``, still behind the API key), then 200: no probe
    hangs. ``--parallel 1`` here: llama-server's endpoints that need the engine's detokenizer say so."""
    import os
    import subprocess
    import sys
    import time

    from test_serve import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - closed below
    cmd = [sys.executable, "-m", "edgesdk", "serve", str(gemma_chat_bundle), "--name", "gemma", "--port", str(port)]
    cmd += ["-t", "2", "--parallel", "1", "--api-key", "k", "--log-level", "warning"]  # -t: llama-server's
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    key = {"Authorization": "Bearer k"}
    seen: list = []
    during: list = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                r = httpx.get(url + "/health", timeout=5)
            except httpx.ConnectError:
                seen.append("refused")
                time.sleep(0.05)
                continue
            except httpx.TimeoutException:
                seen.append("timeout")
                continue
            seen.append((r.status_code, r.json().get("status")))
            if r.status_code == 200:
                break
            if not during:  # while loading: the other routes answer too, behind the key
                during.append(httpx.get(url + "/v1/models", headers=key, timeout=5))
                during.append(httpx.get(url + "/v1/models", timeout=5))
            time.sleep(0.02)
        assert "timeout" not in seen, seen
        answered = [s for s in seen if s != "refused"]
        assert answered and answered[-1] == (200, "ok"), seen
        assert seen.index(answered[0]) == len(seen) - len(answered)  # never refused once bound
        assert (503, "loading") in answered, seen  # the loading phase was seen, and it said so
        assert all(s == (503, "loading") for s in answered[:-1]), seen
        if during:
            assert during[0].status_code == 503 and during[0].json()["error"]["code"] == "model_loading"
            assert during[0].headers["retry-after"] == "1"
            assert during[1].status_code == 401
        for _ in range(5):
            assert httpx.get(url + "/health", timeout=5).status_code == 200
        # llama-server's endpoints with --parallel 1
        tok = httpx.post(url + "/tokenize", json={"content": "Hi there"}, headers=key, timeout=60)
        assert tok.status_code == 200 and len(tok.json()["tokens"]) >= 2
        bos = httpx.post(url + "/tokenize", json={"content": "Hi there", "add_special": True}, headers=key).json()
        assert bos["tokens"][1:] == tok.json()["tokens"]
        det = httpx.post(url + "/detokenize", json={"tokens": tok.json()["tokens"]}, headers=key, timeout=60)
        if det.status_code == 200:  # a GGUF served one at a time runs on a one-slot engine: its detokenizer
            assert det.json() == {"content": "Hi there"}
        else:  # a worker without an engine says what it needs
            assert det.status_code == 400 and "--parallel" in det.json()["error"]["message"]
        slots = httpx.get(url + "/slots", headers=key, timeout=10).json()
        assert [s["id"] for s in slots] == [0] and slots[0]["n_ctx"] > 0
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
