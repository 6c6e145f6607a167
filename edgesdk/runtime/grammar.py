# SPDX-License-Identifier: Apache-2.0
"""Structured output and tool calls as llama.cpp grammars (GBNF), and the tool-call reply format.

* :func:`json_schema_grammar` — a JSON Schema as GBNF, by llama-cpp-python's public converter
  (``llama_cpp.llama_grammar.json_schema_to_gbnf``, llama.cpp's ``json-schema-to-grammar``): the engine
  masks every token that would leave the grammar, so the reply parses and follows the schema (unless it is
  cut by ``max_tokens``).
* Tool calls use llama.cpp's *generic* tool format (what ``llama-server --jinja`` falls back to for a
  template with no tool syntax of its own): the reply is one JSON object, either
  ``{"tool_call": {"name": ..., "arguments": {...}}}`` or, when the model may answer in words
  (``tool_choice: "auto"``), ``{"response": "..."}``. :func:`tool_grammar` builds its grammar from the
  tools' parameter schemas; :func:`parse_tool_reply` reads a reply back.
* A chat template that does not render ``tools`` (Gemma's does not) gets them from
  :func:`tool_preamble`, a system turn listing the tools and the reply format, and earlier tool calls and
  tool results as JSON turns (:func:`generic_tool_messages`), as llama.cpp's generic format does.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from edgesdk.errors import InputError
from edgesdk.native import import_llama_cpp
from edgesdk.runtime.grammar_limits import (
    check_gbnf,
    check_satisfiable,
    check_schema,
    type_allows,
)

ANY_OBJECT: dict[str, Any] = {"type": "object"}
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


#: Validation keywords llama-cpp-python's converter does not turn into grammar: a schema using them is refused
#: rather than half-enforced (integer bounds spanning at most MAX_INT_RANGE values become an enum instead).
UNENFORCED = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "dependentRequired",
    "dependentSchemas",
)
MAX_INT_RANGE = 256
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def enforceable(schema: Any, where: str = "schema") -> Any:
    """``schema`` with small integer ranges as enums; InputError naming the first keyword the grammar cannot
    enforce (:data:`UNENFORCED`)."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    if isinstance(out.get("type"), list):  # the converter drops the other keywords of a type list: one each
        types = out.pop("type")
        return enforceable({"anyOf": [{**out, "type": t} for t in types]}, where)
    bounds = [k for k in ("minimum", "maximum") if k in out]
    if (
        out.get("type") == "integer"
        and len(bounds) == 2
        and not isinstance(out["minimum"], bool)
        and isinstance(out["minimum"], int | float)
        and isinstance(out["maximum"], int | float)
        and 0 <= out["maximum"] - out["minimum"] < MAX_INT_RANGE
    ):
        lo, hi = math.ceil(out.pop("minimum")), math.floor(out.pop("maximum"))
        out.pop("type")
        out["enum"] = list(range(lo, hi + 1))
    if isinstance(out.get("enum"), list) and isinstance(out.get("type"), str):  # the converter ignores the type
        out["enum"] = [v for v in out["enum"] if type_allows(frozenset({out["type"]}), v)]
    if isinstance(out.get("allOf"), list):
        _check_all_of(out, where)
    for key in UNENFORCED:
        if key in out:
            raise InputError(
                f"{where}.{key}: the grammar cannot enforce '{key}' (only integer ranges of at most "
                f"{MAX_INT_RANGE} values, with both minimum and maximum); leave it out"
            )
    if isinstance(out.get("properties"), Mapping):  # an optional property of schema false: left out
        out["properties"] = {k: v for k, v in out["properties"].items() if v is not False}
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: enforceable(v, f"{where}.{key}.{k}") for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [enforceable(v, f"{where}.{key}[{i}]") for i, v in enumerate(out[key])]
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), Mapping):
            out[key] = enforceable(out[key], f"{where}.{key}")
    return out


