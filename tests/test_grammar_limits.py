# SPDX-License-Identifier: Apache-2.0
"""Grammars never take the process down (issue 34, item 1).

A ``json_schema`` of ``{"type": "string", "maxLength": 20000}`` became 20,000 nested GBNF groups, and
llama.cpp's recursive parser overflowed an 8 MiB thread stack: SIGSEGV, the whole server gone. Here:

* the bounds themselves (edgesdk/runtime/grammar_limits.py): every repetition a schema can ask for, and the
  GBNF text's nesting, ``{m,n}`` bounds and rule count, refused with one line naming the path and the limit;
  the limits' edges accepted;
* the issue's requests through the real converter and the real llama.cpp parser, in a child process, so a
  crash fails the test instead of ending the test run;
* a fuzz over generated schemas (deep, wide, huge bounds, big enums, patterns with quantifiers, $refs) and
  over generated GBNF: each one goes through ``json_schema_grammar`` / ``GenerationRequest`` and, when
  accepted, through ``compile_grammar`` into llama.cpp in a child process; the child must finish every case.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.errors import InputError
from edgesdk.runtime import grammar_limits as gl
from edgesdk.runtime.requests import GenerationRequest

STR = {"type": "string"}


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "string", "maxLength": 20000}, "schema.maxLength: maxLength 20000 is over the limit of 1000"),
        ({"type": "string", "minLength": 100000}, "schema.minLength: minLength 100000"),
        ({"type": "array", "items": STR, "maxItems": 5000}, "schema.maxItems: maxItems 5000"),
        ({"type": "array", "items": STR, "minItems": 1001}, "schema.minItems: minItems 1001"),
        ({"type": "string", "pattern": "^a{2000}$"}, "schema.pattern: a quantifier's bound 2000"),
        ({"type": "string", "pattern": "^a{1,99999}$"}, "a quantifier's bound 99999"),
        ({"enum": list(range(20000))}, "schema.enum: enum values (all enums together) 20000 is over the limit"),
        ({"enum": ["x" * 200] * 100}, "characters of enum values"),
        (
            {"type": "object", "properties": {"a": {"enum": list(range(600))}, "b": {"enum": list(range(600))}}},
            "schema.properties.b.enum: enum values (all enums together) 1200",
        ),
        ({"type": "object", "properties": {f"p{i}": STR for i in range(1001)}}, "properties 1001"),
        ({"type": "string", "maxLength": 1e30}, "schema.maxLength: maxLength"),
        ({"type": "string", "maxLength": "9"}, "schema.maxLength must be a non-negative integer, got str"),
    ],
)
def test_a_schema_over_a_bound_is_refused_with_its_path(schema, says):
    with pytest.raises(InputError) as err:
        gl.check_schema(schema)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def test_deep_nesting_is_refused():
    schema: dict = STR
    for _ in range(40):
        schema = {"type": "array", "items": schema}
    with pytest.raises(InputError, match="nesting depth 33 is over the limit of 32"):
        gl.check_schema(schema)


def test_the_limits_edges_are_accepted():
    gl.check_schema({"type": "string", "minLength": 1000, "maxLength": 1000, "pattern": "^a{0,1000}$"})
    gl.check_schema({"type": "array", "items": STR, "maxItems": 1000, "minItems": 0})
    gl.check_schema({"enum": list(range(1000))})
    gl.check_schema({"type": "object", "properties": {f"p{i}": STR for i in range(1000)}})
    gl.check_schema({"type": "string", "description": "a{99999}", "examples": ["x" * 50_000]})  # not grammar


def test_gbnf_bounds_and_what_the_scan_skips():
    deep = "root ::= " + '("a" ' * 1025 + ")?" * 1025
    with pytest.raises(InputError, match=r"grammar: group nesting depth 1025 is over the limit of 1024"):
        gl.check_gbnf(deep)
    gl.check_gbnf("root ::= " + '("a" ' * 1024 + ")?" * 1024)
    with pytest.raises(InputError, match=r"a repetition's bound 20000"):
        gl.check_gbnf('root ::= "a"{0,20000}')
    with pytest.raises(InputError, match=r"repetition bounds together 33000"):
        gl.check_gbnf("root ::= " + " ".join(['"a"{0,1000}'] * 33))
    with pytest.raises(InputError, match=r"repetition \{5,2\} has its maximum below its minimum"):
        gl.check_gbnf('root ::= "a"{5,2}')  # llama.cpp allocates without end on it
    with pytest.raises(InputError, match=r"rule count 10001"):
        gl.check_gbnf("\n".join(f'r{i} ::= "a"' for i in range(10001)))
    # parentheses and braces inside literals, character classes and comments are text, not structure
    gl.check_gbnf('root ::= "((((((" [({\\]] "a{99999}" # ((((( {0,99999}\n' * 300)


@pytest.mark.parametrize("source", ["raw", "json_schema"])
def test_the_python_api_refuses_a_deep_grammar_before_llama_cpp(source):
    if source == "raw":
        with pytest.raises(InputError, match="grammar: group nesting depth 20000"):
            GenerationRequest(prompt="x", grammar="root ::= " + '("a" ' * 20000 + ")?" * 20000)
    else:
        pytest.importorskip("llama_cpp")
        from edgesdk.runtime.grammar import json_schema_grammar

        with pytest.raises(InputError, match="maxLength 20000 is over the limit"):
            json_schema_grammar({"type": "string", "maxLength": 20000})


# ------------------------------------------------------------------------------------------- the fuzz

CHILD = r"""
import json, sys
import llama_cpp as ll
from edgesdk.runtime.grammar_limits import compile_grammar
from edgesdk.errors import InputError
mp = ll.llama_model_default_params(); mp.vocab_only = True
model = ll.llama_model_load_from_file(sys.argv[1].encode(), mp)
vocab = ll.llama_model_get_vocab(model)
for i, text in enumerate(json.load(open(sys.argv[2]))):
    print(i, flush=True)  # the case a crash happened in is the last number printed
    try:
        s = compile_grammar(ll, vocab, text)
        ll.llama_sampler_free(s)
    except InputError:
        pass
