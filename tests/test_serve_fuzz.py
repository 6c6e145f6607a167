# SPDX-License-Identifier: Apache-2.0
"""Hypothesis fuzzing of `edgesdk serve`'s request parser (issue 25, finding 7): whatever the body, the
parser answers an APIError 400 naming the problem or accepts it, never another exception (which the
server turned into a 500); and what it accepts, the runtime accepts too (no later error from the model).

Bodies follow the OpenAI request schema (chat/completions, completions, embeddings) with every field
either valid or junk: any JSON value, huge and non-finite numbers, lone surrogates, deep nesting. No model
is loaded: tests/test_serve.py sends the same kinds of bodies to a real server.

``EDGESDK_FUZZ_EXAMPLES=20000 pytest tests/test_serve_fuzz.py`` for a long run."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("starlette")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgesdk.runtime.requests import GenerationRequest  # noqa: E402
from edgesdk.serve.config import ModelEntry  # noqa: E402
from edgesdk.serve.protocol import APIError, decode_json, parse  # noqa: E402
from edgesdk.serve.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest  # noqa: E402

EXAMPLES = int(os.environ.get("EDGESDK_FUZZ_EXAMPLES", "300"))
ENTRY = ModelEntry(name="m", session=None, kind="llm", max_tokens_cap=2048, default_max_tokens=256)


def parse_generation(body: dict, chat: bool) -> tuple:
    """A chat or completions body as the route reads it: (options, stream, include_usage, inputs)."""
    req = parse(ChatCompletionRequest if chat else CompletionRequest, body)
    return req.options(ENTRY), req.streaming, req.include_usage, req.inputs(ENTRY)


def parse_embeddings(body: dict) -> tuple:
    req = parse(EmbeddingRequest, body)
    return req.inputs, req.encoding_format or "float", req.dimensions


_text = st.text(max_size=12) | st.sampled_from(["\ud800", "a\udfffb", "\x00", "é", "😀", ""])
_number = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([10**400, -(10**400), 2**32, 2**31, 0xFFFFFFFE, 0xFFFFFFFF, 0, 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, 2.0, 1e-300, 1e308]),
)
_scalar = st.none() | st.booleans() | _number | _text
_json = st.recursive(
    _scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3), max_leaves=8
)


def _field(valid: st.SearchStrategy) -> st.SearchStrategy:
    """A field's value: valid, junk of any JSON shape, or absent (``...``)."""
    return st.one_of(valid, _json, st.just(...))


_message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["system", "user", "assistant"]) | _json,
        "content": _text
        | st.lists(st.fixed_dictionaries({"type": st.just("text") | _json, "text": _text | _json}), max_size=2)
        | _json,
    },
)
_COMMON = {
    "model": _field(st.just("m")),
    "max_tokens": _field(st.integers(1, 4096)),
    "max_completion_tokens": _field(st.integers(1, 4096)),
    "temperature": _field(st.floats(0, 2)),
    "top_p": _field(st.floats(0, 1)),
    "seed": _field(st.integers(-5, 2**33)),
    "n": _field(st.just(1)),
    "stop": _field(_text | st.lists(_text, max_size=17)),
    "stream": _field(st.booleans()),
    "stream_options": _field(st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | _json})),
    "frequency_penalty": _field(st.floats(-2, 2)),
    "presence_penalty": _field(st.floats(-2, 2)),
    "top_k": _field(st.integers(0, 100)),
    "min_p": _field(st.floats(0, 1)),
    "repeat_penalty": _field(st.floats(0.5, 2)),
    "logit_bias": _field(st.dictionaries(st.integers(0, 1000).map(str), st.floats(-100, 100), max_size=3)),
}
_chat = st.fixed_dictionaries({**_COMMON, "messages": _field(st.lists(_message, min_size=1, max_size=3))})
_completion = st.fixed_dictionaries(
    {**_COMMON, "prompt": _field(_text | st.lists(_text, max_size=2)), "echo": _field(st.booleans())}
)
_embedding = st.fixed_dictionaries(
    {
        "model": _field(st.just("m")),
        "input": _field(_text | st.lists(_text, max_size=4)),
        "encoding_format": _field(st.sampled_from(["float", "base64"])),
        "dimensions": _field(st.integers(-1, 500)),
    }
)


