# SPDX-License-Identifier: Apache-2.0
"""The request fields ``edgesdk serve`` knows (:data:`REQUEST_FIELDS`): each one implemented, or refused with a
400 naming it. The one table behind the request checks (:func:`edgesdk.serve.protocol.check_fields`), the
OpenAPI document (:mod:`edgesdk.serve.openapi`) and docs/serve.md's field tables (:func:`fields_markdown`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edgesdk.runtime.requests import MAX_TOP_LOGPROBS, SEED_MAX

MAX_EMBEDDING_INPUTS = 2048  # inputs per embeddings request (as OpenAI)
MAX_STOP_SEQUENCES = 16
MAX_PROMPTS = 16  # prompts in one /v1/completions request (one choice each)


@dataclass(frozen=True)
class RequestField:
    """One field of a generation request body: ``implemented``; ``ignored`` (accepted, its type checked, with no
    effect here: it cannot change the reply, e.g. ``metadata`` or ``prompt_cache_key``); or ``refused`` (400
    naming it) unless its value is one of ``neutral`` (the value that asks for nothing: ``logprobs: false``)."""

    name: str
    status: str  # "implemented" | "ignored" | "refused"
    note: str
    neutral: tuple = ()
    extra: bool = False  # not in OpenAI's schema: a llama.cpp server field


def _f(name: str, note: str, *, extra: bool = False) -> RequestField:
    return RequestField(name, "implemented", note, extra=extra)


def _i(name: str, note: str) -> RequestField:
    return RequestField(name, "ignored", note)


#: The values an ignored field may take (anything else is a 400 naming it): OpenAI's own enums.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
VERBOSITIES = ("low", "medium", "high")
PROMPT_CACHE_RETENTIONS = ("in_memory", "24h")
MAX_METADATA = 16  # key-value pairs; keys up to 64 characters, values up to 512 (OpenAI's limits)


def _r(name: str, note: str, *neutral: Any) -> RequestField:
    return RequestField(name, "refused", note, tuple(neutral))


_COMMON = (
    _f("model", "a served model name (GET /v1/models)"),
    _f("max_tokens", "1 to the model's cap (default 256; cap 2048 or the context, whichever is smaller)"),
    _f("temperature", "0 to 2; 0 is greedy"),
    _f("top_p", "above 0, at most 1"),
    _f("seed", f"0 to {SEED_MAX}"),
    _f("stop", f"a string or a list of at most {MAX_STOP_SEQUENCES} strings"),
    _f("stream", "Server-Sent Events"),
    _f(
        "stream_options",
        "`include_usage`; `include_obfuscation` is accepted and ignored (no `obfuscation` field is sent: "
        "the stream is not padded)",
    ),
    _f("frequency_penalty", "-2 to 2 (llama.cpp penalties sampler, last 64 generated tokens)"),
    _f("presence_penalty", "-2 to 2 (llama.cpp penalties sampler, last 64 generated tokens)"),
    _f("logit_bias", "token id -> bias, -100 to 100 (llama.cpp logit-bias sampler)"),
    _f("n", "1 only (one choice per request); other values 400"),
    _f("user", "an end-user id (a string); it does not change the output"),
    _f("top_k", "llama.cpp extra: 0 (off) or more", extra=True),
    _f("min_p", "llama.cpp extra: 0 to 1", extra=True),
    _f("repeat_penalty", "llama.cpp extra: above 0 (1 is off)", extra=True),
)

#: Every field a generation route knows: OpenAI's chat.completions / completions request fields and the
#: llama.cpp server extras implemented here. Any other field is a 400 naming it; a refused field is a
#: 400 naming it unless its value is null or neutral. docs/serve.md's field table is generated from this.
REQUEST_FIELDS: dict[str, tuple[RequestField, ...]] = {
    "/v1/chat/completions": (
        _f(
            "messages",
            "role and text content (a string or text parts; `image_url` parts for VLM bundles: data "
            "URLs, see Images); the `developer` role is a `system` turn, as OpenAI maps it for models "
            "without one; assistant `tool_calls`, tool `tool_call_id` and `name`; any other "
            "message field (audio, ...): 400 naming it",
        ),
        *_COMMON,
        _f("max_completion_tokens", "as max_tokens (wins when both are given)"),
        _f(
            "response_format",
            "`text`, `json_object`, `json_schema` (`json_schema.schema`): a llama.cpp grammar "
            "from the schema constrains every token (continuous batching only)",
        ),
        _f(
            "tools",
            "function tools: rendered by the chat template (or a system turn when it ignores tools); "
            "the reply is grammar-constrained to a call (continuous batching only)",
        ),
        _f("tool_choice", "`none`, `auto` (a call or text), `required`, or a named function"),
        _f("parallel_tool_calls", "a boolean; at most one call per reply either way"),
        _r("functions", "function calling (deprecated) is not implemented", []),
        _r("function_call", "function calling (deprecated) is not implemented", "none"),
        _f(
            "logprobs",
            "per-token log-softmax of the raw logits (before sampling changes them; continuous batching only)",
        ),
        _f("top_logprobs", f"0 to {MAX_TOP_LOGPROBS} most likely tokens per position (needs `logprobs: true`)"),
        _r("modalities", "text output only", ["text"]),
        _r("audio", "audio output is not implemented"),
        _r("prediction", "predicted outputs are not implemented"),
        _r("moderation", "no moderation model runs here (a blocked reply would differ)"),
        _r("web_search_options", "the server is offline by design"),
        _r("store", "completions are not stored", False),
        _r("service_tier", "one service tier", "auto", "default"),
        _i(
            "metadata",
            f"up to {MAX_METADATA} string key-value pairs (keys up to 64 characters, values up to 512); "
            "completions are not stored, so nothing keeps them",
        ),
        _i(
            "prompt_cache_key",
            "a string; the prompt cache here is keyed by the prompt's tokens themselves, which is what the key groups",
        ),
        _i(
            "prompt_cache_options",
            "`mode` (`implicit` or `explicit`) and `ttl` (`30m`); prefix reuse here does not depend on them",
        ),
        _i("prompt_cache_retention", "`in_memory` or `24h` (deprecated by OpenAI); no effect on prefix reuse"),
        _i(
            "reasoning_effort",
            f"one of {', '.join(REASONING_EFFORTS)}; the served models do not reason before answering, so "
            "there is no effort to set",
        ),
        _i("verbosity", f"one of {', '.join(VERBOSITIES)}; the served models have no verbosity control"),
        _i("safety_identifier", "an end-user id (a string), as `user`; no abuse monitoring runs here"),
    ),
    "/v1/completions": (
        _f(
            "prompt",
            "a string, token ids (a list of integers), or a list of up to 16 strings or token-id lists "
            "(one choice per prompt, `index` in order)",
        ),
        *_COMMON,
        _r("echo", "echoing the prompt is not implemented", False),
        _f(
            "logprobs",
            f"0 to {MAX_TOP_LOGPROBS}: per-token log-softmax of the raw logits and that many most likely "
            "tokens (continuous batching only)",
        ),
        _r("best_of", "one completion per request", 1),
        _r("suffix", "insertion (fill-in-the-middle) is not implemented", ""),
    ),
    "/v1/responses": (
        _f("model", "a served LLM name (GET /v1/models)"),
        _f(
            "input",
            "a string (one user turn) or a list of items: messages (`role` user, assistant, system or developer; "
            "`content` a string or `input_text` / `output_text` parts, `input_image` for VLM bundles), "
            "`function_call` and `function_call_output` items; other item types: 400 naming them",
        ),
        _f("instructions", "a string: a system turn before the input"),
        _f("max_output_tokens", "as max_tokens of chat (default 256; cap 2048 or the context)"),
        _f("temperature", "0 to 2; 0 is greedy"),
        _f("top_p", "above 0, at most 1"),
        _f("stream", "Server-Sent Events: response.created ... response.completed (or response.incomplete)"),
        _f("stream_options", "`include_obfuscation` is accepted and ignored (the stream is not padded)"),
        _f(
            "text",
            "`format`: `text`, `json_object` or `json_schema` (`schema`): the grammar of chat's response_format; "
            "`verbosity` accepted and ignored",
        ),
        _f(
            "tools",
            "function tools (`type: function`, `name`, `parameters`), as chat's tools (continuous batching only); "
            "a stream sends a call whole when it is complete",
        ),
        _f("tool_choice", '`none`, `auto`, `required` or `{"type": "function", "name": ...}`'),
        _f("parallel_tool_calls", "a boolean; at most one call per reply either way"),
        _f("user", "an end-user id (a string); it does not change the output"),
        _i("metadata", f"up to {MAX_METADATA} string key-value pairs, echoed in the response; nothing is stored"),
        _i("prompt_cache_key", "a string; prefix reuse here is keyed by the prompt's tokens themselves"),
        _i("prompt_cache_options", "`mode` and `ttl`; no effect on prefix reuse"),
        _i("prompt_cache_retention", "`in_memory` or `24h`; no effect on prefix reuse"),
        _i("safety_identifier", "an end-user id (a string); no abuse monitoring runs here"),
        _i(
            "reasoning",
            "`effort` and `summary`: the served models do not reason before answering (no reasoning items, "
            "`reasoning_tokens` 0)",
        ),
        _i("store", "a boolean; responses are never stored here (the response says `store: false`)"),
        _i("max_tool_calls", "a positive integer; a reply holds at most one call anyway"),
        _r("previous_response_id", "responses are not stored: send the conversation in `input`"),
        _r("conversation", "conversations are not stored: send the conversation in `input`"),
        _r("background", "background responses are not implemented", False),
        _r("include", "no extra output data is available", []),
        _r("prompt", "stored prompt templates are not implemented"),
        _r("top_logprobs", "log-probabilities are not implemented in the Responses API here (chat has them)", 0),
        _r("truncation", "the input is never truncated: too long is a 400", "disabled"),
        _r("service_tier", "one service tier", "auto", "default"),
        _r("moderation", "no moderation model runs here (a blocked reply would differ)"),
        _r("context_management", "the context is never compacted here"),
    ),
    "/v1/embeddings": (
        _f("model", "a served text-embedding model name (GET /v1/models)"),
        _f(
            "input",
            f"a string, a list of strings, token ids (a list of integers) or a list of token-id lists; at "
            f"most {MAX_EMBEDDING_INPUTS} inputs, none empty. Token ids are the model's own vocabulary "
            "(its tokenizer.json; an id outside it: 400) and are the encoder's input as given (a BERT "
            "model's [CLS] ... [SEP] included); text and token ids longer than the model's max length are "
            "truncated alike",
        ),
        _f("encoding_format", "`float` or `base64`"),
        _f("dimensions", "the model's dimension only (no truncation); other values 400"),
        _f("user", "an end-user id (a string); it does not change the output"),
    ),
}


def fields_markdown() -> str:
    """docs/serve.md's request-field tables, made from :data:`REQUEST_FIELDS` (a test checks the docs hold
    exactly this text)."""
    out = []
    for route, fields in REQUEST_FIELDS.items():
        out += [f"`POST {route}`:", "", "| field | status | notes |", "|---|---|---|"]
        order = {"implemented": 0, "ignored": 1, "refused": 2}
        for f in sorted(fields, key=lambda f: (order[f.status], f.extra, f.name)):
            if f.status == "implemented":
                status = "implemented (llama.cpp extra)" if f.extra else "implemented"
            elif f.status == "ignored":
                status = "accepted, ignored"
            else:
                status = "refused (400)" + (
                    " unless " + " or ".join(f"`{json.dumps(n)}`" for n in f.neutral) if f.neutral else ""
                )
            out.append(f"| `{f.name}` | {status} | {f.note} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


FIELD_NAMES = frozenset(f.name for fields in REQUEST_FIELDS.values() for f in fields)