def _check_all_of(schema: Mapping[str, Any], where: str) -> None:
    """InputError unless the converter can merge ``schema``'s allOf: it merges the properties of object
    members only (anything else became ``{ }``: ``allOf [string, integer]``), and a property two members define
    would be asked for twice."""
    if schema.get("type", "object") != "object" or any(k in schema for k in ("properties", "anyOf", "oneOf")):
        raise InputError(
            f"{where}.allOf: the grammar can only merge allOf members that are objects with properties, alone "
            "(no type but object, no properties, anyOf or oneOf beside it)"
        )
    seen: dict[str, int] = {}
    for i, member in enumerate(schema["allOf"]):
        if not isinstance(member, Mapping) or (
            "$ref" not in member
            and (member.get("type", "object") != "object" or not isinstance(member.get("properties"), Mapping))
        ):
            raise InputError(
                f"{where}.allOf[{i}]: the grammar can only merge allOf members that are objects with properties"
            )
        for name in member.get("properties") or {}:
            if name in seen:
                raise InputError(
                    f"{where}.allOf[{i}].properties.{str(name)[:40]}: also defined by allOf[{seen[name]}]; the "
                    "grammar cannot merge two schemas of one property"
                )
            seen[name] = i


def json_schema_grammar(schema: Mapping[str, Any], where: str = "schema") -> str:
    """GBNF (root rule ``root``) for JSON documents valid under ``schema``; InputError when the converter
    cannot take it (a keyword it cannot enforce, a remote ``$ref``, a pattern without ``^...$``)."""
    if not isinstance(schema, Mapping):
        raise InputError(f"the JSON schema must be an object, got {type(schema).__name__}")
    check_schema(schema, where)  # every repetition bounded before the converter or llama.cpp sees it
    check_satisfiable(schema, where)  # a schema no value satisfies: 400, not a reply that breaks it
    convert = import_llama_cpp("llama_grammar").json_schema_to_gbnf
    schema = enforceable(schema, where)
    try:
        text = str(convert(json.dumps(schema)))
    except RecursionError:
        raise InputError(f"{where}: the JSON schema nests too deeply to become a grammar") from None
    except Exception as exc:  # noqa: BLE001 - the converter raises anything on a schema it cannot take
        raise InputError(f"the JSON schema cannot be turned into a grammar ({type(exc).__name__}: {exc})") from None
    # This converter's string characters admit raw control characters, which JSON forbids inside strings
    # (json.loads refuses them): exclude them, as llama.cpp's current converter does.
    text = text.replace(_LOOSE_CHAR, _JSON_CHAR)
    matches = check_gbnf(text, where)
    if matches in ("nothing", "empty"):
        raise InputError(
            f"{where}: the schema's grammar matches {'no text' if matches == 'nothing' else 'only empty text'}, "
            "so no reply could follow it"
        )
    return text


@functools.cache
def json_object_grammar() -> str:
    """GBNF for any JSON object (``response_format: {"type": "json_object"}``): the same text every time, converted
    once."""
    return json_schema_grammar(ANY_OBJECT)


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = tool.get("function")
    return fn if isinstance(fn, Mapping) else {}


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn = _function(tool)
    params = fn.get("parameters") or ANY_OBJECT
    return {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, "arguments": params},
        "required": ["name", "arguments"],
    }


def tool_schema(tools: Sequence[Mapping[str, Any]], choice: str | None) -> dict[str, Any]:
    """The JSON Schema of a reply: ``choice`` is "required" (a call to any of ``tools``), "auto" (a call or
    ``{"response": text}``) or a tool name (a call to that one)."""
    chosen = [t for t in tools if choice in ("auto", "required") or _function(t).get("name") == choice]
    if not chosen:
        raise InputError(f"tool_choice names {choice!r}, which is not one of the tools")
    calls = [_call_schema(t) for t in chosen]
    call = {
        "type": "object",
        "properties": {"tool_call": calls[0] if len(calls) == 1 else {"anyOf": calls}},
        "required": ["tool_call"],
    }
    if choice != "auto":
        return call
    text = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
    return {"anyOf": [call, text]}