def _wire(body: dict) -> bytes:
    """The body as a client would send it (absent fields left out; lone surrogates as \\u escapes)."""
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode("ascii")


def _decoded(raw: bytes) -> dict | None:
    try:
        return decode_json(raw)
    except APIError as exc:
        assert exc.status == 400 and exc.message, exc.message
        return None


def _refused(call) -> bool:
    try:
        call()
    except APIError as exc:
        assert exc.status == 400 and exc.message and exc.response().body  # the answer encodes (no surrogates)
        return True
    return False


@settings(max_examples=EXAMPLES, deadline=None)
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_bytes_decode_or_400(raw):
    _decoded(raw)


@settings(max_examples=max(EXAMPLES // 10, 10), deadline=None)
@given(depth=st.integers(1, 200_000), opener=st.sampled_from(["[", '{"a":']))
def test_deep_nesting_is_400_not_recursion_error(depth, opener):
    closer = "]" if opener == "[" else "}"
    raw = (opener * depth + "1" + closer * depth).encode()
    data = _decoded(raw)
    assert data is None or opener != "["  # a top-level list is never a request


@settings(max_examples=EXAMPLES, deadline=None)
@given(body=_chat | _completion, chat=st.booleans())
def test_generation_body_parses_or_400_and_the_runtime_agrees(body, chat):
    data = _decoded(_wire(body))
    if data is None:
        return
    parsed = []
    if _refused(lambda: parsed.append(parse_generation(data, chat))):
        return
    opts, stream, include_usage, inputs = parsed[0]
    assert isinstance(stream, bool) and isinstance(include_usage, bool)
    # What the server accepts, the runtime accepts: no error comes back from the model later.
    for what in inputs:  # a chat's messages; text or token ids of each prompt
        if chat:
            GenerationRequest.from_options(messages=what, **opts)
        else:
            GenerationRequest.from_options(
                **({"prompt": what} if isinstance(what, str) else {"prompt_tokens": what}), **opts
            )


@settings(max_examples=EXAMPLES, deadline=None)
@given(body=_embedding)
def test_embeddings_body_parses_or_400(body):
    data = _decoded(_wire(body))
    if data is None:
        return
    parsed = []
    if _refused(lambda: parsed.append(parse_embeddings(data))):
        return
    inputs, fmt, dims = parsed[0]
    texts = [t for t in inputs if isinstance(t, str)]
    ids = [t for t in inputs if not isinstance(t, str)]
    assert inputs and (not texts or not ids) and fmt in ("float", "base64")  # texts or token ids, never a mix
    assert all(t for t in texts) and all(t.encode("utf-8") for t in texts)  # no lone surrogate reaches the tokenizer
    assert all(row and all(type(i) is int and 0 <= i <= 2**31 - 1 for i in row) for row in ids)
    assert dims is None or (isinstance(dims, int) and dims >= 1)


@pytest.mark.parametrize(
    "raw,says",
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"model": "m", "prompt": "x", "stream": true, "stream_options": "yes"}', "stream_options"),
        (b'{"model": "m", "prompt": "x", "seed": ' + b"9" * 4000 + b"}", "seed"),
        (b'{"model": "m", "prompt": "x", "seed": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b'{"model": "m", "prompt": "x", "max_tokens": 1e400}', "max_tokens"),
        (b'{"model": "m", "prompt": "x", "temperature": ' + b"1" + b"0" * 400 + b"}", "temperature"),
        (b'{"model": "m", "input": "\\ud800"}', "surrogate"),
        (b'{"model": "m", "prompt": "x", "top_p": 0}', "top_p"),
    ],
)
def test_the_issue_cases_are_400(raw, says):
    with pytest.raises(APIError) as info:
        body = decode_json(raw)
        parse_generation(body, chat=False) if "prompt" in body else parse_embeddings(body)
    assert info.value.status == 400 and says in info.value.message + str(info.value.param)
    assert len(info.value.message) < 400  # a 4000-digit number is not echoed whole