print("done", flush=True)
"""


def _compile_all(gguf: Path, grammars: list[str], tmp_path: Path) -> None:
    """Every grammar through compile_grammar into llama.cpp in one child process; fail on any crash."""
    cases = tmp_path / "grammars.json"
    cases.write_text(json.dumps(grammars))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(gguf), str(cases)], capture_output=True, text=True, timeout=600, env=env
    )
    lines = proc.stdout.split()
    last = lines[-2] if len(lines) > 1 else "none"
    assert proc.returncode == 0 and lines[-1:] == ["done"], (
        f"llama.cpp died (exit {proc.returncode}) at case {last}: {grammars[int(last)][:300] if last.isdigit() else ''}"
        f"\n{proc.stderr[-2000:]}"
    )


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A JSON Schema drawn from what clients send, attackers included: bounds from 0 to 10^6, enums up to 30,000
    values, patterns with quantifiers, nesting past the limit, $refs."""

    def big() -> int:
        return rng.choice([0, 1, 2, 5, 12, 100, 999, 1000, 1001, 1500, 5000, 20000, 100000, 10**6])

    kind = rng.choice(["string", "integer", "number", "boolean", "enum", "array", "object", "anyOf", "ref", "const"])
    if depth > rng.choice([3, 6, 40]):
        kind = "string"
    if kind == "string":
        s: dict = {"type": "string"}
        if rng.random() < 0.6:
            s["maxLength"] = big()
        if rng.random() < 0.4:
            s["minLength"] = big() if rng.random() < 0.3 else rng.randint(0, 5)
        if rng.random() < 0.3:
            lo = big()
            s = {"type": "string", "pattern": rng.choice([f"^a{{{lo}}}$", f"^[0-9]{{1,{lo}}}$", f"^(ab){{0,{lo}}}c$"])}
        return s
    if kind == "integer":
        lo = rng.randint(-1000, 1000)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.choice([0, 10, 255, 256, 10**6])}
    if kind == "number":
        return {"type": "number"}
    if kind == "boolean":
        return {"type": rng.choice(["boolean", "null", ["string", "null"]])}
    if kind == "enum":
        n = rng.choice([1, 3, 50, 999, 1000, 1001, 20000, 30000])
        return {"enum": [rng.choice([f"v{i}", i, None, True]) for i in range(n)]}
    if kind == "const":
        return {"const": rng.choice(["x", 1, None, {"a": [1, 2]}])}
    if kind == "array":
        a: dict = {"type": "array", "items": random_schema(rng, depth + 1)}
        if rng.random() < 0.7:
            a["maxItems"] = big()
        if rng.random() < 0.5:
            a["minItems"] = rng.randint(0, 4) if rng.random() < 0.7 else big()
        return a
    if kind == "object":
        n = rng.choice([0, 1, 3, 8, 1001])
        props = {f"p{i}": random_schema(rng, depth + 1) if i < 8 else STR for i in range(n)}
        o: dict = {"type": "object", "properties": props}
        if props and rng.random() < 0.7:
            o["required"] = rng.sample(sorted(props), k=min(len(props), rng.randint(0, 3)))
        if rng.random() < 0.3:
            o["additionalProperties"] = rng.choice([False, True, random_schema(rng, depth + 1)])
        return o
    if kind == "anyOf":
        return {
            rng.choice(["anyOf", "oneOf", "allOf"]): [random_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]
        }
    return {"$defs": {"d": random_schema(rng, depth + 1)}, "$ref": "#/$defs/d"}