def tool_grammar(tools: Sequence[Mapping[str, Any]], choice: str | None) -> str:
    for i, t in enumerate(tools):  # refused with the tool's own path in the message
        params = _function(t).get("parameters") or ANY_OBJECT
        check_satisfiable(params, f"tools[{i}].function.parameters")
        enforceable(params, f"tools[{i}].function.parameters")
    return json_schema_grammar(tool_schema(tools, choice))


def tool_preamble(tools: Sequence[Mapping[str, Any]], choice: str | None, *, list_tools: bool = True) -> str:
    """The system text that tells the model its tools and the reply format (``list_tools=False``: the format
    only, for a template that renders the tools itself)."""
    specs = [
        {
            "name": _function(t).get("name"),
            "description": _function(t).get("description", ""),
            "parameters": _function(t).get("parameters") or ANY_OBJECT,
        }
        for t in tools
    ]
    out = []
    if list_tools:
        out.append("You can call these tools:\n" + json.dumps(specs, ensure_ascii=False, indent=2) + "\n")
    call = '{"tool_call": {"name": "<tool name>", "arguments": {<the arguments>}}}'
    if choice == "auto":
        out.append(
            f"Reply with one JSON object: {call} to call a tool, or "
            '{"response": "<your answer>"} to answer without one.'
        )
    else:
        name = choice if choice not in (None, "required") else "<tool name>"
        out.append("Reply with one JSON object calling a tool: " + call.replace("<tool name>", str(name)))
    return "\n".join(out)


def generic_tool_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat turns for a template that knows no tool syntax: an assistant turn's tool calls become its
    content as the generic JSON format, a ``tool`` turn becomes a user turn holding
    ``{"tool_response": {"tool": name, "content": ...}}``."""
    names = {}
    out: list[dict[str, Any]] = []
    for m in messages:
        calls: list[Any] = list(m.get("tool_calls") or [])
        if m.get("role") == "assistant" and calls:
            parsed = []
            for c in calls:
                fn = c["function"]
                names[c.get("id")] = fn["name"]
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    args = fn.get("arguments")
                parsed.append({"name": fn["name"], "arguments": args})
            body = {"tool_call": parsed[0]} if len(parsed) == 1 else {"tool_calls": parsed}
            text = (str(m.get("content") or "") + "\n" if m.get("content") else "") + json.dumps(
                body, ensure_ascii=False
            )
            out.append({"role": "assistant", "content": text})
        elif m.get("role") == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id"), "")
            out.append(
                {
                    "role": "user",
                    "content": json.dumps(
                        {"tool_response": {"tool": name, "content": m.get("content", "")}}, ensure_ascii=False
                    ),
                }
            )
        else:
            out.append({"role": m["role"], "content": m.get("content", "")})
    return out


def with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """``messages`` with ``text`` added to the first system turn (or a new system turn first)."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def parse_tool_reply(text: str) -> tuple[list[tuple[str, str]], str | None]:
    """A reply in the generic tool format -> (tool calls as (name, arguments JSON text), text content).
    A reply that is not such JSON (cut by ``max_tokens``) is text content with no calls."""
    try:
        data = json.loads(text)
    except ValueError:
        return [], text
    if not isinstance(data, dict):
        return [], text
    many, one = data.get("tool_calls"), data.get("tool_call")
    calls: list[Any] = many if isinstance(many, list) else [one] if isinstance(one, dict) else []
    out = [
        (str(c.get("name")), json.dumps(c.get("arguments", {}), ensure_ascii=False))
        for c in calls
        if isinstance(c, dict) and isinstance(c.get("name"), str)
    ]
    if out:
        return out, None
    if isinstance(data.get("response"), str):
        return [], data["response"]
    return [], text
