# SPDX-License-Identifier: Apache-2.0
"""One typed generation request, validated once, and the one rule set for sampling options.

:class:`GenerationRequest` holds what a caller asks of an LLM: the input (prompt text, prompt token ids,
or chat messages with text parts), the sampling options (``max_tokens``, ``temperature``, ``top_p``,
``top_k``, ``min_p``, ``repeat_penalty``, ``frequency_penalty``, ``presence_penalty``, ``logit_bias``,
``seed``), ``stop`` sequences, ``stream``, and what the server's OpenAI fields ask of the engine: a
``grammar`` (llama.cpp GBNF) constraining the reply, ``logprobs`` (how many top alternatives to report per
token) and ``tools`` (rendered into a chat prompt). Every value is
checked when the request is made; a bad one is one :class:`~edgesdk.errors.InputError` whose one-line
message names the field (``top_p must be <= 1, got 1.5``). ``n`` other than 1 is refused.

:func:`check_sampling` is the rule set itself; the GGUF and VLM backends call it too (through
``vlm.backend._check_sampling``), so a value refused here is refused there with the same words.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgesdk.errors import InputError, shown
from edgesdk.runtime.grammar_limits import check_gbnf

#: The runtime's defaults for options left out (llama-cpp-python's, as ``Session.generate`` uses them).
DEFAULT_SAMPLING: dict[str, float] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repeat_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
}
#: Penalty values that leave the logits alone (a greedy request with these needs no sampler chain).
NEUTRAL_PENALTIES: dict[str, float] = {"repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
PENALTY_RANGE = 2.0  # frequency_penalty / presence_penalty: -2..2 (OpenAI's range)
LOGIT_BIAS_RANGE = 100.0  # logit_bias values: -100..100 (OpenAI's range)
MAX_LOGIT_BIAS = 1024  # entries in one logit_bias map
DEFAULT_MAX_TOKENS = 128
INT32_MAX = 2**31 - 1  # llama.cpp takes counts as int32_t
SEED_MAX = 0xFFFFFFFE  # 0xFFFFFFFF is llama.cpp's "random seed"
MAX_STOPS = 16  # as many stop strings as OpenAI accepts
MAX_TOP_LOGPROBS = 20  # OpenAI's cap on top_logprobs
MAX_GRAMMAR_CHARS = 1 << 20  # a GBNF text longer than this is refused
#: Speculative decoding modes a request may ask for (``GenerationRequest.speculative``)
SPECULATIVE_MODES = ("auto", "lookup", "draft", "off")
#: A tool's function name, as OpenAI requires it (fullmatch: a trailing newline does not pass as ``$`` would).
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _number(
    name: str,
    value: object,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    integer: bool = False,
) -> float:
    """``value`` as a finite number in range, else one InputError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputError(f"{name} must be {'an integer' if integer else 'a number'}, got {shown(value)}")
    if isinstance(value, numbers.Integral):
        iv = int(value)  # exact, however large
        if lo is not None and (iv <= lo if lo_open else iv < lo):
            raise InputError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {shown(value)}")
        bound = hi if hi is not None else (INT32_MAX if integer else None)
        if bound is not None and iv > bound:
            raise InputError(f"{name} must be <= {bound}, got {shown(value)}")
        if not integer:
            try:
                return float(iv)
            except OverflowError:
                raise InputError(f"{name} must be finite, got {shown(value)}") from None
        return iv
    f = float(value)
    if not math.isfinite(f):
        raise InputError(f"{name} must be finite, got {shown(value)}")
    if integer and not f.is_integer():
        raise InputError(f"{name} must be an integer, got {shown(value)}")
    if lo is not None and (f <= lo if lo_open else f < lo):
        raise InputError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {shown(value)}")
    bound = hi if hi is not None else (INT32_MAX if integer else None)
    if bound is not None and f > bound:
        raise InputError(f"{name} must be <= {bound}, got {shown(value)}")
    return int(f) if integer else f


