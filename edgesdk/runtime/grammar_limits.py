# SPDX-License-Identifier: Apache-2.0
"""Bounds on what a grammar may ask of llama.cpp, checked before any native code sees it.

llama.cpp's GBNF parser is recursive: every nested group ``( ... )`` is one more level of C++ recursion, and a
JSON Schema ``maxLength: 20000`` becomes 20,000 nested optional groups in the converter's output
(``(char (char (char ...)?)?)?``). Parsed on a thread with the usual 8 MiB stack, that overflows the stack and
the process dies with SIGSEGV: one 200-byte request took the whole server down. Three layers keep it out:

1. :func:`check_schema` bounds every repetition a JSON Schema can ask for (``maxLength`` / ``minLength``,
   ``maxItems`` / ``minItems``, ``pattern`` quantifiers, ``enum`` values and their text, properties, nesting
   and the schema's own size) with a one-line error naming the keyword's path and the limit;
2. :func:`check_gbnf` bounds the GBNF text itself, whoever wrote it (a schema's converter or a caller of the
   Python API): group nesting depth, ``{m,n}`` repetition counts and their sum, rule count and alternatives;
3. :func:`compile_grammar` hands the text to ``llama_sampler_init_grammar`` on a thread of its own with a
   :data:`COMPILE_STACK_BYTES` stack, sized from a measurement of what one nesting level costs
   (:data:`STACK_BYTES_PER_LEVEL`, ``tools/bench/grammar_stack.py``), so the depth bound of (2) holds with a
   margin of :data:`STACK_MARGIN` and more.

The limits are in docs/security.md with the error a client gets.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Mapping
from typing import Any, TypeGuard

from edgesdk.errors import InputError

#: ``maxLength``/``minLength``/``maxItems``/``minItems`` and a pattern's ``{m,n}``: at most this many repeats
#: (llama.cpp itself refuses the converter's grammar for a string of maxLength 1500: "number of rules that are
#: going to be repeated ... exceeds sane defaults"; 1000 compiles).
MAX_SCHEMA_REPEAT = 1000
MAX_ENUM_VALUES = 1000  # enum / const values in one schema, all enums together (OpenAI's structured-output cap)
MAX_ENUM_CHARS = 15_000  # their JSON text together (OpenAI's cap for large string enums)
MAX_SCHEMA_PROPERTIES = 1000  # object properties in one schema, all objects together
MAX_SCHEMA_DEPTH = 32  # nesting of subschemas (OpenAI allows 10 levels of objects)
MAX_SCHEMA_NODES = 5000  # subschemas in one schema
MAX_PATTERN_CHARS = 1000  # one pattern's length

#: GBNF text: nested groups (the parser's recursion), one ``{m,n}`` bound, all of them together, rules.
MAX_GBNF_DEPTH = 1024
MAX_GBNF_REPEAT = MAX_SCHEMA_REPEAT
MAX_GBNF_REPEAT_TOTAL = 32_768
MAX_GBNF_RULES = 10_000
#: Measured (tools/bench/grammar_stack.py, llama-cpp-python 0.3.36, x86_64, results/grammar_stack_cpu.json): a
#: 1 MiB stack survives 2,304 nested groups, 8 MiB 18,688 (455 and 449 bytes per level); the default 8 MiB
#: stack died at 20,000 levels: maxLength 20000. The compile thread's stack holds MAX_GBNF_DEPTH levels
#: at least STACK_MARGIN times (64 MiB: 140 times).
STACK_BYTES_PER_LEVEL = 456
STACK_MARGIN = 16
COMPILE_STACK_BYTES = max(64 << 20, MAX_GBNF_DEPTH * STACK_BYTES_PER_LEVEL * STACK_MARGIN)

_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def _too_many(where: str, what: str, got: int, limit: int) -> InputError:
    return InputError(f"{where}: {what} {got} is over the limit of {limit} (docs/security.md)")


def check_schema(schema: Any, where: str = "schema") -> None:
    """InputError (one line, naming the path and the limit) for a JSON Schema asking for more repetition,
    enum values, properties, nesting or size than a grammar may hold; ``None`` when it is within bounds."""
    counts = {"nodes": 0, "enum": 0, "enum_chars": 0, "properties": 0}

    def walk(node: Any, path: str, depth: int) -> None:
        if isinstance(node, list):  # a list of subschemas (anyOf, prefixItems, items as a list)
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]", depth)
            return
        if not isinstance(node, Mapping):
            return
        counts["nodes"] += 1
        if counts["nodes"] > MAX_SCHEMA_NODES:
            raise _too_many(where, "the schema's subschema count", counts["nodes"], MAX_SCHEMA_NODES)
        if depth > MAX_SCHEMA_DEPTH:
            raise _too_many(path, "nesting depth", depth, MAX_SCHEMA_DEPTH)
        for key in ("maxLength", "minLength", "maxItems", "minItems"):
            value = node.get(key)
            if isinstance(value, bool) or value is None:
                continue
            if not isinstance(value, int | float):
                raise InputError(f"{path}.{key} must be a non-negative integer, got {type(value).__name__}")
            if value > MAX_SCHEMA_REPEAT:
                raise _too_many(f"{path}.{key}", key, int(value) if value < 1e18 else -1, MAX_SCHEMA_REPEAT)
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            if len(pattern) > MAX_PATTERN_CHARS:
                raise _too_many(f"{path}.pattern", "pattern length", len(pattern), MAX_PATTERN_CHARS)
            for m in _QUANTIFIER.finditer(pattern):
                for bound in m.groups():
                    if bound and int(bound) > MAX_SCHEMA_REPEAT:
                        raise _too_many(f"{path}.pattern", "a quantifier's bound", int(bound), MAX_SCHEMA_REPEAT)
        values = node.get("enum")
        if isinstance(values, list):
            counts["enum"] += len(values)
            if counts["enum"] > MAX_ENUM_VALUES:
                raise _too_many(f"{path}.enum", "enum values (all enums together)", counts["enum"], MAX_ENUM_VALUES)
            counts["enum_chars"] += sum(len(repr(v)) for v in values)
            if counts["enum_chars"] > MAX_ENUM_CHARS:
                raise _too_many(f"{path}.enum", "characters of enum values", counts["enum_chars"], MAX_ENUM_CHARS)
        props = node.get("properties")
        if isinstance(props, Mapping):
            counts["properties"] += len(props)
            if counts["properties"] > MAX_SCHEMA_PROPERTIES:
                raise _too_many(f"{path}.properties", "properties", counts["properties"], MAX_SCHEMA_PROPERTIES)
        for key, value in node.items():
            if key in ("enum", "const", "default", "examples", "pattern", "description", "title"):
                continue
            if isinstance(value, Mapping | list):
                walk(value, f"{path}.{key}", depth + 1)

    walk(schema, where, 0)


def _scan(text: str) -> tuple[int, int, int, int]:
    """(deepest group nesting, largest ``{m,n}`` bound, sum of the bounds, rule definitions) of GBNF text;
    string literals, character classes and comments are skipped as the parser skips them."""
    depth = deepest = biggest = total = rules = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "[":
            end = '"' if c == '"' else "]"
            i += 1
            while i < n and text[i] != end:
                i += 2 if text[i] == "\\" else 1
        elif c == "#":
            while i < n and text[i] not in "\r\n":
                i += 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth = max(0, depth - 1)
        elif c == "{":
            m = _QUANTIFIER.match(text, i)
            if m:
                if m.group(2) and int(m.group(2)) < int(m.group(1)):  # llama.cpp loops on {5,2}: refused
                    raise InputError(f"grammar: repetition {m.group(0)} has its maximum below its minimum")
                bound = max(int(m.group(1)), int(m.group(2) or 0))
                biggest = max(biggest, bound)
                total += bound
                i = m.end() - 1
        elif c == ":" and text.startswith("::=", i):
            rules += 1
            i += 2
        i += 1
    return deepest, biggest, total, rules


@functools.lru_cache(maxsize=16)
def _gbnf_facts(text: str) -> tuple[int, int, int, int, str | None]:
    """:func:`_scan` and :func:`grammar_language` of ``text``, remembered: one request's grammar is checked where it
    is made (the schema converter), in its GenerationRequest and before llama.cpp compiles it."""
    return (*_scan(text), grammar_language(text))


def check_gbnf(text: str, where: str = "grammar") -> str | None:
    """InputError (one line) for GBNF text whose nesting, repetition or rule count is over the bounds that keep
    llama.cpp's recursive parser within :func:`compile_grammar`'s stack, or whose root derives no text; else what
    its root derives (:func:`grammar_language`)."""
    depth, biggest, total, rules, language = _gbnf_facts(text)
    if depth > MAX_GBNF_DEPTH:
        raise _too_many(where, "group nesting depth", depth, MAX_GBNF_DEPTH)
    if biggest > MAX_GBNF_REPEAT:
        raise _too_many(where, "a repetition's bound", biggest, MAX_GBNF_REPEAT)
    if total > MAX_GBNF_REPEAT_TOTAL:
        raise _too_many(where, "repetition bounds together", total, MAX_GBNF_REPEAT_TOTAL)
    if rules > MAX_GBNF_RULES:
        raise _too_many(where, "rule count", rules, MAX_GBNF_RULES)
    if language == "nothing":  # llama.cpp would take it and mask every token
        raise InputError(f"{where}: the root rule derives no text (each alternative needs a rule that never ends)")
    return language


_STACK_LOCK = threading.Lock()


def big_stack_thread(target: Any, name: str) -> threading.Thread:
    """A started daemon thread running ``target()`` with a :data:`COMPILE_STACK_BYTES` stack (reserved address
    space; pages are touched only as deep as the calls go). The batch engine's thread is one: grammar samplers
    run there."""
    with _STACK_LOCK:  # threading.stack_size is process-wide: set, start, restore
        old = threading.stack_size(COMPILE_STACK_BYTES)
        try:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
        finally:
            threading.stack_size(old)
    return t


def on_big_stack(fn: Any, *args: Any, name: str = "edgesdk-grammar") -> Any:
    """``fn(*args)`` on a new :func:`big_stack_thread`; its exception is raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
            box["error"] = exc

    big_stack_thread(run, name).join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def compile_grammar(ll: Any, vocab: Any, text: str) -> Any:
    """``llama_sampler_init_grammar(vocab, text, "root")`` after :func:`check_gbnf`, on a big-stack thread;
    InputError when the parser refuses the text."""
    check_gbnf(text)
    sampler = on_big_stack(ll.llama_sampler_init_grammar, vocab, text.encode("utf-8"), b"root")
    if not sampler:
        raise InputError("grammar does not compile (llama.cpp GBNF parser refused it)")
    return sampler