def random_gbnf(rng: random.Random) -> str:
    """GBNF a Python API caller could pass: deep groups, big {m,n}, long rule chains, plain mistakes."""
    n = rng.choice([1, 10, 500, 1024, 1025, 3000, 20000])
    kind = rng.choice(["nest", "rep", "chain", "alts", "junk"])
    if kind == "nest":
        return "root ::= " + '("a" ' * n + ")?" * n
    if kind == "rep":
        return f'root ::= ("a" | "b"){{{rng.randint(0, 3)},{n}}}'
    if kind == "chain":
        return (
            "root ::= r0\n"
            + "\n".join(f'r{i} ::= r{i + 1} | "x"' for i in range(min(n, 9000)))
            + f'\nr{min(n, 9000)} ::= "y"'
        )
    if kind == "alts":
        return "root ::= " + " | ".join(f'"t{i}"' for i in range(n))
    return rng.choice(["root ::= (", 'root ::= "a"{5,2}', "root ::= [", "root ::= a", 'root ::= "a"{99999999999}'])


@pytest.mark.slow
def test_the_issue_requests_reach_llama_cpp_without_a_crash(gemma_gguf, tmp_path):
    """The issue's schemas (maxLength 5000 / 20000 / 100000, a 20,000-value enum) and the raw GBNF that crashed:
    refused before llama.cpp, and the limits' edges compiled by it, all in one child process that survives."""
    pytest.importorskip("llama_cpp")
    from edgesdk.runtime.grammar import json_schema_grammar

    grammars = []
    for schema in (
        {"type": "string", "maxLength": 5000},
        {"type": "string", "maxLength": 20000},
        {"type": "string", "maxLength": 100000},
        {"enum": [f"value-{i}" for i in range(20000)]},
    ):
        with pytest.raises(InputError, match="over the limit"):
            json_schema_grammar(schema)
    for schema in ({"type": "string", "maxLength": 1000}, {"type": "array", "items": STR, "maxItems": 1000}):
        grammars.append(json_schema_grammar(schema))
    grammars += ["root ::= " + '("a" ' * 20000 + ")?" * 20000, 'root ::= "a"{0,100000}']  # checked in the child
    _compile_all(gemma_gguf, grammars, tmp_path)


def test_fuzz_schemas_and_grammars_never_crash_llama_cpp(gemma_gguf, tmp_path):
    """300 generated schemas and 100 generated GBNF texts (seed EDGESDK_FUZZ_SEED, default 34): each is refused
    with an InputError or compiled by llama.cpp; no other exception, and the child compiling them survives."""
    pytest.importorskip("llama_cpp")
    from edgesdk.runtime.grammar import json_schema_grammar

    rng = random.Random(int(os.environ.get("EDGESDK_FUZZ_SEED", "34")))
    grammars, refused = [], 0
    for _ in range(300):
        schema = random_schema(rng)
        try:
            grammars.append(json_schema_grammar(schema))
        except InputError as exc:
            assert "\n" not in str(exc)
            refused += 1
    for _ in range(100):
        text = random_gbnf(rng)
        try:
            GenerationRequest(prompt="x", grammar=text)
        except InputError:
            refused += 1
            continue
        grammars.append(text)
    assert 50 < refused < 350, refused  # the generator reaches both sides of the limits
    _compile_all(gemma_gguf, grammars, tmp_path)
