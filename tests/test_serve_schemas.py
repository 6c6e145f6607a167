# SPDX-License-Identifier: Apache-2.0
"""The request models of ``edgesdk serve`` (edgesdk/serve/schemas.py, issue 39 item 12): a body is parsed once into
one class whose ``to_generation_request()`` is the runtime's GenerationRequest (as vLLM's ``to_sampling_params()``);
pydantic's errors reach the client as one line naming the field, never pydantic's own text; the OpenAPI document
is the models' JSON Schema. No model is loaded."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")

from edgesdk.runtime.requests import DEFAULT_SAMPLING, GenerationRequest  # noqa: E402
from edgesdk.serve.config import ModelEntry  # noqa: E402
from edgesdk.serve.fields import MODELS, REQUEST_FIELDS  # noqa: E402
from edgesdk.serve.openapi import schemas  # noqa: E402
from edgesdk.serve.protocol import APIError, parse  # noqa: E402
from edgesdk.serve.schemas import (  # noqa: E402
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ResponsesRequest,
    TokenizeRequest,
)

ENTRY = ModelEntry(name="m", session=None, kind="llm", max_tokens_cap=100, default_max_tokens=16)
HI = [{"role": "user", "content": "hi"}]


def _chat(**kw) -> ChatCompletionRequest:
    return parse(ChatCompletionRequest, {"model": "m", "messages": HI, **kw})


def test_chat_to_generation_request_carries_every_option():
    req = _chat(
        max_tokens=50,
        temperature=0,
        top_p=0.5,
        top_k=3,
        min_p=0.1,
        repeat_penalty=1.1,
        frequency_penalty=0.5,
        presence_penalty=-0.5,
        seed=7,
        stop="\n",
        logit_bias={"42": -100},
        stream=True,
        stream_options={"include_usage": True},
        metadata={"a": "b"},  # ignored: no effect on the request
    )
    gen = req.to_generation_request(ENTRY)
    assert isinstance(gen, GenerationRequest)
    assert (gen.max_tokens, gen.temperature, gen.top_p, gen.top_k, gen.min_p, gen.seed) == (50, 0.0, 0.5, 3, 0.1, 7)
    assert (gen.repeat_penalty, gen.frequency_penalty, gen.presence_penalty) == (1.1, 0.5, -0.5)
    assert gen.stop == ("\n",) and gen.logit_bias == ((42, -100.0),) and gen.stream
    assert gen.messages is not None and gen.messages[0].content == "hi"
    assert req.streaming and req.include_usage


def test_defaults_and_the_models_cap():
    gen = _chat().to_generation_request(ENTRY)
    assert gen.max_tokens == ENTRY.default_max_tokens and gen.temperature == DEFAULT_SAMPLING["temperature"]
    assert not gen.stream and gen.grammar is None and gen.logprobs is None
    assert _chat(max_tokens=5, max_completion_tokens=9).to_generation_request(ENTRY).max_tokens == 9  # it wins
    with pytest.raises(APIError) as err:
        _chat(max_completion_tokens=101).to_generation_request(ENTRY)
    assert err.value.param == "max_completion_tokens" and "at most 100" in err.value.message


def test_developer_role_tools_and_logprobs():
    pytest.importorskip("llama_cpp")  # the tools' grammar comes from llama.cpp's JSON-schema converter
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    req = _chat(messages=[{"role": "developer", "content": "be brief"}, *HI], tools=[tool], logprobs=True)
    gen = req.to_generation_request(ENTRY)
    assert gen.messages is not None and gen.messages[0].role == "system"
    assert gen.tool_choice == "auto" and gen.tools[0]["function"]["name"] == "f" and gen.logprobs == 0
    assert gen.grammar  # a call or text, constrained


def test_completions_prompts_each_become_a_request():
    req = parse(CompletionRequest, {"model": "m", "prompt": ["a", [5, 6]], "logprobs": 2, "max_tokens": 3})
    assert req.inputs(ENTRY) == ["a", [5, 6]]
    text, ids = (req.to_generation_request(ENTRY, x) for x in req.inputs(ENTRY))
    assert text.prompt == "a" and ids.prompt_tokens == (5, 6) and ids.logprobs == 2 and ids.max_tokens == 3
    one = parse(CompletionRequest, {"model": "m", "prompt": [[1, 2]]})
    assert one.inputs() == [[1, 2]] and one.to_generation_request(ENTRY).prompt_tokens == (1, 2)


def test_responses_to_generation_request():
    body = {
        "model": "m",
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ],
        "max_output_tokens": 20,
        "temperature": 0,
        "text": {"format": {"type": "text"}, "verbosity": "low"},
    }
    gen = parse(ResponsesRequest, body).to_generation_request(ENTRY)
    assert gen.max_tokens == 20 and gen.temperature == 0
    assert [m.role for m in gen.messages or ()] == ["system", "user", "assistant", "tool"]
    with pytest.raises(APIError) as err:  # the chat field's error names the Responses field
        parse(ResponsesRequest, {**body, "max_output_tokens": 101}).to_generation_request(ENTRY)
    assert err.value.param == "max_output_tokens"


@pytest.mark.parametrize(
    "model,body,param,says",
    [
        (ChatCompletionRequest, {"temperature": "1"}, "temperature", "'temperature' must be a number, got '1'"),
        (ChatCompletionRequest, {"temperature": 3, "top_p": 7}, "temperature", "'temperature' must be <= 2"),
        (ChatCompletionRequest, {"seed": True}, "seed", "'seed' must be an integer, got True"),
        (ChatCompletionRequest, {"n": 2}, "n", "'n' must be 1 (one choice per request)"),
        (ChatCompletionRequest, {"messages": []}, "messages", "'messages' must not be empty"),
        (ChatCompletionRequest, {"messages": [{"content": "x"}]}, "messages[0].role", "'messages[0].role' is required"),
        (ChatCompletionRequest, {"stop": [1]}, "stop", "'stop' must be a string or a list of at most 16 strings"),
        (ChatCompletionRequest, {"verbosity": "loud"}, "verbosity", "'verbosity' must be 'low', 'medium' or 'high'"),
        (ChatCompletionRequest, {"stream_options": {"x": 1}}, "stream_options.x", "not a field this server knows"),
        (ChatCompletionRequest, {"zz": 1, "temperature": 9}, "zz", "unknown field 'zz'"),  # the unknown one first
        (ChatCompletionRequest, {"store": True}, "store", "accepted: null or false"),
        (CompletionRequest, {"prompt": ["a"] * 17}, "prompt", "'prompt' holds 17 prompts"),
        (CompletionRequest, {"prompt": [2**31]}, "prompt", "token ids must be from 0 to 2147483647"),
        (EmbeddingRequest, {"input": ["a", [1]]}, "input", "not a mix or other values"),
        (ResponsesRequest, {"input": "x", "reasoning": {"effort": 1}}, "reasoning", "'reasoning' must be an object"),
        (TokenizeRequest, {"content": "x", "add_special": 1}, "add_special", "'add_special' must be a boolean"),
    ],
)
def test_pydantic_errors_are_one_line_naming_the_field(model, body, param, says):
    full = {"model": "m", **({"messages": HI} if model is ChatCompletionRequest else {}), **body}
    if model is CompletionRequest:
        full.setdefault("prompt", "x")
    if model is EmbeddingRequest:
        full.setdefault("input", "x")
    if model is TokenizeRequest:
        del full["model"]
    with pytest.raises(APIError) as err:
        parse(model, full)
    e = err.value
    assert (e.status, e.param) == (400, param) and says in e.message, e.message
    assert "\n" not in e.message and "Input should" not in e.message and "pydantic" not in e.message
    assert set(json.loads(e.response().body)["error"]) == {"message", "type", "param", "code"}


def test_the_schema_is_the_models():
    defs = schemas(MODELS.values())
    for route, model in MODELS.items():
        body = defs[model.__name__]
        assert set(body["properties"]) == {f.name for f in REQUEST_FIELDS[route]}
        assert body["additionalProperties"] is False and set(body["required"]) >= {"model"}
        for f in REQUEST_FIELDS[route]:
            prop = body["properties"][f.name]
            assert prop["x-edgesdk-status"] == f.status and prop["description"].endswith(f.note)
            if f.status == "refused":  # null or the neutral value only
                assert prop.get("enum") == [None, *f.neutral] if f.neutral else prop["type"] == "null"
    # what the schema accepts, the model accepts, and the other way round
    doc = {"components": {"schemas": defs}, "$schema": "https://json-schema.org/draft/2020-12/schema"}
    for model, body in (
        (ChatCompletionRequest, {"model": "m", "messages": HI, "stop": ["a"], "tool_choice": "none"}),
        (ChatCompletionRequest, {"model": "m", "messages": HI, "metadata": {"k": "v" * 513}}),
        (ChatCompletionRequest, {"model": "m", "messages": HI, "functions": []}),
        (ChatCompletionRequest, {"model": "m", "messages": HI, "functions": [{}]}),
        (CompletionRequest, {"model": "m", "prompt": ["a", [1, 2]]}),
        (CompletionRequest, {"model": "m", "prompt": [-1]}),
        (EmbeddingRequest, {"model": "m", "input": [[1], [2]], "dimensions": 0}),
        (ResponsesRequest, {"model": "m", "input": "hi", "text": {"format": {"type": "json_object"}}}),
        (ResponsesRequest, {"model": "m", "input": "hi", "background": True}),
    ):
        schema = {**doc, "$ref": f"#/components/schemas/{model.__name__}"}
        valid = not list(jsonschema.Draft202012Validator(schema).iter_errors(body))
        try:
            parse(model, body)
            parsed = True
        except APIError:
            parsed = False
        assert valid == parsed, (model.__name__, body)
