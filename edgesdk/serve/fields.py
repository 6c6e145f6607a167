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
    """One field of a generation request body: ``implemented``, or ``refused`` (400 naming it) unless its
    value is one of ``neutral`` (the value that asks for nothing: ``logprobs: false``, ``n: 1``)."""

    name: str
    status: str  # "implemented" | "refused"
    note: str
    neutral: tuple = ()
    extra: bool = False  # not in OpenAI's schema: a llama.cpp server field


def _f(name: str, note: str, *, extra: bool = False) -> RequestField:
    return RequestField(name, "implemented", note, extra=extra)


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
    _f("stream_options", "include_usage only"),
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
            "URLs, see Images); assistant `tool_calls`, tool `tool_call_id` and `name`; any other "
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
        _r("reasoning_effort", "no reasoning models are served"),
        _r("verbosity", "no verbosity control"),
        _r("web_search_options", "the server is offline by design"),
        _r("store", "completions are not stored", False),
        _r("metadata", "completions are not stored, so there is nothing to tag", {}),
        _r("service_tier", "one service tier", "auto", "default"),
        _r("prompt_cache_key", "no keyed prompt cache (the prompt cache is keyed by the prompt itself)"),
        _r("safety_identifier", "no abuse monitoring here"),
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
        for f in sorted(fields, key=lambda f: (f.status != "implemented", f.extra, f.name)):
            if f.status == "implemented":
                status = "implemented (llama.cpp extra)" if f.extra else "implemented"
            else:
                status = "refused (400)" + (
                    " unless " + " or ".join(f"`{json.dumps(n)}`" for n in f.neutral) if f.neutral else ""
                )
            out.append(f"| `{f.name}` | {status} | {f.note} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


FIELD_NAMES = frozenset(f.name for fields in REQUEST_FIELDS.values() for f in fields)
