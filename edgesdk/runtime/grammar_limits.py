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

import re
import threading
from collections.abc import Mapping
from typing import Any

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


def check_gbnf(text: str, where: str = "grammar") -> None:
    """InputError (one line) for GBNF text whose nesting, repetition or rule count is over the bounds that keep
    llama.cpp's recursive parser within :func:`compile_grammar`'s stack; ``None`` otherwise."""
    depth, biggest, total, rules = _scan(text)
    if depth > MAX_GBNF_DEPTH:
        raise _too_many(where, "group nesting depth", depth, MAX_GBNF_DEPTH)
    if biggest > MAX_GBNF_REPEAT:
        raise _too_many(where, "a repetition's bound", biggest, MAX_GBNF_REPEAT)
    if total > MAX_GBNF_REPEAT_TOTAL:
        raise _too_many(where, "repetition bounds together", total, MAX_GBNF_REPEAT_TOTAL)
    if rules > MAX_GBNF_RULES:
        raise _too_many(where, "rule count", rules, MAX_GBNF_RULES)


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
