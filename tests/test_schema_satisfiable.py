# SPDX-License-Identifier: Apache-2.0
"""A JSON Schema no value satisfies is a 400, not a reply that breaks it (issue 34, item 8).

``minLength 10 > maxLength 2`` became a grammar for 10 characters and ``allOf [string, integer]`` one for ``{ }``;
both replies ended with ``finish_reason: "stop"`` while breaking the schema. OpenAI's strict mode refuses such
schemas: so do ``check_satisfiable`` (edgesdk/runtime/grammar_limits.py) and ``json_schema_grammar``, with one
line naming the path; a converter output that matches no text or only empty text is refused too.
"""

from __future__ import annotations

import pytest

from edgesdk.errors import InputError
from edgesdk.runtime import grammar_limits as gl

pytest.importorskip("llama_cpp")

from edgesdk.runtime.grammar import json_schema_grammar, tool_grammar  # noqa: E402
from edgesdk.serve.protocol import APIError, parse  # noqa: E402
from edgesdk.serve.schemas import ChatCompletionRequest  # noqa: E402

STR = {"type": "string"}
OBJ_A = {"type": "object", "properties": {"a": STR}}

UNSATISFIABLE = [
    ({"type": "string", "minLength": 10, "maxLength": 2}, "schema.minLength: minLength 10 is above maxLength 2"),
    ({"type": "array", "items": STR, "minItems": 3, "maxItems": 1}, "schema.minItems: minItems 3 is above maxItems"),
    ({"type": "integer", "minimum": 5, "maximum": 2}, "schema.minimum: minimum 5 is above maximum 2"),
    ({"type": "integer", "minimum": 1.2, "maximum": 1.8}, "schema: no integer lies between 1.2 and 1.8"),
    ({"type": "number", "exclusiveMinimum": 3, "maximum": 3}, "schema: the range from 3 to 3 is empty"),
    ({"allOf": [STR, {"type": "integer"}]}, "schema.allOf[1]: its type integer contradicts string"),
    ({"type": "string", "allOf": [{"type": "object"}]}, "schema.allOf[0]: its type object contradicts string"),
    ({"enum": []}, "schema.enum: the enum is empty"),
    ({"type": "string", "enum": [1, 2]}, "schema.enum: no enum value is of type string"),
    ({"type": "string", "const": 3}, "schema.const: integer const is not of type string"),
    ({"const": "x", "enum": ["y"]}, "schema.const: the const is not one of the enum's values"),
    ({"anyOf": []}, "schema.anyOf: anyOf is empty"),
    ({"type": []}, "schema.type: the type list is empty"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "schema.properties.a: a required property"),
    (
        {
            "type": "object",
            "properties": {"x": {"type": "object", "properties": {"y": {"maxLength": 1, "minLength": 2}}}},
        },
        "schema.properties.x.properties.y.minLength: minLength 2 is above maxLength 1",
    ),
    ({"type": "array", "items": {"anyOf": [STR, {"enum": []}]}}, "schema.items.anyOf[1].enum: the enum is empty"),
]


@pytest.mark.parametrize(("schema", "says"), UNSATISFIABLE)
def test_an_unsatisfiable_schema_is_refused_with_its_path(schema, says):
    with pytest.raises(InputError) as err:
        json_schema_grammar(schema)
    assert says in str(err.value)
    assert "no value satisfies the schema" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"allOf": [STR, {"maxLength": 3}]}, "schema.allOf[0]: the grammar can only merge allOf members that are"),
        ({"allOf": [OBJ_A, {"type": "object", "properties": {"a": {"type": "integer"}}}]}, "also defined by allOf[0]"),
        ({"type": "object", "required": ["b"]}, "schema.required: 'b' is not one of the properties"),
        (
            {"type": "object", "properties": {}, "required": ["b"], "additionalProperties": False},
            "(additionalProperties is false)",
        ),
    ],
)
def test_a_constraint_the_converter_would_drop_is_refused(schema, says):
    """Satisfiable, or not, but the converter would not enforce it: ``{ }`` for allOf of non-objects, a property
    asked for twice, a required property left out."""
    with pytest.raises(InputError) as err:
        json_schema_grammar(schema)
    assert says in str(err.value)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "minLength": 2, "maxLength": 2},
        {"type": "integer", "minimum": 1.5, "maximum": 2.5},  # one integer: 2
        {"type": "integer", "minimum": 3, "maximum": 3},
        {"allOf": [OBJ_A, {"type": "object", "properties": {"b": {"type": "integer"}}}]},
        {"type": "object", "properties": {"a": STR, "b": False}, "required": ["a"]},
        {"type": "array", "prefixItems": [STR], "items": False, "minItems": 1},
        {"type": ["string", "null"], "enum": ["x", None]},
        {"type": "number", "const": 2},
    ],
)
def test_satisfiable_edges_are_accepted(schema):
    assert "root ::=" in json_schema_grammar(schema)


def test_an_enum_keeps_only_the_values_of_its_type():
    """The converter emits every enum value whatever the type: the values outside it are left out."""
    text = json_schema_grammar({"type": "string", "enum": ["a", 1, None]})
    assert '"\\"a\\""' in text and '"1"' not in text and "null" not in text


def test_tool_parameters_are_checked_with_the_tools_path():
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "string", "minLength": 3, "maxLength": 1}},
    }
    with pytest.raises(InputError, match=r"^tools\[0\]\.function\.parameters\.minLength: minLength 3 is above"):
        tool_grammar([tool], "required")


def test_the_server_answers_400_with_param_response_format():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"allOf": [STR, {"type": "integer"}]}}},
    }
    with pytest.raises(APIError) as err:
        parse(ChatCompletionRequest, body)
    assert err.value.status == 400 and err.value.param == "response_format"
    assert "response_format.json_schema.schema.allOf[1]: its type integer contradicts string" in str(err.value)


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ('root ::= "a"', "some"),
        ("root ::= ", "empty"),
        ('root ::= "" | "a"{0}', "empty"),
        ('root ::= "a" root', "nothing"),
        ('root ::= x\nx ::= "b" x', "nothing"),
        ('root ::= x\nx ::= "b" | x "c"', "some"),
        ('root ::= ("a" root | "")', "some"),
        ("root ::= " + '("a" ' * 3000 + ")?" * 3000, "some"),  # no recursion in the analysis itself
        ("root ::= (", None),
        ('x ::= "a"', None),
    ],
)
def test_what_a_grammar_can_match(text, language):
    assert gl.grammar_language(text) == language


def test_a_grammar_that_matches_nothing_is_refused():
    with pytest.raises(InputError, match="grammar: the root rule derives no text"):
        gl.check_gbnf('root ::= "a" root')
    gl.check_gbnf("root ::= ")  # empty text: the Python API's caller may mean it; a schema's grammar may not
