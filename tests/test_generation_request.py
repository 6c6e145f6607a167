# SPDX-License-Identifier: Apache-2.0
"""GenerationRequest: validated once, every bad value one InputError naming the field; the same rule
set as the llama.cpp backends (the GGUF and VLM backends both build GenerationRequests)."""

from __future__ import annotations

import math

import pytest

from edgesdk.errors import InputError
from edgesdk.runtime.requests import DEFAULT_SAMPLING, ChatMessage, GenerationRequest, check_sampling

BIG = 10**400  # float(BIG) overflows: must be an InputError, never an OverflowError


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"max_tokens": -5}, "max_tokens must be >= 1"),
        ({"max_tokens": 2.5}, "max_tokens must be an integer"),
        ({"max_tokens": True}, "max_tokens must be an integer"),
        ({"max_tokens": "8"}, "max_tokens must be an integer"),
        ({"max_tokens": BIG}, "max_tokens must be <= 2147483647"),
        ({"max_tokens": float("inf")}, "max_tokens must be finite"),
        ({"temperature": -1}, "temperature must be >= 0"),
        ({"temperature": float("nan")}, "temperature must be finite"),
        ({"temperature": BIG}, "temperature must be finite"),
        ({"temperature": "0.5"}, "temperature must be a number"),
        ({"temperature": False}, "temperature must be a number"),
        ({"top_p": 0}, "top_p must be > 0"),
        ({"top_p": 1.5}, "top_p must be <= 1"),
        ({"top_p": float("-inf")}, "top_p must be finite"),
        ({"min_p": -0.1}, "min_p must be >= 0"),
        ({"min_p": 2}, "min_p must be <= 1"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"top_k": 1.5}, "top_k must be an integer"),
        ({"top_k": BIG}, "top_k must be <= 2147483647"),
        ({"repeat_penalty": 0}, "repeat_penalty must be > 0"),
        ({"repeat_penalty": math.nan}, "repeat_penalty must be finite"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"seed": 0xFFFFFFFF}, "seed must be <= 4294967294"),
        ({"seed": True}, "seed must be an integer"),
        ({"stop": 5}, "stop must be a string or a list of strings"),
        ({"stop": ["a", 1]}, "stop must be a string or a list of strings"),
        ({"stop": ["x"] * 17}, "stop must hold at most 16"),
        ({"n": 2}, "n must be 1"),
        ({"n": 0}, "n must be 1"),
        ({"n": True}, "n must be 1"),
        ({"stream": "yes"}, "stream must be true or false"),
    ],
)
def test_bad_values_are_one_line_input_errors_naming_the_field(kwargs, message):
    with pytest.raises(InputError, match=message) as err:
        GenerationRequest(prompt="hi", **kwargs)
    line = err.value.one_line()
    assert "\n" not in line and len(line) < 160, line  # BIG is not echoed whole


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one of prompt, prompt_tokens or messages"),
        ({"prompt": "a", "prompt_tokens": [1]}, r"exactly one of .* \(got prompt, prompt_tokens\)"),
        ({"prompt": b"hi"}, "prompt must be a string"),
        ({"prompt_tokens": []}, "prompt_tokens must be a non-empty list"),
        ({"prompt_tokens": "12"}, "prompt_tokens must be a non-empty list"),
        ({"prompt_tokens": [2, -1]}, r"prompt_tokens\[1\] must be >= 0"),
        ({"prompt_tokens": [2, 1.5]}, r"prompt_tokens\[1\] must be an integer"),
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": "hi"}, "messages must be a non-empty list"),
        ({"messages": [{"role": "", "content": "x"}]}, r"messages\[0\].role must be a non-empty string"),
        ({"messages": [{"role": "user", "content": 3}]}, r"messages\[0\].content must be a string"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            r"messages\[0\].content\[0\]: only text parts",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
            r"messages\[0\].content\[0\].text must be a string",
        ),
        ({"messages": ["hi"]}, r"messages\[0\] must be a mapping"),
    ],
)
def test_bad_inputs_are_input_errors(kwargs, message):
    with pytest.raises(InputError, match=message):
        GenerationRequest(**kwargs)