def check_text(text: str, where: str) -> None:
    """InputError (one line) for a string that is not text: a lone UTF-16 surrogate (``"\\ud800"``) cannot be
    encoded as UTF-8, which tokenizers and llama.cpp need (they raised a bare TypeError / UnicodeEncodeError)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            f"{where} holds a lone UTF-16 surrogate ({ascii(text[exc.start])}) at character {exc.start}: not "
            "text (drop it, or decode the source with errors='replace')"
        ) from None


def check_messages_text(messages: object) -> None:
    """:func:`check_text` for every string content and text part of chat ``messages`` (any other shape is
    left to the message checks)."""
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        return
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, str):
            check_text(content, f"messages[{i}].content")
        elif isinstance(content, Sequence) and not isinstance(content, bytes):
            for j, part in enumerate(content):
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    check_text(part["text"], f"messages[{i}].content[{j}].text")


def check_sampling(max_tokens: object, seed: object, params: Mapping[str, object]) -> tuple[int, int | None]:
    """Range-check generation options: a bad value is one InputError (exit 3) naming the field.

    ``params`` holds temperature, top_k, top_p, min_p and repeat_penalty (all present), and may hold
    frequency_penalty and presence_penalty (-2..2). Returns
    ``max_tokens`` and ``seed`` as ints. This is the one rule set: GenerationRequest and the llama.cpp
    backends (``generate``/``stream``/``chat``, VLM) use it."""
    n = int(_number("max_tokens", max_tokens, lo=1, integer=True))
    _number("temperature", params["temperature"], lo=0)
    _number("top_k", params["top_k"], lo=0, integer=True)
    _number("top_p", params["top_p"], lo=0, hi=1, lo_open=True)
    _number("min_p", params["min_p"], lo=0, hi=1)
    _number("repeat_penalty", params["repeat_penalty"], lo=0, lo_open=True)
    for k in ("frequency_penalty", "presence_penalty"):  # optional: the VLM backend has none
        if params.get(k) is not None:
            _number(k, params[k], lo=-PENALTY_RANGE, hi=PENALTY_RANGE)
    s = int(_number("seed", seed, lo=0, hi=SEED_MAX, integer=True)) if seed is not None else None
    return n, s


def check_logit_bias(bias: object) -> tuple[tuple[int, float], ...]:
    """``None`` or a mapping token id -> bias (-100..100; JSON gives the ids as strings) -> sorted pairs."""
    if bias is None:
        return ()
    if isinstance(bias, (tuple, list)) and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in bias):
        bias = dict(bias)
    if not isinstance(bias, Mapping):
        raise InputError(f"logit_bias must be a mapping of token id to bias, got {shown(bias)}")
    if len(bias) > MAX_LOGIT_BIAS:
        raise InputError(f"logit_bias must hold at most {MAX_LOGIT_BIAS} entries, got {len(bias)}")
    out: dict[int, float] = {}
    for key, value in bias.items():
        tok: object = key
        if isinstance(key, str):
            if not key.strip().isdigit():
                raise InputError(f"logit_bias keys must be token ids (non-negative integers), got {shown(key)}")
            tok = int(key)
        t = int(_number("logit_bias key", tok, lo=0, integer=True))
        out[t] = float(_number(f"logit_bias[{t}]", value, lo=-LOGIT_BIAS_RANGE, hi=LOGIT_BIAS_RANGE))
    return tuple(sorted(out.items()))


def check_stop(stop: object) -> tuple[str, ...]:
    """``None``, a string or a list of strings -> the non-empty stop strings (at most 16; an empty string stops
    nothing, so it is dropped before the count)."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise InputError("stop must be a string or a list of strings")
    kept = tuple(s for s in stop if s)
    if len(kept) > MAX_STOPS:
        raise InputError(f"stop must hold at most {MAX_STOPS} strings, got {len(kept)}")
    return kept


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant turn: its id, the function's name and its arguments (a JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """One chat turn: a role and its text (text parts are joined in order); an assistant turn may hold
    ``tool_calls``, a ``tool`` turn the ``tool_call_id`` it answers (and the tool's ``name``)."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The turn as OpenAI's message shape (what a Jinja chat template reads)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def _check_tool_calls(i: int, calls: object) -> tuple[ToolCall, ...]:
    if calls is None:
        return ()
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise InputError(f"messages[{i}].tool_calls must be a list of tool calls")
    out = []
    for j, c in enumerate(calls):
        if isinstance(c, ToolCall):
            out.append(c)
            continue
        fn = c.get("function") if isinstance(c, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InputError(
                f"messages[{i}].tool_calls[{j}] must be {{'id', 'type': 'function', "
                "'function': {'name', 'arguments'}}"
            )
        args = fn.get("arguments", "{}")
        if isinstance(args, Mapping):
            args = json.dumps(args, ensure_ascii=False)
        if not isinstance(args, str):
            raise InputError(f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON string")
        cid = c.get("id") if isinstance(c.get("id"), str) else f"call_{i}_{j}"
        out.append(ToolCall(cid, fn["name"], args))
    return tuple(out)


def _check_messages(messages: object) -> tuple[ChatMessage, ...]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise InputError("messages must be a non-empty list of {'role': ..., 'content': ...} mappings")
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, ChatMessage):
            out.append(m)
            continue
        if not isinstance(m, Mapping):
            raise InputError(f"messages[{i}] must be a mapping with 'role' and 'content'")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise InputError(f"messages[{i}].role must be a non-empty string, got {shown(role)}")
        calls = _check_tool_calls(i, m.get("tool_calls")) if role == "assistant" else ()
        if m.get("tool_calls") and role != "assistant":
            raise InputError(f"messages[{i}].tool_calls: only assistant messages carry tool calls")
        call_id = m.get("tool_call_id")
        if role == "tool" and not isinstance(call_id, str):
            raise InputError(f"messages[{i}].tool_call_id must be a string (the id of the call it answers)")
        if call_id is not None and role != "tool":
            raise InputError(f"messages[{i}].tool_call_id: only tool messages answer a tool call")
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise InputError(f"messages[{i}].name must be a string")
        if content is None and (calls or role == "tool"):
            content = ""
        if isinstance(content, str):
            out.append(ChatMessage(role, content, calls, call_id, name))
            continue
        if not isinstance(content, Sequence) or isinstance(content, bytes) or not content:
            raise InputError(f"messages[{i}].content must be a string or a non-empty list of text parts")
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind != "text":
                raise InputError(
                    f"messages[{i}].content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) "
                    f"are supported here, got type {kind!r}"
                )
            if not isinstance(part.get("text"), str):
                raise InputError(f"messages[{i}].content[{j}].text must be a string")
            texts.append(part["text"])
        out.append(ChatMessage(role, "".join(texts), calls, call_id, name))
    return tuple(out)


def check_tools(tools: object) -> tuple[Mapping[str, Any], ...]:
    """``None`` or a list of OpenAI function tools (``{"type": "function", "function": {"name", ...}}``)."""
    if tools is None:
        return ()
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise InputError("tools must be a list of {'type': 'function', 'function': {...}} objects")
    seen: dict[str, int] = {}
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type") != "function" or not isinstance(fn, Mapping):
            raise InputError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name', 'parameters'}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise InputError(f"tools[{i}].function.name must be a non-empty string")
        if not TOOL_NAME.fullmatch(name):
            shown = ascii(name) if len(name) <= 40 else f"{ascii(name[:30])}... ({len(name)} characters)"
            raise InputError(
                f"tools[{i}].function.name {shown} must match ^{TOOL_NAME.pattern}$ "
                "(ASCII letters, digits, _ and -, at most 64, as OpenAI requires)"
            )
        if name in seen:
            raise InputError(
                f"tools[{i}].function.name {name!r} repeats tools[{seen[name]}]'s: tool names must be unique"
            )
        seen[name] = i
        params = fn.get("parameters")
        if params is not None and not isinstance(params, Mapping):
            raise InputError(f"tools[{i}].function.parameters must be a JSON Schema object")
    return tuple(tools)


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate, validated at construction (``InputError`` naming the field otherwise).

    Exactly one of ``prompt`` (text), ``prompt_tokens`` (token ids, used as given: no BOS is added) or
    ``messages`` (chat turns: ``{"role", "content"}`` with string content or a list of
    ``{"type": "text", "text": ...}`` parts). Sampling options left as ``None`` take the runtime's
    defaults (:data:`DEFAULT_SAMPLING`); ``temperature=0`` is greedy decoding."""

    prompt: str | None = None
    prompt_tokens: tuple[int, ...] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = DEFAULT_SAMPLING["temperature"]
    top_p: float = DEFAULT_SAMPLING["top_p"]
    top_k: int = int(DEFAULT_SAMPLING["top_k"])
    min_p: float = DEFAULT_SAMPLING["min_p"]
    repeat_penalty: float = DEFAULT_SAMPLING["repeat_penalty"]
    frequency_penalty: float = DEFAULT_SAMPLING["frequency_penalty"]
    presence_penalty: float = DEFAULT_SAMPLING["presence_penalty"]
    logit_bias: tuple[tuple[int, float], ...] = field(default=())
    seed: int | None = None
    stop: tuple[str, ...] = field(default=())
    stream: bool = False
    n: int = 1
    grammar: str | None = None  # llama.cpp GBNF (root rule "root") every sampled token must follow
    logprobs: int | None = None  # None: none; k: each token's log-probability and its k most likely rivals
    tools: tuple[Mapping[str, Any], ...] = field(default=())  # OpenAI function tools, rendered into a chat
    tool_choice: str | None = None  # with tools: "auto", "required" or a tool's name (the prompt says which)
    # speculative decoding: "auto" (the engine decides: prompt lookup, or the bundle's draft model where the plan
    # says so, while few slots are busy), "lookup" (prompt lookup whenever the engine may), "draft" (the bundle's
    # draft model: refused at submit by an engine without one), "off"; None: the engine's default
    speculative: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("prompt", "prompt_tokens", "messages") if getattr(self, k) is not None]
        if len(given) != 1:
            raise InputError(
                "a generation request needs exactly one of prompt, prompt_tokens or messages"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.prompt is not None and not isinstance(self.prompt, str):
            raise InputError(f"prompt must be a string, got {type(self.prompt).__name__}")
        if self.prompt is not None:
            check_text(self.prompt, "prompt")
        check_messages_text(self.messages)
        if self.prompt_tokens is not None:
            toks = self.prompt_tokens
            if isinstance(toks, (str, bytes)) or not isinstance(toks, Sequence) or not toks:
                raise InputError("prompt_tokens must be a non-empty list of token ids")
            ids = tuple(int(_number(f"prompt_tokens[{i}]", t, lo=0, integer=True)) for i, t in enumerate(toks))
            object.__setattr__(self, "prompt_tokens", ids)
        if self.messages is not None:
            object.__setattr__(self, "messages", _check_messages(self.messages))
        if isinstance(self.n, bool) or self.n != 1:
            raise InputError(f"n must be 1 (one completion per request), got {shown(self.n)}")
        if not isinstance(self.stream, bool):
            raise InputError(f"stream must be true or false, got {shown(self.stream)}")
        params: dict[str, object] = {k: getattr(self, k) for k in DEFAULT_SAMPLING}
        for k, default in DEFAULT_SAMPLING.items():
            if params[k] is None:
                params[k] = default
        max_tokens, seed = check_sampling(
            DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens, self.seed, params
        )
        object.__setattr__(self, "max_tokens", max_tokens)
        object.__setattr__(self, "seed", seed)
        for k in DEFAULT_SAMPLING:
            if k != "top_k":
                object.__setattr__(self, k, float(params[k]))  # type: ignore[arg-type]  # checked numbers
        object.__setattr__(self, "top_k", int(params["top_k"]))  # type: ignore[call-overload]  # checked
        object.__setattr__(self, "stop", check_stop(self.stop))
        object.__setattr__(self, "logit_bias", check_logit_bias(self.logit_bias))
        if self.grammar is not None and (
            not isinstance(self.grammar, str) or not self.grammar.strip() or len(self.grammar) > MAX_GRAMMAR_CHARS
        ):
            raise InputError(f"grammar must be a non-empty GBNF text of at most {MAX_GRAMMAR_CHARS} characters")
        if self.grammar is not None:
            check_gbnf(self.grammar)  # nesting and repetition within what llama.cpp's parser survives
        if self.logprobs is not None:
            object.__setattr__(
                self, "logprobs", int(_number("logprobs", self.logprobs, lo=0, hi=MAX_TOP_LOGPROBS, integer=True))
            )
        object.__setattr__(self, "tools", check_tools(self.tools or None))
        if self.tools and self.messages is None:
            raise InputError("tools need chat messages (a prompt or prompt_tokens is formatted already)")
        if self.speculative is not None and self.speculative not in SPECULATIVE_MODES:
            modes = ", ".join(SPECULATIVE_MODES)
            raise InputError(f"speculative must be one of {modes}, got {shown(self.speculative)}")
        if self.tool_choice is not None and not isinstance(self.tool_choice, str):
            raise InputError(f"tool_choice must be 'auto', 'required' or a tool's name, got {shown(self.tool_choice)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with neutral penalties, no logit bias and no grammar: the largest logit is the token."""
        return (
            self.greedy
            and not self.logit_bias
            and self.grammar is None
            and all(getattr(self, k) == v for k, v in NEUTRAL_PENALTIES.items())
        )

    @classmethod
    def from_options(
        cls,
        *,
        prompt: str | None = None,
        prompt_tokens: Sequence[int] | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        **options: Any,
    ) -> GenerationRequest:
        """Build from keyword options as ``Session.generate`` takes them (``temp`` = ``temperature``;
        ``None`` values mean the default; an unknown option is an InputError naming it)."""
        named = {("temperature" if k == "temp" else k): v for k, v in options.items()}
        known = {
            "max_tokens",
            "stop",
            "seed",
            "stream",
            "n",
            "logit_bias",
            "grammar",
            "logprobs",
            "tools",
            "tool_choice",
            "speculative",
            *DEFAULT_SAMPLING,
        }
        unknown = set(named) - known
        if unknown:
            raise InputError(
                f"unknown generation option(s): {', '.join(sorted(unknown))} "
                f"(known: max_tokens, stop, seed, stream, logit_bias, grammar, logprobs, tools, "
                f"tool_choice, speculative, {', '.join(DEFAULT_SAMPLING)})"
            )
        kw = {k: v for k, v in named.items() if v is not None or k == "seed"}
        stop = kw.pop("stop", None)
        if "tools" in kw:
            kw["tools"] = check_tools(kw["tools"])
        return cls(
            prompt=prompt,
            prompt_tokens=tuple(prompt_tokens) if prompt_tokens is not None else None,
            messages=tuple(messages) if messages is not None else None,  # type: ignore[arg-type]
            stop=check_stop(stop),
            **kw,
        )

    def sampling(self) -> dict[str, float]:
        """The sampling options as the llama.cpp backends take them."""
        return {k: getattr(self, k) for k in DEFAULT_SAMPLING}

    def telemetry_record(self) -> dict[str, Any]:
        """The options telemetry records (GenAI ``gen_ai.request.*``); penalties only when set (0 is off)."""
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop_sequences": list(self.stop) or None,
            "seed": self.seed,
            "frequency_penalty": self.frequency_penalty or None,
            "presence_penalty": self.presence_penalty or None,
        }