# ------------------------------------------------------------------------------ schemas no value satisfies

#: ``(lower, upper)`` keyword pairs of a JSON Schema: a lower bound above its upper bound admits no value.
_BOUND_PAIRS = (
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
    ("minContains", "maxContains"),
    ("minimum", "maximum"),
)
_JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "array", "object"})


def json_type(value: Any) -> str:
    """The JSON Schema type of a JSON value (``1`` and ``1.0`` are "integer", as JSON Schema counts them)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def type_allows(types: frozenset[str], value: Any) -> bool:
    """Whether a value is of one of ``types`` ("number" admits integers)."""
    t = json_type(value)
    return t in types or (t == "integer" and "number" in types)


def _num(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _types(node: Mapping[str, Any]) -> frozenset[str] | None:
    """The types ``node`` admits by ``type``, ``const`` and ``enum`` (None: any)."""
    out: frozenset[str] | None = None
    t = node.get("type")
    if isinstance(t, str):
        out = frozenset({t})
    elif isinstance(t, list):
        out = frozenset(x for x in t if isinstance(x, str))
    if "const" in node:
        c = node["const"]
        out = frozenset({json_type(c)} if out is None else {json_type(c)} if type_allows(out, c) else set())
    elif isinstance(node.get("enum"), list):
        got = {json_type(v) for v in node["enum"] if out is None or type_allows(out, v)}
        out = frozenset(got)
    if out is not None and "number" in out:
        out = out | {"integer"}
    return out


def _unsat(path: str, why: str) -> InputError:
    return InputError(f"{path}: {why}: no value satisfies the schema, so no reply could follow it")


def check_satisfiable(schema: Any, where: str = "schema") -> None:
    """InputError (one line, naming the path) for a JSON Schema no JSON value satisfies, or one whose
    constraints the grammar converter would silently drop so that the reply breaks them: a lower bound above its
    upper bound (``minLength`` / ``maxLength``, ``minItems`` / ``maxItems``, ``minimum`` / ``maximum``, ...), an
    integer range holding no integer, an empty ``type`` list, ``enum``, ``anyOf`` or ``oneOf``, a ``const`` or
    every ``enum`` value outside the ``type``, a ``const`` outside the ``enum``, ``allOf`` members of
    contradictory types, ``false`` where a value is required, a ``required`` property the object does not
    define. OpenAI's strict mode refuses such schemas; the converter turned them into a grammar whose replies
    broke them (``minLength 10, maxLength 2`` -> 10 characters; ``allOf [string, integer]`` -> ``{ }``)."""

    def walk(node: Any, path: str, depth: int) -> None:
        if depth > MAX_SCHEMA_DEPTH:  # check_schema refuses it first; bounded here too
            return
        if node is False:
            raise _unsat(path, "the schema is false")
        if not isinstance(node, Mapping):
            return
        t = node.get("type")
        if isinstance(t, list) and not t:
            raise _unsat(f"{path}.type", "the type list is empty")
        for name in [t] if isinstance(t, str) else t if isinstance(t, list) else []:
            if name not in _JSON_TYPES:
                raise InputError(f"{path}.type: {str(name)[:40]!r} is not a JSON Schema type")
        for lo_key, hi_key in _BOUND_PAIRS:
            low, high = node.get(lo_key), node.get(hi_key)
            if _num(low) and _num(high) and low > high:
                raise _unsat(f"{path}.{lo_key}", f"{lo_key} {low} is above {hi_key} {high}")
        lows: list[float] = [v for v in (node.get("minimum"), node.get("exclusiveMinimum")) if _num(v)]
        highs: list[float] = [v for v in (node.get("maximum"), node.get("exclusiveMaximum")) if _num(v)]
        lo, hi = max(lows, default=None), min(highs, default=None)
        if lo is not None and hi is not None:
            lo_in = not (_num(node.get("exclusiveMinimum")) and node["exclusiveMinimum"] == lo)
            hi_in = not (_num(node.get("exclusiveMaximum")) and node["exclusiveMaximum"] == hi)
            if lo > hi or (lo == hi and not (lo_in and hi_in)):
                raise _unsat(path, f"the range from {lo} to {hi} is empty")
            if t == "integer":
                first = math.ceil(lo) if lo_in or lo != math.ceil(lo) else int(lo) + 1
                last = math.floor(hi) if hi_in or hi != math.floor(hi) else int(hi) - 1
                if first > last:
                    raise _unsat(path, f"no integer lies between {lo} and {hi}")
        declared = _types({"type": t}) if t is not None else None
        if "enum" in node:
            values = node["enum"]
            if isinstance(values, list) and not values:
                raise _unsat(f"{path}.enum", "the enum is empty")
            if isinstance(values, list) and declared is not None and not any(type_allows(declared, v) for v in values):
                raise _unsat(f"{path}.enum", f"no enum value is of type {'/'.join(sorted(declared))}")
        if "const" in node:
            c = node["const"]
            if declared is not None and not type_allows(declared, c):
                raise _unsat(f"{path}.const", f"{json_type(c)} const is not of type {'/'.join(sorted(declared))}")
            if isinstance(node.get("enum"), list) and c not in node["enum"]:
                raise _unsat(f"{path}.const", "the const is not one of the enum's values")
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and not node[key]:
                raise _unsat(f"{path}.{key}", f"{key} is empty")
        members = node.get("allOf")
        if isinstance(members, list):
            seen: frozenset[str] | None = _types(node)
            for i, member in enumerate(members):
                if member is False:
                    raise _unsat(f"{path}.allOf[{i}]", "the schema is false")
                mt = _types(member) if isinstance(member, Mapping) else None
                if mt is None:
                    continue
                both = mt if seen is None else seen & mt
                if not both:
                    before = "/".join(sorted(seen or ())) or "nothing"
                    raise _unsat(
                        f"{path}.allOf[{i}]", f"its type {'/'.join(sorted(mt))} contradicts {before} before it"
                    )
                seen = both
        props = node.get("properties")
        required = node.get("required")
        if isinstance(required, list):
            defined = props if isinstance(props, Mapping) else {}
            for name in required:
                if defined.get(name) is False:
                    raise _unsat(f"{path}.properties.{name}", "a required property's schema is false")
                if isinstance(name, str) and name not in defined and not ("allOf" in node or "$ref" in node):
                    extra = node.get("additionalProperties")
                    why = "additionalProperties is false" if extra is False else "the grammar cannot add it"
                    raise InputError(
                        f"{path}.required: {name[:40]!r} is not one of the properties ({why}); define it in "
                        "'properties'"
                    )
        if (
            node.get("items") is False
            and _num(node.get("minItems"))
            and node["minItems"] > len(node.get("prefixItems") or [])
        ):
            raise _unsat(f"{path}.items", "items is false while minItems asks for more")
        for key, value in node.items():
            if key in ("enum", "const", "default", "examples", "required", "not"):
                continue
            if isinstance(value, Mapping) and key in ("properties", "$defs", "definitions", "dependentSchemas"):
                for k, v in value.items():
                    if v is not False:  # an optional property may be false: it is then left out
                        walk(v, f"{path}.{key}.{k}", depth + 1)
            elif isinstance(value, Mapping):
                walk(value, f"{path}.{key}", depth + 1)
            elif isinstance(value, list) and key in ("anyOf", "oneOf", "allOf", "prefixItems"):
                for i, v in enumerate(value):
                    walk(v, f"{path}.{key}[{i}]", depth + 1)

    walk(schema, where, 0)


# ------------------------------------------------------------------------------ grammars that match nothing

_GBNF_TOKEN = re.compile(
    r'\s+|#[^\r\n]*|(?P<lit>"(?:\\.|[^"\\])*")|(?P<cls>\[(?:\\.|[^\]\\])*\])|(?P<def>::=)'
    r"|(?P<name>[a-zA-Z0-9_-]+)|(?P<rep>\{\s*\d+\s*(?:,\s*\d*\s*)?\})|(?P<op>[()|?*+.])",
    re.S,
)


def _gbnf_rules(text: str) -> dict[str, list[Any]] | None:
    """Rule name -> token list of its body (``None`` when the text does not lex: llama.cpp says why)."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _GBNF_TOKEN.match(text, pos)
        if not m:
            return None
        pos = m.end()
        if m.lastgroup:
            tokens.append((m.lastgroup, m.group(m.lastgroup)))
    rules: dict[str, list[Any]] = {}
    current: list[Any] | None = None
    for i, tok in enumerate(tokens):
        if tok[0] == "name" and i + 1 < len(tokens) and tokens[i + 1][0] == "def":
            current = rules.setdefault(tok[1], [])
            if current:
                current.append(("op", "|"))  # a rule defined twice: its alternatives together
        elif tok[0] != "def" and current is not None:
            current.append(tok)
    return rules


