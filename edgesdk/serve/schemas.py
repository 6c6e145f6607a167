# SPDX-License-Identifier: Apache-2.0
"""The request bodies of ``edgesdk serve`` as pydantic models: one source for the checks and for the OpenAPI
document (:mod:`edgesdk.serve.openapi` takes their JSON Schema), as vLLM and llama-cpp-python's server do.

Every field a route knows is declared here with its status (``x-edgesdk-status``): ``implemented``; ``ignored``
(accepted, its type checked, with no effect here: ``metadata``, ``prompt_cache_key``); or ``refused`` (a 400 naming
it unless its value is null or the one that asks for nothing: ``logprobs: false``). Any other field is a 400 naming
it. :func:`edgesdk.serve.protocol.parse` validates a body and turns pydantic's errors into one-line 400s;
a generation model's :meth:`~GenerationBody.to_generation_request` is the runtime's
:class:`~edgesdk.runtime.requests.GenerationRequest`, with the checks that need the model (``max_tokens``' cap, a
VLM's images).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError, WrapValidator
from pydantic import model_validator as _model_validator
from pydantic_core import PydanticCustomError

from edgesdk.errors import EdgeSDKError, InputError
from edgesdk.runtime import grammar as _grammar
from edgesdk.runtime.requests import (
    INT32_MAX,
    MAX_LOGIT_BIAS,
    MAX_TOP_LOGPROBS,
    SEED_MAX,
    GenerationRequest,
    check_logit_bias,
    check_tools,
)
from edgesdk.serve.config import ModelEntry
from edgesdk.serve.protocol import APIError, backend_error, parse, show

MAX_EMBEDDING_INPUTS = 2048  # inputs per embeddings request (as OpenAI)
MAX_STOP_SEQUENCES = 16
MAX_PROMPTS = 16  # prompts in one /v1/completions request (one choice each)
MAX_METADATA = 16  # key-value pairs; keys up to 64 characters, values up to 512 (OpenAI's limits)
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
Verbosity = Literal["low", "medium", "high"]
PromptCacheRetention = Literal["in_memory", "24h"]
#: The values an ignored field may take (anything else is a 400 naming it): OpenAI's own enums.
REASONING_EFFORTS: tuple[str, ...] = get_args(ReasoningEffort)
VERBOSITIES: tuple[str, ...] = get_args(Verbosity)
PROMPT_CACHE_RETENTIONS: tuple[str, ...] = get_args(PromptCacheRetention)


# ------------------------------------------------------------------------------ field declarations
def invalid(text: str, code: str | None = None) -> PydanticCustomError:
    """A validation error whose one-line message is ``'<field>' <text>`` (``code``: the error's ``code``)."""
    return PydanticCustomError("edgesdk", text, {"code": code} if code else None)


def whole(expect: str) -> WrapValidator:
    """Any error inside the value (a union's branches, a nested key) is one error naming the field itself:
    ``'<field>' must be <expect>``."""

    def check(value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise invalid(f"must be {expect}, got {show(value)}") from None

    return WrapValidator(check)


def implemented(note: str, *, extra: bool = False, default: Any = None, **kw: Any) -> Any:
    """A field this server implements (``extra``: a llama.cpp server field, not OpenAI's)."""
    meta = {"x-edgesdk-status": "implemented", **({"x-edgesdk-extra": True} if extra else {})}
    return Field(default, description=note, json_schema_extra=meta, **kw)  # type: ignore[arg-type]


def ignored(note: str) -> Any:
    """A field accepted, its type checked, that cannot change the reply here."""
    return Field(None, description=note, json_schema_extra={"x-edgesdk-status": "ignored"})


def refused(note: str, *neutral: Any) -> Any:
    """A field answered with a 400 naming it unless its value is null or one of ``neutral`` (checked by
    :meth:`Body.known_fields`)."""
    schema = {"enum": [None, *neutral]} if neutral else {"type": "null"}
    meta: dict[str, Any] = {"x-edgesdk-status": "refused", "x-edgesdk-neutral": list(neutral), **schema}
    return Field(None, description=note, json_schema_extra=meta)


def _same(a: object, b: object) -> bool:
    """``a == b`` with types kept apart (``False`` is not ``0``)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class Strict(BaseModel):
    """No conversions (``"1"`` is not 1, ``true`` is not 1), no NaN or infinity, no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Body(Strict):
    """A request body: every key a field of the route (else a 400 naming it), a refused field null or neutral."""

    route: ClassVar[str] = ""

    @_model_validator(mode="before")
    @classmethod
    def known_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for key, value in data.items():
            f = cls.model_fields.get(key)
            if f is None:
                names = list(cls.model_fields)
                takes = (
                    f"it takes {', '.join(names)}"
                    if len(names) <= 8
                    else "OpenAI's request fields and the llama.cpp extras top_k, min_p, repeat_penalty; "
                    "docs/serve.md lists them"
                )
                raise APIError(
                    400,
                    f"unknown field {show(key)}: not a field of {cls.route} that this server knows ({takes})",
                    param=str(key)[:40],
                    code="unsupported_parameter",
                )
            meta = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            neutral = meta.get("x-edgesdk-neutral")
            if value is None or not isinstance(neutral, list) or any(_same(value, n) for n in neutral):
                continue
            allowed = " or ".join(json.dumps(n) for n in (None, *neutral))
            raise APIError(
                400,
                f"'{key}' is not supported by this server: {f.description} (accepted: {allowed})",
                param=key,
                code="unsupported_parameter",
            )
        return data


# ------------------------------------------------------------------------------ value types
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Text = Annotated[str, Field(min_length=1)]


def _prompt(value: Any) -> Any:
    """A completions ``prompt`` as text, token ids or several of them (a list of one: that one); the messages of
    :data:`MAX_PROMPTS`, empty lists and out-of-range token ids before the type says less."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, list) and len(value) > MAX_PROMPTS and all(isinstance(p, str | list) for p in value):
        raise invalid(f"holds {len(value)} prompts; the limit is {MAX_PROMPTS} per request")
    ids = [t for p in (value if isinstance(value, list) else []) for t in (p if isinstance(p, list) else [p])]
    bad = next((t for t in ids if type(t) is int and not 0 <= t <= INT32_MAX), None)
    if bad is not None:
        raise invalid(f"token ids must be from 0 to {INT32_MAX}, got {show(bad)}")
    return value


def _embedding_input(value: Any) -> Any:
    """An embeddings ``input`` as a list of texts or of token-id lists, each non-empty, with the messages that say
    which rule it broke."""
    token_ids = lambda v: isinstance(v, list) and all(type(t) is int for t in v)  # noqa: E731
    inputs = [value] if isinstance(value, str) or (token_ids(value) and value) else value
    if not isinstance(inputs, list) or not inputs:
        raise invalid("must be a non-empty string, list of strings, list of token ids, or list of token-id lists")
    texts = all(isinstance(t, str) for t in inputs)
    if not texts and not all(token_ids(t) for t in inputs):
        raise invalid(
            "must be a list of strings or a list of token-id lists (lists of integers), not a mix or other values"
        )
    if any(not t for t in inputs):
        raise invalid(f"must not contain empty {'strings' if texts else 'token-id lists'}")
    bad = next((t for ids in ([] if texts else inputs) for t in ids if not 0 <= t <= INT32_MAX), None)
    if bad is not None:
        raise invalid(f"token ids must be from 0 to the model's vocabulary size, got {show(bad)}")
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise invalid(f"holds {len(inputs)} items; the limit is {MAX_EMBEDDING_INPUTS}")
    return inputs


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=MAX_METADATA),
    whole(f"an object of at most {MAX_METADATA} string key-value pairs (keys up to 64 characters, values up to 512)"),
]


class PromptCacheOptions(Strict):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


class StreamOptions(Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # accepted and ignored: no `obfuscation` padding field is sent


class ChatMessage(Strict):
    """A chat turn; any other key (audio, refusal, ...) with a value other than null, [] or "" is a 400 naming it,
    except an assistant's ``tool_calls`` and a tool's ``tool_call_id`` and ``name``."""

    model_config = ConfigDict(extra="allow")
    role: Text
    content: Annotated[str | list[dict[str, Any]], whole("a string or a list of content parts")] | None = None


class ResponseFormat(Strict):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class NamedTool(Strict):
    name: str


class ToolChoice(Strict):
    type: Literal["function"]
    function: NamedTool


# ------------------------------------------------------------------------------ the ignored fields
class IgnoredFields(Body):
    metadata: Metadata | None = ignored(
        f"up to {MAX_METADATA} string key-value pairs (keys up to 64 characters, values up to 512); "
        "completions are not stored, so nothing keeps them"
    )
    prompt_cache_key: str | None = ignored(
        "a string; the prompt cache here is keyed by the prompt's tokens themselves, which is what the key groups"
    )
    prompt_cache_options: (
        Annotated[PromptCacheOptions, whole("an object with 'mode' ('implicit' or 'explicit') and 'ttl' ('30m')")]
        | None
    ) = ignored("`mode` (`implicit` or `explicit`) and `ttl` (`30m`); prefix reuse here does not depend on them")
    prompt_cache_retention: PromptCacheRetention | None = ignored(
        "`in_memory` or `24h` (deprecated by OpenAI); no effect on prefix reuse"
    )
    safety_identifier: str | None = ignored("an end-user id (a string), as `user`; no abuse monitoring runs here")


# ------------------------------------------------------------------------------ chat and completions
class GenerationBody(Body):
    """The fields /v1/chat/completions and /v1/completions share, and their way to a GenerationRequest."""

    model: Text = implemented("a served model name (GET /v1/models)", default=...)
    max_tokens: Annotated[int, Field(ge=1)] | None = implemented(
        "1 to the model's cap (default 256; cap 2048 or the context, whichever is smaller)"
    )
    temperature: Annotated[float, Field(ge=0, le=2)] | None = implemented("0 to 2; 0 is greedy")
    top_p: Annotated[float, Field(gt=0, le=1)] | None = implemented("above 0, at most 1")
    seed: Annotated[int, Field(ge=0, le=SEED_MAX)] | None = implemented(f"0 to {SEED_MAX}")
    stop: (
        Annotated[
            str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)],
            whole(f"a string or a list of at most {MAX_STOP_SEQUENCES} strings"),
        ]
        | None
    ) = implemented(f"a string or a list of at most {MAX_STOP_SEQUENCES} strings")
    stream: bool | None = implemented("Server-Sent Events")
    stream_options: StreamOptions | None = implemented(
        "`include_usage`; `include_obfuscation` is accepted and ignored (no `obfuscation` field is sent: "
        "the stream is not padded)"
    )
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = implemented(
        "-2 to 2 (llama.cpp penalties sampler, last 64 generated tokens)"
    )
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = implemented(
        "-2 to 2 (llama.cpp penalties sampler, last 64 generated tokens)"
    )
    logit_bias: (
        Annotated[
            dict[Annotated[str, Field(pattern=r"^[0-9]{1,10}$")], Annotated[float, Field(ge=-100, le=100)]],
            Field(max_length=MAX_LOGIT_BIAS),
            whole(f"an object of at most {MAX_LOGIT_BIAS} token ids (strings of digits) to biases from -100 to 100"),
        ]
        | None
    ) = implemented("token id -> bias, -100 to 100 (llama.cpp logit-bias sampler)")
    n: Annotated[int, Field(ge=1, le=1), whole("1 (one choice per request)")] | None = implemented(
        "1 only (one choice per request); other values 400"
    )
    user: str | None = implemented("an end-user id (a string); it does not change the output")
    top_k: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = implemented(
        "llama.cpp extra: 0 (off) or more", extra=True
    )
    min_p: Annotated[float, Field(ge=0, le=1)] | None = implemented("llama.cpp extra: 0 to 1", extra=True)
    repeat_penalty: Annotated[float, Field(gt=0, le=1e6)] | None = implemented(
        "llama.cpp extra: above 0 (1 is off)", extra=True
    )

    _structured: dict = PrivateAttr(default_factory=dict)  # grammar, tools, tool_choice, logprobs (checked)
    _max_key: ClassVar[str] = "max_tokens"
    operation: ClassVar[str] = "text_completion"

    @property
    def streaming(self) -> bool:
        return self.stream is True

    @property
    def include_usage(self) -> bool:
        return self.streaming and bool(self.stream_options and self.stream_options.include_usage)

    def options(self, entry: ModelEntry) -> dict:
        """The generation options (``Session.generate``'s keywords) this body asks of ``entry``: ``max_tokens``
        within its cap (else a 400 naming the field), the sampling options given, the grammar, tools, logprobs."""
        key = self._max_key
        if key == "max_tokens" and getattr(self, "max_completion_tokens", None) is not None:
            key = "max_completion_tokens"
        max_tokens = getattr(self, key)
        if max_tokens is not None and max_tokens > entry.max_tokens_cap:
            raise APIError(
                400,
                f"'{key}' is {show(max_tokens)}; this server allows at most {entry.max_tokens_cap} for {entry.name!r}",
                param=key,
            )
        opts: dict = {"max_tokens": max_tokens or entry.default_max_tokens}
        names = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repeat_penalty")
        opts.update({k: float(getattr(self, k)) for k in names if getattr(self, k, None) is not None})
        opts.update({k: getattr(self, k) for k in ("top_k", "seed") if getattr(self, k, None) is not None})
        if self.logit_bias:
            try:
                opts["logit_bias"] = dict(check_logit_bias(self.logit_bias))
            except InputError as exc:
                raise APIError(400, str(exc), param="logit_bias") from None
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if stops:
            opts["stop"] = stops
        return {**opts, **self._structured}

    def inputs(self, entry: ModelEntry) -> list:
        """What one generation each is made of: a chat's messages, or each completions prompt."""
        raise NotImplementedError

    def to_generation_request(self, entry: ModelEntry, what: Any = None) -> GenerationRequest:
        """The runtime's request for ``what`` (one of :meth:`inputs`: the first when left out) on ``entry``; an
        APIError 400 naming the field the runtime refuses."""
        what = self.inputs(entry)[0] if what is None else what
        opts = self.options(entry)
        try:
            if isinstance(what, str):
                return GenerationRequest.from_options(prompt=what, stream=self.streaming, **opts)
            if self.operation == "chat":
                from edgesdk.serve.images import text_only  # a VLM's image parts: checked in inputs()

                return GenerationRequest.from_options(messages=text_only(what), stream=self.streaming, **opts)
            return GenerationRequest.from_options(prompt_tokens=what, stream=self.streaming, **opts)
        except EdgeSDKError as exc:
            raise backend_error(exc, "messages" if self.operation == "chat" else "prompt") from None


class CompletionRequest(GenerationBody):
    route: ClassVar[str] = "/v1/completions"
    prompt: Annotated[
        str | TokenIds | Annotated[list[str | TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)],
        whole(f"a string, token ids (a non-empty list of integers), or a list of up to {MAX_PROMPTS} prompts"),
        BeforeValidator(_prompt),
    ] = implemented(
        "a string, token ids (a list of integers), or a list of up to 16 strings or token-id lists "
        "(one choice per prompt, `index` in order)",
        default=...,
    )
    echo: Any = refused("echoing the prompt is not implemented", False)
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = implemented(
        f"0 to {MAX_TOP_LOGPROBS}: per-token log-softmax of the raw logits and that many most likely "
        "tokens (continuous batching only)"
    )
    best_of: Any = refused("one completion per request", 1)
    suffix: Any = refused("insertion (fill-in-the-middle) is not implemented", "")

    @_model_validator(mode="after")
    def _logprobs(self) -> CompletionRequest:
        if self.logprobs is not None:
            self._structured["logprobs"] = self.logprobs
        return self

    def inputs(self, entry: ModelEntry | None = None) -> list[str | list[int]]:
        p = self.prompt
        return [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)  # type: ignore[arg-type]


class ChatCompletionRequest(GenerationBody, IgnoredFields):
    route: ClassVar[str] = "/v1/chat/completions"
    operation: ClassVar[str] = "chat"
    messages: Annotated[list[ChatMessage], Field(min_length=1)] = implemented(
        "role and text content (a string or text parts; `image_url` parts for VLM bundles: data "
        "URLs, see Images); the `developer` role is a `system` turn, as OpenAI maps it for models "
        "without one; assistant `tool_calls`, tool `tool_call_id` and `name`; any other "
        "message field (audio, ...): 400 naming it",
        default=...,
    )
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = implemented("as max_tokens (wins when both are given)")
    response_format: (
        Annotated[ResponseFormat, whole("an object with 'type' 'text', 'json_object' or 'json_schema'")] | None
    ) = implemented(
        "`text`, `json_object`, `json_schema` (`json_schema.schema`): a llama.cpp grammar "
        "from the schema constrains every token (continuous batching only)"
    )
    tools: list[dict[str, Any]] | None = implemented(
        "function tools: rendered by the chat template (or a system turn when it ignores tools); "
        "the reply is grammar-constrained to a call (continuous batching only)"
    )
    tool_choice: (
        Annotated[
            Literal["none", "auto", "required"] | ToolChoice,
            whole("'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}"),
        ]
        | None
    ) = implemented("`none`, `auto` (a call or text), `required`, or a named function")
    parallel_tool_calls: bool | None = implemented("a boolean; at most one call per reply either way")
    functions: Any = refused("function calling (deprecated) is not implemented", [])
    function_call: Any = refused("function calling (deprecated) is not implemented", "none")
    logprobs: bool | None = implemented(
        "per-token log-softmax of the raw logits (before sampling changes them; continuous batching only)"
    )
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = implemented(
        f"0 to {MAX_TOP_LOGPROBS} most likely tokens per position (needs `logprobs: true`)"
    )
    modalities: Any = refused("text output only", ["text"])
    audio: Any = refused("audio output is not implemented")
    prediction: Any = refused("predicted outputs are not implemented")
    moderation: Any = refused("no moderation model runs here (a blocked reply would differ)")
    web_search_options: Any = refused("the server is offline by design")
    store: Any = refused("completions are not stored", False)
    service_tier: Any = refused("one service tier", "auto", "default")
    reasoning_effort: ReasoningEffort | None = ignored(
        f"one of {', '.join(REASONING_EFFORTS)}; the served models do not reason before answering, so "
        "there is no effort to set"
    )
    verbosity: Verbosity | None = ignored(
        f"one of {', '.join(VERBOSITIES)}; the served models have no verbosity control"
    )

    @_model_validator(mode="after")
    def _structure(self) -> ChatCompletionRequest:
        """``logprobs``, ``tools``/``tool_choice`` and ``response_format`` -> the grammar, tools, tool_choice and
        logprobs options; an APIError 400 naming the field otherwise."""
        opts = self._structured
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        if self.logprobs:
            opts["logprobs"] = self.top_logprobs or 0
        try:
            tools = check_tools(self.tools or None)
        except InputError as exc:
            raise APIError(400, str(exc), param="tools") from None
        names = [t["function"]["name"] for t in tools]
        choice: str | ToolChoice | None = self.tool_choice
        if isinstance(choice, ToolChoice):
            if choice.function.name not in names:
                raise APIError(
                    400,
                    f"'tool_choice' must name one of the tools ({', '.join(names) or 'none given'}), "
                    f"got {show(choice.function.name)}",
                    param="tool_choice",
                )
            choice = choice.function.name
        choice = str(choice or ("auto" if tools else "none"))
        if choice != "none" and not tools:
            raise APIError(400, f"'tool_choice' {choice!r} needs 'tools'", param="tool_choice")
        fmt, grammar = self.response_format, None
        try:
            if fmt is not None and fmt.type == "json_object":
                grammar = _grammar.json_object_grammar()
            elif fmt is not None and fmt.type == "json_schema":
                schema = (fmt.json_schema or {}).get("schema")
                if not isinstance(schema, dict):
                    raise InputError("response_format.json_schema.schema must be a JSON Schema object")
                grammar = _grammar.json_schema_grammar(schema, "response_format.json_schema.schema")
        except InputError as exc:
            raise APIError(400, str(exc), param="response_format") from None
        if tools and choice != "none":
            if grammar is not None:
                raise APIError(
                    400,
                    "'response_format' cannot be combined with tools (unless tool_choice is 'none'): "
                    "the reply is a tool call or text",
                    param="response_format",
                )
            try:
                opts["grammar"] = _grammar.tool_grammar(tools, choice)
            except InputError as exc:
                raise APIError(400, str(exc), param="tools") from None
            opts["tools"], opts["tool_choice"] = list(tools), choice
        elif grammar is not None:
            opts["grammar"] = grammar
        return self

    def inputs(self, entry: ModelEntry | None = None) -> list[list[dict]]:
        """The messages with text content (the ``developer`` role as ``system``); a VLM entry's messages keep their
        parts, image_url parts read and checked from their headers (edgesdk.serve.images: data URLs, local files
        under --allow-local-images, size limits, the images' tokens against the context; else 400 naming them), not
        decoded yet (``images.decode_images``)."""
        images = entry.images if entry is not None else None
        out = []
        for i, msg in enumerate(self.messages):
            m = msg.model_dump(exclude_unset=True)
            keys = _TOOL_KEYS.get(msg.role, ())
            for key, value in m.items():  # audio, refusal, function_call, ...: not passed to the template
                if key not in ("role", "content", *keys) and value not in (None, [], ""):
                    raise APIError(
                        400,
                        f"messages[{i}].{key[:40]}: only 'role' and 'content' (and an assistant's "
                        "'tool_calls', a tool's 'tool_call_id' and 'name') are supported in a message",
                        param=f"messages[{i}].{key[:40]}",
                        code="unsupported_parameter",
                    )
            content: str | list = msg.content or ""
            if isinstance(content, list):  # content parts: text, and image_url for a VLM
                parts: list[dict] = []
                for j, part in enumerate(content):
                    if part.get("type") == "image_url":
                        from edgesdk.serve.images import ImageError, image_part

                        try:
                            parts.append(
                                image_part(part, f"messages[{i}].content[{j}]", images, entry.name if entry else "")
                            )
                        except ImageError as exc:
                            raise APIError(400, str(exc), param=exc.param) from None
                    elif part.get("type") == "text" and isinstance(part.get("text"), str):
                        parts.append({"type": "text", "text": part["text"]})
                    else:
                        raise APIError(
                            400,
                            f"messages[{i}].content: only text parts are supported"
                            + (" besides image_url" if images else ""),
                            param=f"messages[{i}].content",
                        )
                content = parts if images is not None else "".join(p["text"] for p in parts)
            # OpenAI's `developer` role (o-series clients send it for instructions) is a system turn on models
            # without one of their own, as OpenAI treats it there: chat templates know `system`.
            role = "system" if msg.role == "developer" else msg.role
            out.append({"role": role, "content": content, **{k: m[k] for k in keys if m.get(k) not in (None, [], "")}})
        if images is not None:
            from edgesdk.serve.images import check_image_tokens

            try:  # counted from the headers, before any image is decoded (the route decodes them on a thread)
                check_image_tokens(out, images)
            except InputError as exc:
                raise APIError(400, str(exc), param="messages", code="context_length_exceeded") from None
        return [out]


_TOOL_KEYS = {"assistant": ("tool_calls",), "tool": ("tool_call_id", "name")}


class ApplyTemplateRequest(ChatCompletionRequest):
    """``POST /apply-template``: a chat request's fields, checked as /v1/chat/completions checks them (``model``
    optional with one LLM served)."""

    route: ClassVar[str] = "/apply-template"
    model: Text | None = implemented("a served GGUF model; optional with one LLM served")  # type: ignore[assignment]


# ------------------------------------------------------------------------------ embeddings
class EmbeddingRequest(Body):
    route: ClassVar[str] = "/v1/embeddings"
    model: Text = implemented("a served text-embedding model name (GET /v1/models)", default=...)
    input: Annotated[
        Text | TokenIds | Annotated[list[Text], Field(min_length=1)] | Annotated[list[TokenIds], Field(min_length=1)],
        BeforeValidator(_embedding_input),
    ] = implemented(
        f"a string, a list of strings, token ids (a list of integers) or a list of token-id lists; at "
        f"most {MAX_EMBEDDING_INPUTS} inputs, none empty. Token ids are the model's own vocabulary "
        "(its tokenizer.json; an id outside it: 400) and are the encoder's input as given (a BERT "
        "model's [CLS] ... [SEP] included); text and token ids longer than the model's max length are "
        "truncated alike",
        default=...,
    )
    encoding_format: Literal["float", "base64"] | None = implemented("`float` or `base64`")
    dimensions: Annotated[int, Field(ge=1)] | None = implemented(
        "the model's dimension only (no truncation); other values 400"
    )
    user: str | None = implemented("an end-user id (a string); it does not change the output")

    @property
    def inputs(self) -> list[str | list[int]]:
        """The inputs as a list (texts, or token-id lists: never a mix)."""
        return self.input  # type: ignore[return-value]  # _embedding_input made it a list


# ------------------------------------------------------------------------------ llama-server's bodies
LlamaModel = Annotated[str, Field(min_length=1)] | None


class TokenizeRequest(Body):
    route: ClassVar[str] = "/tokenize"
    model: LlamaModel = implemented("a served GGUF model; optional with one LLM served")
    content: Annotated[str, whole("a string (the text to tokenize)")] = implemented("the text", default=...)
    add_special: bool | None = implemented("insert BOS (default false)")
    parse_special: bool | None = implemented("special tokens' text as those tokens (default true)")
    with_pieces: bool | None = implemented("ids with their pieces (default false)")


class DetokenizeRequest(Body):
    route: ClassVar[str] = "/detokenize"
    model: LlamaModel = implemented("a served GGUF model; optional with one LLM served")
    tokens: Annotated[list[int], whole("a list of token ids (integers)")] = implemented("token ids", default=...)


# ------------------------------------------------------------------------------ the Responses API
class TextFormat(Strict):
    model_config = ConfigDict(extra="allow")  # json_schema's name, schema, strict, description
    type: Literal["text", "json_object", "json_schema"]


class TextParam(Strict):
    format: Annotated[TextFormat, whole("an object with 'type' text, json_object or json_schema")] | None = None
    verbosity: Verbosity | None = None  # accepted and ignored


class Reasoning(Strict):
    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(Strict):
    include_obfuscation: bool | None = None


class ResponsesToolChoice(Strict):
    type: Literal["function"]
    name: str


class ResponsesRequest(Body):
    """``POST /v1/responses``: read into the chat request it generates (:meth:`to_chat`)."""

    route: ClassVar[str] = "/v1/responses"
    model: Text = implemented("a served LLM name (GET /v1/models)", default=...)
    input: Annotated[
        str | Annotated[list[dict[str, Any]], Field(min_length=1)],
        whole("a string or a non-empty list of input items"),
    ] = implemented(
        "a string (one user turn) or a list of items: messages (`role` user, assistant, system or developer; "
        "`content` a string or `input_text` / `output_text` parts, `input_image` for VLM bundles), "
        "`function_call` and `function_call_output` items; other item types: 400 naming them",
        default=...,
    )
    instructions: str | None = implemented("a string: a system turn before the input")
    max_output_tokens: Annotated[int, Field(ge=1)] | None = implemented(
        "as max_tokens of chat (default 256; cap 2048 or the context)"
    )
    temperature: Annotated[float, Field(ge=0, le=2)] | None = implemented("0 to 2; 0 is greedy")
    top_p: Annotated[float, Field(gt=0, le=1)] | None = implemented("above 0, at most 1")
    stream: bool | None = implemented(
        "Server-Sent Events: response.created ... response.completed (or response.incomplete)"
    )
    stream_options: ResponsesStreamOptions | None = implemented(
        "`include_obfuscation` is accepted and ignored (the stream is not padded)"
    )
    text: TextParam | None = implemented(
        "`format`: `text`, `json_object` or `json_schema` (`schema`): the grammar of chat's response_format; "
        "`verbosity` accepted and ignored"
    )
    tools: list[dict[str, Any]] | None = implemented(
        "function tools (`type: function`, `name`, `parameters`), as chat's tools (continuous batching only); "
        "a stream sends a call whole when it is complete"
    )
    tool_choice: (
        Annotated[
            Literal["none", "auto", "required"] | ResponsesToolChoice,
            whole("'none', 'auto', 'required' or {'type': 'function', 'name': ...}"),
        ]
        | None
    ) = implemented('`none`, `auto`, `required` or `{"type": "function", "name": ...}`')
    parallel_tool_calls: bool | None = implemented("a boolean; at most one call per reply either way")
    user: str | None = implemented("an end-user id (a string); it does not change the output")
    metadata: Metadata | None = ignored(
        f"up to {MAX_METADATA} string key-value pairs, echoed in the response; nothing is stored"
    )
    prompt_cache_key: str | None = ignored("a string; prefix reuse here is keyed by the prompt's tokens themselves")
    prompt_cache_options: (
        Annotated[PromptCacheOptions, whole("an object with 'mode' ('implicit' or 'explicit') and 'ttl' ('30m')")]
        | None
    ) = ignored("`mode` and `ttl`; no effect on prefix reuse")
    prompt_cache_retention: PromptCacheRetention | None = ignored("`in_memory` or `24h`; no effect on prefix reuse")
    safety_identifier: str | None = ignored("an end-user id (a string); no abuse monitoring runs here")
    reasoning: Annotated[Reasoning, whole("an object with 'effort' and 'summary'")] | None = ignored(
        "`effort` and `summary`: the served models do not reason before answering (no reasoning items, "
        "`reasoning_tokens` 0)"
    )
    store: bool | None = ignored("a boolean; responses are never stored here (the response says `store: false`)")
    max_tool_calls: Annotated[int, Field(ge=1)] | None = ignored(
        "a positive integer; a reply holds at most one call anyway"
    )
    previous_response_id: Any = refused("responses are not stored: send the conversation in `input`")
    conversation: Any = refused("conversations are not stored: send the conversation in `input`")
    background: Any = refused("background responses are not implemented", False)
    include: Any = refused("no extra output data is available", [])
    prompt: Any = refused("stored prompt templates are not implemented")
    top_logprobs: Any = refused("log-probabilities are not implemented in the Responses API here (chat has them)", 0)
    truncation: Any = refused("the input is never truncated: too long is a 400", "disabled")
    service_tier: Any = refused("one service tier", "auto", "default")
    moderation: Any = refused("no moderation model runs here (a blocked reply would differ)")
    context_management: Any = refused("the context is never compacted here")

    def chat(self) -> ChatCompletionRequest:
        """The chat request this one generates, parsed and checked as chat's (errors name the Responses field)."""
        with responses_params():
            return parse(ChatCompletionRequest, self.to_chat())

    def to_generation_request(self, entry: ModelEntry) -> GenerationRequest:
        chat = self.chat()
        with responses_params():
            return chat.to_generation_request(entry)

    def to_chat(self) -> dict:
        """The chat request body this request generates (``input`` items -> messages, ``instructions`` -> a system
        turn first, ``max_output_tokens`` -> max_tokens, ``text.format`` -> response_format, flat function
        ``tools`` -> chat tools); an APIError 400 naming the Responses field otherwise."""
        chat: dict[str, Any] = {"model": self.model, "messages": self._messages()}
        for src, dst in (
            ("max_output_tokens", "max_tokens"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("stream", "stream"),
            ("user", "user"),
            ("parallel_tool_calls", "parallel_tool_calls"),
        ):
            if getattr(self, src) is not None:
                chat[dst] = getattr(self, src)
        tools = []
        for i, t in enumerate(self.tools or ()):
            if t.get("type") != "function":
                raise APIError(
                    400,
                    f"'tools[{i}]': only function tools are supported here, got {str(t.get('type'))[:40]!r}",
                    param=f"tools[{i}].type",
                    code="unsupported_parameter",
                )
            fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
            tools.append({"type": "function", "function": fn})
        if tools:
            chat["tools"] = tools
        choice = self.tool_choice
        if choice is not None:
            named = {"type": "function", "function": {"name": getattr(choice, "name", None)}}
            chat["tool_choice"] = named if isinstance(choice, ResponsesToolChoice) else choice
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type == "json_schema":
            spec = {k: (fmt.model_extra or {}).get(k) for k in ("name", "schema")}
            chat["response_format"] = {"type": "json_schema", "json_schema": spec}
        elif fmt is not None:
            chat["response_format"] = {"type": fmt.type}
        return chat

    def _messages(self) -> list[dict]:
        """``instructions`` and ``input`` as chat messages."""
        out: list[dict] = [] if self.instructions is None else [{"role": "system", "content": self.instructions}]
        if isinstance(self.input, str):
            return [*out, {"role": "user", "content": self.input}]
        for i, item in enumerate(self.input):
            where = f"input[{i}]"
            kind = item.get("type", "message")
            if kind == "message":
                role = item.get("role")
                if role not in ("user", "assistant", "system", "developer"):
                    raise APIError(
                        400, f"'{where}.role' must be user, assistant, system or developer", param=f"{where}.role"
                    )
                out.append({"role": role, "content": _content(item.get("content"), f"{where}.content", role)})
            elif kind == "function_call":
                call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
                if not all(isinstance(v, str) for v in (call_id, name, args)):
                    raise APIError(400, f"'{where}' needs string call_id, name and arguments", param=where)
                call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
                if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                    out[-1]["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                call_id, output = item.get("call_id"), item.get("output")
                if not isinstance(call_id, str):
                    raise APIError(400, f"'{where}.call_id' must be a string", param=f"{where}.call_id")
                if not isinstance(output, str):
                    parts = _content(output, f"{where}.output", "tool")
                    output = "".join(p["text"] for p in parts) if isinstance(parts, list) else parts
                out.append({"role": "tool", "tool_call_id": call_id, "content": output})
            else:
                raise APIError(
                    400,
                    f"'{where}.type' {str(kind)[:40]!r} is not supported (message, function_call, "
                    "function_call_output)",
                    param=f"{where}.type",
                    code="unsupported_parameter",
                )
        return out


# A chat request's field -> the Responses field it came from (in error answers' ``param``). A message's index is not
# its input item's (instructions come first, function calls merge): any messages[...] error names ``input``.
_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}


def responses_param(param: str | None) -> str | None:
    """A chat request's ``param`` as the Responses field it came from."""
    base = (param or "").split(".", 1)[0].split("[", 1)[0]
    return _PARAMS.get(base, param)


@contextlib.contextmanager
def responses_params() -> Iterator[None]:
    """APIErrors raised inside name the Responses field (:func:`responses_param`)."""
    try:
        yield
    except APIError as exc:
        exc.param = responses_param(exc.param)
        raise


def _content(content: object, where: str, role: str) -> str | list[dict]:
    """A Responses message's content as chat content: a string, or text (and image) parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"'{where}' must be a string or a list of content parts", param=where)
    parts: list[dict] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        here = f"{where}[{j}]"
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):  # type: ignore[union-attr]
            parts.append({"type": "text", "text": part["text"]})  # type: ignore[index]
        elif kind == "input_image" and role == "user":
            url, detail = part.get("image_url"), part.get("detail")  # type: ignore[union-attr]
            if not isinstance(url, str):
                raise APIError(400, f"'{here}.image_url' must be a data URL (file_id is not supported)", param=here)
            parts.append({"type": "image_url", "image_url": {"url": url, **({"detail": detail} if detail else {})}})
        else:
            raise APIError(
                400,
                f"'{here}': only input_text, output_text and (user turns of VLM bundles) input_image parts are "
                f"supported, got {str(kind)[:40]!r}",
                param=here,
                code="unsupported_parameter",
            )
    return parts
