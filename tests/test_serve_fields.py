# SPDX-License-Identifier: Apache-2.0
"""Every chat/completions request field is implemented or a 400 naming it (issue 23), on a real
``edgesdk serve`` of the Gemma-3-270M GGUF, driven by the real ``openai`` client, through both engines:
continuous batching (``--parallel 2``) and one request at a time (``--parallel 1``, one slot of the same
BatchEngine).

Penalties, ``top_k``/``min_p`` and ``logit_bias`` change greedy output as they should; token-id prompts
give the same completion as their text; refused and unknown fields answer 400 with ``param``; docs/serve.md
holds the field tables generated from ``REQUEST_FIELDS``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytest.importorskip("starlette")

from test_serve import ServerProcess  # noqa: E402  (gemma_chat_bundle: tests/conftest.py, once per session)

from edgesdk.serve.fields import REQUEST_FIELDS, fields_markdown  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs" / "serve.md"
PROMPT = "one two three one two three one two three one two three"


def test_docs_field_tables_are_the_code_table():
    text = DOCS.read_text()
    assert fields_markdown() in text, "docs/serve.md's request-field tables differ from fields_markdown()"
    for route, fields in REQUEST_FIELDS.items():  # no field twice, and every refused one explains itself
        names = [f.name for f in fields]
        assert len(names) == len(set(names)), route
        assert all(f.note for f in fields)


def test_generation_request_penalties_and_logit_bias():
    from edgesdk.errors import InputError
    from edgesdk.runtime.requests import GenerationRequest

    r = GenerationRequest.from_options(prompt="x", temperature=0, logit_bias={"7": 5, 3: -100})
    assert r.logit_bias == ((3, -100.0), (7, 5.0)) and not r.plain_greedy
    assert GenerationRequest(prompt="x", temperature=0).plain_greedy
    assert not GenerationRequest(prompt="x", temperature=0, presence_penalty=0.5).plain_greedy
    for bad, says in (
        ({"frequency_penalty": 2.5}, "frequency_penalty must be <= 2"),
        ({"presence_penalty": -3}, "presence_penalty must be >= -2"),
        ({"logit_bias": {"a": 1}}, "logit_bias keys must be token ids"),
        ({"logit_bias": {"1": 101}}, "logit_bias\\[1\\] must be <= 100"),
    ):
        with pytest.raises(InputError, match=says):
            GenerationRequest.from_options(prompt="x", **bad)


# ------------------------------------------------------------------------------ against a real server
@pytest.fixture(scope="module", params=["2", "1"], ids=["batched", "one-at-a-time"])
def served(request, gemma_chat_bundle, tmp_path_factory):
    srv = ServerProcess(
        [gemma_chat_bundle, "--name", "gemma", "--parallel", request.param], tmp_path_factory.mktemp("serve-fields")
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def vocab(gemma_chat_bundle):
    """The bundle's GGUF with its vocabulary only (tokenize / detokenize in the test)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    gguf = next(Path(gemma_chat_bundle).rglob("*.gguf"))
    return llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)


def _client(srv):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _complete(c, **kw) -> str:
    kw = {"model": "gemma", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, **kw}
    return c.completions.create(**kw).choices[0].text


def _error(srv, path: str, body: dict) -> dict:
    r = httpx.post(srv.url + path, json={"model": "gemma", **body}, timeout=60)
    assert r.status_code == 400, r.text
    return r.json()["error"]


@pytest.mark.slow
def test_sampling_fields_change_greedy_output(served, vocab):
    c = _client(served)
    base = _complete(c)
    assert base.strip()
    # penalties move a greedy continuation off its repetition; top_k=1 / min_p=1 leave only the top token
    assert _complete(c, frequency_penalty=2.0) != base
    assert _complete(c, presence_penalty=2.0, extra_body={"repeat_penalty": 1.5}) != base
    assert _complete(c, temperature=1.5, seed=7, extra_body={"top_k": 1}) == base
    assert _complete(c, temperature=1.5, seed=7, extra_body={"min_p": 1.0}) == base
    # logit_bias +100 on one token: greedy picks it every time (through the chat route too)
    tok = vocab.tokenize(b" banana", add_bos=False)[0]
    piece = vocab.detokenize([tok]).decode("utf-8")
    assert _complete(c, max_tokens=3, logit_bias={str(tok): 100}) == piece * 3
    chat = c.chat.completions.create(
        model="gemma",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        temperature=0,
        logit_bias={str(tok): 100},
    )
    assert chat.choices[0].message.content == piece * 2
    # neutral values of refused fields are accepted
    ok = c.chat.completions.create(
        model="gemma",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=1,
        response_format={"type": "text"},
        logprobs=False,
        tool_choice="none",
    )
    assert ok.choices[0].finish_reason in ("stop", "length")