def _gbnf_eval(tokens: list[Any], known: dict[str, tuple[bool, bool]]) -> tuple[bool, bool] | None:
    """(derives some text, derives some non-empty text) of a rule body, given what ``known`` says of its rules;
    ``None`` when it does not parse. Iterative (a stack of open groups): the converter nests 1,000 groups."""
    # a frame: [alternatives derive text, ... non-empty text, this sequence derives text, ... non-empty text]
    stack = [[False, False, True, False]]
    pos = 0
    while pos < len(tokens):
        kind, value = tokens[pos]
        pos += 1
        frame = stack[-1]
        if (kind, value) == ("op", "("):
            stack.append([False, False, True, False])
            continue
        if (kind, value) == ("op", "|"):
            frame[0], frame[1] = frame[0] or frame[2], frame[1] or frame[3]
            frame[2], frame[3] = True, False
            continue
        if (kind, value) == ("op", ")"):
            if len(stack) == 1:
                return None
            stack.pop()
            ap, an = frame[0] or frame[2], frame[1] or frame[3]
            frame = stack[-1]
        elif kind == "lit":
            ap, an = True, len(value) > 2
        elif kind == "cls" or (kind, value) == ("op", "."):
            ap, an = True, True
        elif kind == "name":
            ap, an = known.get(value, (False, False))
        else:
            return None
        while pos < len(tokens) and (tokens[pos][0] == "rep" or tokens[pos][1] in ("?", "*", "+")):
            op = tokens[pos][1]
            pos += 1
            m = _QUANTIFIER.match(op)
            low = int(m.group(1)) if m else 1 if op == "+" else 0
            high = int(m.group(2)) if m and m.group(2) else None if (m is None or "," in op) else low
            if low == 0:
                ap, an = True, an and high != 0
        frame[2], frame[3] = frame[2] and ap, (frame[2] and ap) and (frame[3] or an)
    if len(stack) != 1:
        return None
    frame = stack[0]
    return frame[0] or frame[2], frame[1] or frame[3]


def grammar_language(text: str) -> str | None:
    """ "nothing" when the root rule of GBNF ``text`` derives no text at all (a rule that only ever refers to
    itself, an undefined rule), "empty" when it derives only the empty text, "some" otherwise; ``None`` when the
    text does not parse here (llama.cpp then says why). A worklist over the rules: linear in the text."""
    rules = _gbnf_rules(text)
    if rules is None or "root" not in rules:
        return None
    users: dict[str, set[str]] = {name: set() for name in rules}
    for name, body in rules.items():
        for kind, value in body:
            if kind == "name" and value in users:
                users[value].add(name)
    known: dict[str, tuple[bool, bool]] = {}
    todo = list(rules)
    while todo:
        name = todo.pop()
        got = _gbnf_eval(rules[name], known)
        if got is None:
            return None
        if got != known.get(name, (False, False)):
            known[name] = got
            todo.extend(users[name])
    p, n = known.get("root", (False, False))
    return "some" if n else "empty" if p else "nothing"