def test_defaults_and_normalisation():
    r = GenerationRequest(prompt="hi")
    assert (r.temperature, r.top_k, r.top_p, r.min_p, r.repeat_penalty) == tuple(
        DEFAULT_SAMPLING[k] for k in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")
    )
    assert r.max_tokens == 128 and r.stop == () and r.seed is None and not r.stream and not r.greedy
    r = GenerationRequest(prompt="hi", max_tokens=4.0, top_k=3.0, temperature=0, stop="END", seed=7)
    assert r.max_tokens == 4 and isinstance(r.max_tokens, int) and r.top_k == 3 and isinstance(r.top_k, int)
    assert r.greedy and r.stop == ("END",) and r.seed == 7
    assert GenerationRequest(prompt="hi", stop=["a", "", "b"]).stop == ("a", "b")  # empty strings never match
    assert GenerationRequest(prompt_tokens=[2, 3]).prompt_tokens == (2, 3)
    r = GenerationRequest(
        messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    )
    assert r.messages == (ChatMessage("user", "ab"),)
    with pytest.raises(AttributeError):
        r.max_tokens = 5  # type: ignore[misc]  # frozen: validated once, never changed after


def test_from_options_takes_session_generate_keywords():
    r = GenerationRequest.from_options(prompt="hi", temp=0, top_k=None, max_tokens=8, stop=["\n"])
    assert r.temperature == 0 and r.top_k == 40 and r.max_tokens == 8 and r.stop == ("\n",)
    with pytest.raises(InputError, match="unknown generation option.*nucleus"):
        GenerationRequest.from_options(prompt="hi", nucleus=0.9)
    with pytest.raises(InputError, match="n must be 1"):
        GenerationRequest.from_options(prompt="hi", n=3)


def test_the_backends_use_the_same_rules():
    """The GGUF and VLM backends both build a GenerationRequest (their requests run in the same engine): the VLM
    backend keeps no sampling checks of its own."""
    pytest.importorskip("llama_cpp")
    import edgesdk.runtime.backends.vlm.backend as vlm

    assert not hasattr(vlm, "_check_sampling") and not hasattr(vlm, "sampling_options")
    params = dict(DEFAULT_SAMPLING)
    for bad in ({"temperature": BIG}, {"top_k": BIG}, {"top_p": math.nan}):
        with pytest.raises(InputError):
            check_sampling(8, None, {**params, **bad})
    with pytest.raises(InputError, match="max_tokens must be <= 2147483647"):
        check_sampling(BIG, None, params)  # was an OverflowError before the rules were shared
    assert check_sampling(8.0, 3, params) == (8, 3)


def _tool(name: object) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "names, message",
    [
        (["{{ 7*7 }}"], r"tools\[0\].function.name '\{\{ 7\*7 \}\}' must match \^\[a-zA-Z0-9_-\]\{1,64\}\$"),
        (["get\u200bweather"], r"tools\[0\].function.name 'get\\u200bweather' must match"),
        (["ok", "a" * 65], r"tools\[1\].function.name 'a{30}'\.\.\. \(65 characters\) must match"),
        (["../../etc/passwd"], r"tools\[0\].function.name '\.\./\.\./etc/passwd' must match"),
        (["a b"], r"tools\[0\].function.name 'a b' must match"),
        (["f\n"], r"tools\[0\].function.name 'f\\n' must match"),  # $ alone would let the newline through
        (["get_weather", "add", "get_weather"], r"tools\[2\].function.name 'get_weather' repeats tools\[0\]'s"),
    ],
)
def test_tool_names_are_unique_and_openai_shaped(names, message):
    """Issue 34 item 9: a tool name is ^[a-zA-Z0-9_-]{1,64}$ and unique, as OpenAI requires; the message is one
    line naming the tool's index and the rule, and never echoes control or invisible characters raw."""
    from edgesdk.serve.config import ModelEntry
    from edgesdk.serve.protocol import APIError, parse
    from edgesdk.serve.schemas import ChatCompletionRequest

    tools = [_tool(n) for n in names]
    with pytest.raises(InputError, match=message) as exc:
        GenerationRequest(messages=[{"role": "user", "content": "hi"}], tools=tools)
    assert "\n" not in str(exc.value) and "\u200b" not in str(exc.value)
    entry = ModelEntry(name="m", session=None, kind="llm", max_tokens_cap=2048, default_max_tokens=256)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    with pytest.raises(APIError) as api:
        parse(ChatCompletionRequest, body).to_generation_request(entry)
    assert (api.value.status, api.value.param) == (400, "tools") and str(exc.value) in api.value.message


def test_tool_names_openai_accepts_still_pass():
    names = ["get_weather", "A-b_9", "x", "z" * 64]
    r = GenerationRequest(messages=[{"role": "user", "content": "hi"}], tools=[_tool(n) for n in names])
    assert [t["function"]["name"] for t in r.tools] == names