@pytest.mark.slow
def test_token_prompts_and_prompt_errors(served, vocab):
    c = _client(served)
    ids = vocab.tokenize(PROMPT.encode("utf-8"), add_bos=True)
    text = _complete(c, max_tokens=6)
    assert _complete(c, prompt=ids, max_tokens=6) == text
    assert _complete(c, prompt=[ids], max_tokens=6) == text
    err = _error(served, "/v1/completions", {"prompt": ["a"] * 17})
    assert err["param"] == "prompt" and "17 prompts" in err["message"]
    err = _error(served, "/v1/completions", {"prompt": [10**7]})  # beyond the vocabulary
    assert err["param"] == "prompt"
    err = _error(served, "/v1/completions", {"prompt": "word " * 5000})
    assert (err["param"], err["code"]) == ("prompt", "context_length_exceeded")
    err = _error(served, "/v1/completions", {"prompt": "x", "logit_bias": {str(10**7): 1}})
    assert err["param"] == "logit_bias"


REFUSED = [
    ("/v1/chat/completions", "response_format", {"type": "yaml"}),
    ("/v1/chat/completions", "tools", [{"type": "function", "function": {"parameters": {}}}]),  # no name
    ("/v1/chat/completions", "tool_choice", "auto"),  # no tools
    ("/v1/chat/completions", "logprobs", "yes"),
    ("/v1/chat/completions", "top_logprobs", 2),  # without logprobs: true
    ("/v1/chat/completions", "mirostat", 2),  # not OpenAI's, not implemented: unknown
    ("/v1/chat/completions", "frequency_penalty", 2.5),
    ("/v1/chat/completions", "logit_bias", {"1": 101}),
    ("/v1/chat/completions", "top_k", -1),
    ("/v1/completions", "echo", True),
    ("/v1/completions", "best_of", 2),
    ("/v1/completions", "suffix", "end"),
    ("/v1/completions", "logprobs", 21),
    ("/v1/completions", "messages", [{"role": "user", "content": "Hi"}]),
]


@pytest.mark.slow
def test_refused_and_unknown_fields_name_the_param(served):
    if served.args[-1] != "2":
        pytest.skip("parsing is the same for both engines: checked once")
    for path, key, value in REFUSED:
        body = {key: value}
        if key != "messages":
            body.update({"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "x"})
        else:
            body["prompt"] = "x"
        err = _error(served, path, body)
        assert err["param"] == key, (path, key, err)
    err = _error(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi", "name": "ann"}]})
    assert err["param"] == "messages[0].name"
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError) as exc:
        _client(served).chat.completions.create(
            model="gemma",
            messages=[{"role": "user", "content": "Hi"}],
            response_format={"type": "json_schema", "json_schema": {}},
        )
    assert exc.value.body["param"] == "response_format"


@pytest.mark.slow
def test_grammar_tools_and_logprobs_work_at_one_slot(served):
    """``--parallel 1`` is one slot of the same engine: grammars, tools and log-probabilities work there too (they
    were 400 while one request at a time had a decode loop of its own)."""
    import json

    if served.args[-1] != "1":
        pytest.skip("the batched engine's fields: tests/test_serve_structured.py")
    hi = [{"role": "user", "content": "Hi"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for path, body in (
        ("/v1/chat/completions", {"messages": hi, "response_format": {"type": "json_object"}}),
        ("/v1/chat/completions", {"messages": hi, "tools": [tool]}),
        ("/v1/chat/completions", {"messages": hi, "logprobs": True, "top_logprobs": 2}),
        ("/v1/completions", {"prompt": "x", "logprobs": 1}),
    ):
        r = httpx.post(
            served.url + path, json={"model": "gemma", "max_tokens": 8, "temperature": 0, **body}, timeout=120
        )
        assert r.status_code == 200, (path, body, r.text)
        choice = r.json()["choices"][0]
        if "response_format" in body and choice["finish_reason"] == "stop":
            json.loads(choice["message"]["content"])
        if "logprobs" in body:
            assert choice["logprobs"], (path, choice)
