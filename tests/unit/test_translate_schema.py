"""Schemas fitted to Anthropic's structured outputs (Chat Completions reference, "Output length
and format", "Tools"): one row per rule of Anthropic's "JSON Schema limitations" and of its SDKs'
``transform_schema``, then the schemas instructor, LangChain and the AI SDK actually send,
through the whole request translation."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import pytest

from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.schema import MAX_INLINED, fit_schema
from tests.support.cpu import cpu_spent
from tests.support.translation import refused, translate

P = "response_format.json_schema.schema"
S = {"type": "string"}
CLOSED: dict[str, Any] = {"additionalProperties": False}


def obj(properties: dict[str, Any] | None = None, /, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties or {}, **extra}


@dataclass(frozen=True)
class Fit:
    id: str
    schema: dict[str, Any]
    expected: dict[str, Any]


FITS = [
    # -- objects: "additionalProperties ... must be set to false for objects"
    Fit("object-gets-additional-properties-false", obj({"a": S}), obj({"a": S}, **CLOSED)),
    Fit("object-false-kept", obj({"a": S}, **CLOSED), obj({"a": S}, **CLOSED)),
    Fit("object-without-properties", {"type": "object"}, obj(**CLOSED)),
    Fit(
        "nested-objects-each-closed",
        obj({"a": obj({"b": obj({"c": S})})}),
        obj({"a": obj({"b": obj({"c": S}, **CLOSED)}, **CLOSED)}, **CLOSED),
    ),
    Fit(
        "objects-in-items-anyof-allof-and-defs-closed",
        {
            "type": "object",
            "properties": {
                "list": {"type": "array", "items": obj({"x": S})},
                "either": {"anyOf": [obj({"y": S}), {"type": "null"}]},
                "both": {"allOf": [obj({"z": S})]},
                "ref": {"$ref": "#/$defs/D"},
            },
            "$defs": {"D": obj({"w": S})},
        },
        {
            "type": "object",
            "properties": {
                "list": {"type": "array", "items": obj({"x": S}, **CLOSED)},
                "either": {"anyOf": [obj({"y": S}, **CLOSED), {"type": "null"}]},
                "both": {"allOf": [obj({"z": S}, **CLOSED)]},
                "ref": {"$ref": "#/$defs/D"},
            },
            "$defs": {"D": obj({"w": S}, **CLOSED)},
            **CLOSED,
        },
    ),
    Fit("required-kept", obj({"a": S}, required=["a"]), obj({"a": S}, required=["a"], **CLOSED)),
    Fit("properties-without-type-is-an-object", {"properties": {"a": S}}, obj({"a": S}, **CLOSED)),
    Fit(
        "nullable-object-type-list-closed",
        {"type": ["object", "null"], "properties": {"a": S}},
        {"type": ["object", "null"], "properties": {"a": S}, **CLOSED},
    ),
    Fit(
        "object-constraints-described",
        obj({"a": S}, minProperties=1, maxProperties=3),
        obj({"a": S}, description="{minProperties: 1, maxProperties: 3}", **CLOSED),
    ),
    # -- dropped: about the document, not the value
    Fit(
        "dollar-schema-dropped",
        {"$schema": "http://json-schema.org/draft-07/schema#", **obj({"a": S}, **CLOSED)},
        obj({"a": S}, **CLOSED),
    ),
    Fit("dollar-id-and-comment-dropped", {"$id": "urn:x", "$comment": "c", **S}, S),
    # -- kept: supported keywords
    Fit(
        "basic-types-kept",
        obj({t: {"type": t} for t in ("string", "integer", "number", "boolean", "null")}),
        {
            **obj({t: {"type": t} for t in ("string", "integer", "number", "boolean", "null")}),
            **CLOSED,
        },
    ),
    Fit(
        "description-title-default-kept",
        {**S, "description": "d", "title": "T", "default": "x"},
        {
            **S,
            "description": "d",
            "title": "T",
            "default": "x",
        },
    ),
    Fit("enum-kept", {"type": "string", "enum": ["a", "b"]}, {"type": "string", "enum": ["a", "b"]}),
    Fit("enum-without-type-kept", {"enum": ["a", 1, True, None]}, {"enum": ["a", 1, True, None]}),
    Fit("const-kept", {"type": "string", "const": "a"}, {"type": "string", "const": "a"}),
    Fit("anyof-kept", {"anyOf": [S, {"type": "null"}]}, {"anyOf": [S, {"type": "null"}]}),
    Fit("oneof-becomes-anyof", {"oneOf": [S, {"type": "integer"}]}, {"anyOf": [S, {"type": "integer"}]}),
    Fit("type-list-kept", {"type": ["string", "null"]}, {"type": ["string", "null"]}),
    Fit("supported-format-kept", {**S, "format": "date-time"}, {**S, "format": "date-time"}),
    Fit("simple-pattern-kept", {**S, "pattern": "^[A-Z]{2}-\\d+$"}, {**S, "pattern": "^[A-Z]{2}-\\d+$"}),
    Fit("min-items-0-kept", {"type": "array", "items": S, "minItems": 0}, {"type": "array", "items": S, "minItems": 0}),
    Fit("min-items-1-kept", {"type": "array", "items": S, "minItems": 1}, {"type": "array", "items": S, "minItems": 1}),
    Fit(
        "definitions-kept",
        {"definitions": {"D": S}, "$ref": "#/definitions/D"},
        {
            "definitions": {"D": S},
            "$ref": "#/definitions/D",
        },
    ),
    Fit("root-ref-keeps-its-defs", {"$ref": "#/$defs/D", "$defs": {"D": S}}, {"$ref": "#/$defs/D", "$defs": {"D": S}}),
    Fit(
        "ref-stands-alone",
        {"$ref": "#/$defs/D", "description": "d", "$defs": {"D": S}},
        {
            "$ref": "#/$defs/D",
            "$defs": {"D": S},
        },
    ),
    # -- moved into the description, as the SDKs do ({key: JSON value, ...})
    Fit("min-length-described", {**S, "minLength": 3}, {**S, "description": "{minLength: 3}"}),
    Fit(
        "string-lengths-appended-to-description",
        {**S, "description": "A name", "minLength": 1, "maxLength": 20},
        {**S, "description": "A name\n\n{minLength: 1, maxLength: 20}"},
    ),
    Fit(
        "numeric-constraints-described",
        {"type": "integer", "minimum": 1, "maximum": 10, "exclusiveMinimum": 0, "multipleOf": 2},
        {"type": "integer", "description": "{minimum: 1, maximum: 10, exclusiveMinimum: 0, multipleOf: 2}"},
    ),
    Fit(
        "number-bounds-described",
        {"type": "number", "maximum": 0.5},
        {"type": "number", "description": "{maximum: 0.5}"},
    ),
    Fit("unsupported-format-described", {**S, "format": "binary"}, {**S, "description": '{format: "binary"}'}),
    Fit(
        "lookahead-pattern-described",
        {**S, "pattern": "^(?=.*\\d).+$"},
        {**S, "description": '{pattern: "^(?=.*\\\\d).+$"}'},
    ),
    Fit("backreference-pattern-described", {**S, "pattern": "(a)\\1"}, {**S, "description": '{pattern: "(a)\\\\1"}'}),
    Fit(
        "word-boundary-pattern-described",
        {**S, "pattern": "\\bword\\b"},
        {**S, "description": '{pattern: "\\\\bword\\\\b"}'},
    ),
    Fit(
        "min-items-above-1-described",
        {"type": "array", "items": S, "minItems": 2},
        {"type": "array", "items": S, "description": "{minItems: 2}"},
    ),
    Fit(
        "array-constraints-described",
        {"type": "array", "items": S, "maxItems": 5, "uniqueItems": True},
        {"type": "array", "items": S, "description": "{maxItems: 5, uniqueItems: true}"},
    ),
    Fit(
        "tuple-items-described",
        {"type": "array", "prefixItems": [S, {"type": "integer"}]},
        {"type": "array", "description": '{prefixItems: [{"type":"string"},{"type":"integer"}]}'},
    ),
    Fit("not-described", {**S, "not": {"const": "x"}}, {**S, "description": '{not: {"const":"x"}}'}),
    Fit("unknown-keyword-described", {**S, "nullable": True}, {**S, "description": "{nullable: true}"}),
    Fit(
        "keyword-of-another-type-described",
        {"type": "integer", "format": "int32"},
        {"type": "integer", "description": '{format: "int32"}'},
    ),
    # -- allOf with $ref: "allOf with $ref not supported" -> the reference is inlined
    Fit(
        "allof-ref-inlined",
        {
            "type": "object",
            "properties": {"a": {"allOf": [{"$ref": "#/$defs/D"}], "description": "d"}},
            "$defs": {"D": obj({"x": S})},
        },
        {
            "type": "object",
            "properties": {"a": {"allOf": [obj({"x": S}, **CLOSED)], "description": "d"}},
            "$defs": {"D": obj({"x": S}, **CLOSED)},
            **CLOSED,
        },
    ),
    # -- enum and const reconciled with type: the API refuses "Enum value 'low' does not match
    #    declared type '['string', 'null']'"; the values decide
    Fit(
        "enum-beside-type-list-drops-type",
        {"enum": ["low", "high", None], "type": ["string", "null"]},
        {"enum": ["low", "high", None]},
    ),
    Fit(
        "string-enum-beside-nullable-type-drops-type",
        {"type": ["string", "null"], "enum": ["film", "tv"]},
        {"enum": ["film", "tv"]},
    ),
    Fit(
        "enum-values-of-another-type-dropped",
        {"type": "string", "enum": ["a", None, 1]},
        {"type": "string", "enum": ["a"]},
    ),
    Fit("integral-float-is-an-integer", {"type": "integer", "enum": [1, 2.0]}, {"type": "integer", "enum": [1, 2.0]}),
    Fit("const-beside-type-list-drops-type", {"type": ["string", "null"], "const": "x"}, {"const": "x"}),
]


@pytest.mark.parametrize("row", FITS, ids=[row.id for row in FITS])
def test_fit(row: Fit) -> None:
    assert fit_schema(row.schema, P) == row.expected


@pytest.mark.parametrize("row", FITS, ids=[row.id for row in FITS])
def test_the_client_schema_is_not_changed(row: Fit) -> None:
    before = copy.deepcopy(row.schema)
    fit_schema(row.schema, P)
    assert row.schema == before


@pytest.mark.parametrize("row", FITS, ids=[row.id for row in FITS])
def test_fitting_twice_changes_nothing(row: Fit) -> None:
    once = fit_schema(row.schema, P)
    assert fit_schema(once, P) == once


NODE = {"type": "object", "properties": {"n": {"$ref": "#/$defs/Node"}}}
REFUSALS = [
    # "additionalProperties set to anything other than false" is not supported
    ("additional-properties-true", obj({"a": S}, additionalProperties=True), ".additionalProperties", "must be false"),
    (
        "additional-properties-schema-a-map",
        obj({"meta": {"type": "object", "additionalProperties": S}}),
        ".properties.meta.additionalProperties",
        "must be false",
    ),
    ("additional-properties-empty-schema", obj(additionalProperties={}), ".additionalProperties", "must be false"),
    ("pattern-properties", obj(patternProperties={"^x": S}), ".patternProperties", "is not supported"),
    # "Recursive schemas" are not supported
    (
        "recursive-ref",
        {
            **NODE,
            "$defs": {
                "Node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}
            },
        },
        ".$defs.Node.properties.kids.items.$ref",
        "recursive schemas are not supported",
    ),
    (
        "mutually-recursive-refs",
        {**NODE, "$defs": {"Node": {"$ref": "#/$defs/Other"}, "Other": {"anyOf": [{"$ref": "#/$defs/Node"}]}}},
        ".$defs.Other.anyOf[0].$ref",
        "recursive schemas are not supported",
    ),
    (
        "self-referring-root",
        {"type": "object", "properties": {"child": {"$ref": "#"}}},
        ".properties.child.$ref",
        "recursive schemas are not supported",
    ),
    (
        "recursive-definition-nothing-uses",
        {"type": "object", "$defs": {"T": {"type": "array", "items": {"$ref": "#/$defs/T"}}}},
        ".$defs.T.items.$ref",
        "recursive schemas are not supported",
    ),
    # External $ref (e.g. '$ref': 'http://...') is not supported
    ("external-ref", obj({"a": {"$ref": "https://example.com/a.json"}}), ".properties.a.$ref", "external $ref"),
    ("anchor-ref", obj({"a": {"$ref": "#a"}}), ".properties.a.$ref", 'refer to a definition as "#/$defs/Name"'),
    ("dangling-ref", obj({"a": {"$ref": "#/$defs/Missing"}}), ".properties.a.$ref", "points to nothing"),
    # "Complex types within enums" are not supported
    ("enum-of-objects", {"enum": [{"a": 1}]}, ".enum[0]", "enum values must be strings, numbers, booleans or null"),
    ("enum-of-arrays", {"enum": ["a", [1]]}, ".enum[1]", "enum values must be strings, numbers, booleans or null"),
    ("empty-enum", {"enum": []}, ".enum", "must be a non-empty list"),
    (
        "enum-without-a-value-of-its-type",
        {"type": "integer", "enum": ["a", "b"]},
        ".enum",
        'no value is of type "integer"',
    ),
    ("const-of-another-type", {"type": "integer", "const": "a"}, ".const", 'is not of type "integer"'),
    ("object-const", {"const": {"a": 1}}, ".const", "must be a string, a number, a boolean or null"),
    # a schema needs a type (the API: "Schema type is missing"); the basic types only
    ("no-type", obj({"a": {"description": "anything"}}), ".properties.a", "the schema has no type"),
    ("empty-schema", {"type": "array", "items": {}}, ".items", "the schema has no type"),
    ("unknown-type", obj({"a": {"type": "date"}}), ".properties.a.type", '"date" is not a supported type'),
    ("unknown-type-in-list", {"type": ["string", "file"]}, ".type[1]", '"file" is not a supported type'),
    ("empty-type-list", {"type": []}, ".type", "must not be an empty list"),
    ("anyof-and-oneof", {"anyOf": [S], "oneOf": [S]}, ".oneOf", "use anyOf or oneOf, not both"),
    ("empty-anyof", {"anyOf": []}, ".anyOf", "must be a non-empty list of schemas"),
    ("boolean-sub-schema", obj({"a": True}), ".properties.a", "must be a JSON schema object"),
    (
        "properties-not-an-object",
        {"type": "object", "properties": ["a"]},
        ".properties",
        "must be an object of schemas",
    ),
]


@pytest.mark.parametrize("schema, where, reason", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refused_naming_the_path(schema: dict[str, Any], where: str, reason: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        fit_schema(schema, P)
    assert caught.value.param == P + where
    assert caught.value.message.startswith(f"{P}{where}: ")
    assert reason in caught.value.message


def test_deep_nesting_refused_not_crashed() -> None:
    schema: dict[str, Any] = S
    for _ in range(200):
        schema = {"type": "array", "items": schema}
    with pytest.raises(InvalidRequestError) as caught:
        fit_schema(schema, P)
    assert "nested more than" in caught.value.message


def test_a_shared_definition_is_not_recursion() -> None:
    shared = {
        "type": "object",
        "properties": {
            "home": {"$ref": "#/$defs/A"},
            "work": {"$ref": "#/$defs/A"},
            "both": {"allOf": [{"$ref": "#/$defs/A"}]},
        },
        "$defs": {"A": obj({"street": S})},
    }
    fitted = fit_schema(shared, P)
    assert fitted["properties"]["home"] == fitted["properties"]["work"] == {"$ref": "#/$defs/A"}


# ---------------------------------------------------------------- what the clients send


# instructor, Mode.JSON_SCHEMA: {"type": "json_schema", "json_schema": {"name": Model.__name__,
# "schema": Model.model_json_schema()}}; this is pydantic 2's schema of
#   class Address(BaseModel): street: str; city: str
#   class User(BaseModel):
#       """A user."""
#       name: str = Field(min_length=1, description="Full name"); age: int = Field(ge=0, le=150)
#       email: str | None = None; tags: list[str] = Field(default_factory=list, max_length=5)
#       level: Level | None = None; address: Address
INSTRUCTOR_USER = {
    "$defs": {
        "Address": {
            "properties": {
                "street": {"title": "Street", "type": "string"},
                "city": {"title": "City", "type": "string"},
            },
            "required": ["street", "city"],
            "title": "Address",
            "type": "object",
        },
        "Level": {"enum": ["low", "high"], "title": "Level", "type": "string"},
    },
    "description": "A user.",
    "properties": {
        "name": {"description": "Full name", "minLength": 1, "title": "Name", "type": "string"},
        "age": {"maximum": 150, "minimum": 0, "title": "Age", "type": "integer"},
        "email": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Email"},
        "tags": {"items": {"type": "string"}, "maxItems": 5, "title": "Tags", "type": "array"},
        "level": {"anyOf": [{"$ref": "#/$defs/Level"}, {"type": "null"}], "default": None},
        "address": {"$ref": "#/$defs/Address"},
    },
    "required": ["name", "age", "address"],
    "title": "User",
    "type": "object",
}
INSTRUCTOR_USER_FITTED = {
    "$defs": {
        "Address": {
            "properties": {
                "street": {"title": "Street", "type": "string"},
                "city": {"title": "City", "type": "string"},
            },
            "required": ["street", "city"],
            "title": "Address",
            "type": "object",
            "additionalProperties": False,
        },
        "Level": {"enum": ["low", "high"], "title": "Level", "type": "string"},
    },
    "description": "A user.",
    "properties": {
        "name": {"description": "Full name\n\n{minLength: 1}", "title": "Name", "type": "string"},
        "age": {"description": "{maximum: 150, minimum: 0}", "title": "Age", "type": "integer"},
        "email": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Email"},
        "tags": {"items": {"type": "string"}, "description": "{maxItems: 5}", "title": "Tags", "type": "array"},
        "level": {"anyOf": [{"$ref": "#/$defs/Level"}, {"type": "null"}], "default": None},
        "address": {"$ref": "#/$defs/Address"},
    },
    "required": ["name", "age", "address"],
    "title": "User",
    "type": "object",
    "additionalProperties": False,
}

# LangChain, ChatOpenAI.with_structured_output(json_schema, method="json_schema") with the dict
# schema of its docs: the title becomes the name, the description moves up, strict is False.
LANGCHAIN_JOKE = {
    "type": "object",
    "properties": {
        "setup": {"type": "string", "description": "The setup of the joke"},
        "punchline": {"type": "string", "description": "The punchline to the joke"},
        "rating": {"type": "integer", "description": "How funny the joke is, from 1 to 10", "default": None},
    },
    "required": ["setup", "punchline"],
}

# The AI SDK, generateObject({schema: z.object({recipe: z.object({name: z.string(),
# ingredients: z.array(z.object({name: z.string(), amount: z.string()})).min(2),
# rating: z.number().int().min(1).max(5).nullable(), url: z.string().url().optional()})})})
# through @ai-sdk/openai: zod-to-json-schema's draft-07 output, "$schema" and all.
AI_SDK_RECIPE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "recipe": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "ingredients": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "amount": {"type": "string"}},
                        "required": ["name", "amount"],
                        "additionalProperties": False,
                    },
                    "minItems": 2,
                },
                "rating": {"type": ["integer", "null"], "minimum": 1, "maximum": 5},
                "url": {"type": "string", "format": "uri"},
            },
            "required": ["name", "ingredients", "rating"],
            "additionalProperties": False,
        }
    },
    "required": ["recipe"],
    "additionalProperties": False,
    "$schema": "http://json-schema.org/draft-07/schema#",
}
AI_SDK_RECIPE_FITTED = {
    "type": "object",
    "properties": {
        "recipe": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "ingredients": {
                    "type": "array",
                    "items": AI_SDK_RECIPE["properties"]["recipe"]["properties"]["ingredients"]["items"],
                    "description": "{minItems: 2}",
                },
                "rating": {"type": ["integer", "null"], "description": "{minimum: 1, maximum: 5}"},
                "url": {"type": "string", "format": "uri"},
            },
            "required": ["name", "ingredients", "rating"],
            "additionalProperties": False,
        }
    },
    "required": ["recipe"],
    "additionalProperties": False,
}

CLIENT_FORMATS = [
    pytest.param(
        {"type": "json_schema", "json_schema": {"name": "User", "schema": INSTRUCTOR_USER}},
        INSTRUCTOR_USER_FITTED,
        id="instructor-json-schema-mode",
    ),
    pytest.param(
        {
            "type": "json_schema",
            "json_schema": {
                "name": "joke",
                "description": "Joke to tell user.",
                "schema": LANGCHAIN_JOKE,
                "strict": False,
            },
        },
        {**LANGCHAIN_JOKE, "additionalProperties": False},
        id="langchain-with-structured-output-json-schema",
    ),
    pytest.param(
        {"type": "json_schema", "json_schema": {"schema": AI_SDK_RECIPE, "strict": True, "name": "response"}},
        AI_SDK_RECIPE_FITTED,
        id="ai-sdk-generate-object",
    ),
]


@pytest.mark.parametrize("response_format, expected", CLIENT_FORMATS)
def test_client_response_formats_reach_anthropic_fitted(
    response_format: dict[str, Any], expected: dict[str, Any]
) -> None:
    body = translate({"response_format": response_format}).body
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": expected}}


def test_response_format_refusal_names_the_client_path() -> None:
    schema = obj({"meta": {"type": "object", "additionalProperties": {"type": "integer"}}})
    message, param = refused(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    )
    assert param == "response_format.json_schema.schema.properties.meta.additionalProperties"
    assert message.startswith(f"{param}: must be false")


# OpenAI's function-calling guide, strict mode: a nullable enum as a type list.
STRICT_WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Retrieves current weather for the given location.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country e.g. Bogotá, Colombia"},
                "units": {
                    "type": ["string", "null"],
                    "enum": ["celsius", "fahrenheit"],
                    "description": "Units the temperature will be returned in.",
                },
            },
            "required": ["location", "units"],
            "additionalProperties": False,
        },
    },
}


def _tool(parameters: dict[str, Any] | None, *, strict: bool | None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": "f"}
    if parameters is not None:
        function["parameters"] = parameters
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


@pytest.mark.parametrize(
    "tool, expected",
    [
        pytest.param(
            STRICT_WEATHER,
            {
                **STRICT_WEATHER["function"]["parameters"],
                "properties": {
                    "location": {"type": "string", "description": "City and country e.g. Bogotá, Colombia"},
                    "units": {
                        "enum": ["celsius", "fahrenheit"],
                        "description": "Units the temperature will be returned in.",
                    },
                },
            },
            id="openai-strict-example-nullable-enum",
        ),
        pytest.param(
            _tool({"type": "object", "properties": {"q": {"type": "string", "maxLength": 50}}}, strict=True),
            {"type": "object", "properties": {"q": {"type": "string", "description": "{maxLength: 50}"}}, **CLOSED},
            id="strict-tool-fitted",
        ),
        pytest.param(
            _tool({"properties": {"q": S}}, strict=True),
            {"type": "object", "properties": {"q": S}, **CLOSED},
            id="strict-tool-without-type",
        ),
        pytest.param(
            _tool(None, strict=True),
            {"type": "object", "properties": {}, **CLOSED},
            id="strict-tool-without-parameters",
        ),
        pytest.param(
            _tool({"type": "object", "properties": {"q": {"type": "string", "maxLength": 50}}}, strict=False),
            {"type": "object", "properties": {"q": {"type": "string", "maxLength": 50}}},
            id="non-strict-tool-untouched",
        ),
        pytest.param(
            _tool({"type": "object", "properties": {"q": {"type": "string", "maxLength": 50}}}, strict=None),
            {"type": "object", "properties": {"q": {"type": "string", "maxLength": 50}}},
            id="tool-without-strict-untouched",
        ),
    ],
)
def test_strict_tools_are_fitted(tool: dict[str, Any], expected: dict[str, Any]) -> None:
    (sent,) = translate({"tools": [tool]}).body["tools"]
    assert sent["input_schema"] == expected
    assert sent.get("strict") == tool["function"].get("strict")


def test_strict_tool_refusal_names_the_client_path() -> None:
    tool = _tool(
        {"type": "object", "properties": {"meta": {"type": "object", "additionalProperties": True}}}, strict=True
    )
    message, param = refused({"tools": [STRICT_WEATHER, tool]})
    assert param == "tools[1].function.parameters.properties.meta.additionalProperties"
    assert message.startswith(f"{param}: must be false")


# ---------------------------------------------------------------- each definition fitted once, inlining capped


def chain(levels: int, leaf: dict[str, Any] | None = None) -> dict[str, Any]:
    """``$defs`` D0…Dn where each lists the next one twice in ``allOf``: inlined naively, the
    fitted schema doubles at every level (2**levels copies of the leaf)."""
    defs: dict[str, Any] = {
        f"D{i}": {"allOf": [{"$ref": f"#/$defs/D{i + 1}"}, {"$ref": f"#/$defs/D{i + 1}"}]} for i in range(levels)
    }
    defs[f"D{levels}"] = leaf or obj({"a": S})
    return {"type": "object", "properties": {"x": {"allOf": [{"$ref": "#/$defs/D0"}]}}, "$defs": defs}


def inlined_by_hand(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with every ``allOf`` ``$ref`` replaced by a copy of its target, as the fitting
    did before it memoised: fitting this must give what fitting the original gives."""

    def walk(node: Any, root: dict[str, Any]) -> Any:
        if isinstance(node, list):
            return [walk(child, root) for child in node]
        if not isinstance(node, dict):
            return node
        out = {key: walk(child, root) for key, child in node.items()}
        if isinstance(node.get("allOf"), list):
            parts = []
            for part in node["allOf"]:
                while isinstance(part, dict) and isinstance(part.get("$ref"), str) and part["$ref"].startswith("#/"):
                    target: Any = root
                    for name in part["$ref"][2:].split("/"):
                        target = target[name]
                    part = target
                parts.append(walk(part, root))
            out["allOf"] = parts
        return out

    return walk(schema, schema)


DIAMOND = {
    "type": "object",
    "properties": {
        "a": {"allOf": [{"$ref": "#/$defs/Left"}, {"$ref": "#/$defs/Right"}]},
        "b": {"allOf": [{"$ref": "#/$defs/Base"}], "description": "b"},
        "c": {"anyOf": [{"allOf": [{"$ref": "#/$defs/Left"}]}, {"type": "null"}]},
    },
    "$defs": {
        "Base": obj({"id": {"type": "integer", "minimum": 0}}),
        "Left": {"allOf": [{"$ref": "#/$defs/Base"}, obj({"l": S})]},
        "Right": {"allOf": [{"$ref": "#/$defs/Alias"}], "title": "R"},
        "Alias": {"$ref": "#/$defs/Base"},
    },
}
INLINING = [
    *[pytest.param(row.schema, id=row.id) for row in FITS],
    pytest.param(INSTRUCTOR_USER, id="instructor-user"),
    pytest.param(AI_SDK_RECIPE, id="ai-sdk-recipe"),
    pytest.param(DIAMOND, id="diamond-of-shared-definitions"),
    pytest.param(chain(6), id="doubling-chain-6-levels"),
]


@pytest.mark.parametrize("schema", INLINING)
def test_each_definition_fitted_once_gives_what_inlining_by_hand_gives(schema: dict[str, Any]) -> None:
    assert fit_schema(schema, P) == fit_schema(inlined_by_hand(schema), P)


def test_inlined_copies_share_nothing() -> None:
    fitted = fit_schema(DIAMOND, P)
    left_in_a = fitted["properties"]["a"]["allOf"][0]
    left_in_c = fitted["properties"]["c"]["anyOf"][0]["allOf"][0]
    assert left_in_a == left_in_c and left_in_a is not left_in_c
    assert left_in_a["allOf"][0] is not fitted["$defs"]["Base"]
    left_in_a["allOf"][0]["properties"]["id"]["type"] = "string"
    assert fitted["$defs"]["Base"]["properties"]["id"]["type"] == "integer"


def test_a_doubling_chain_is_refused_fast_naming_the_tool() -> None:
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": chain(30)}}
    with cpu_spent() as spent:
        message, param = refused({"tools": [STRICT_WEATHER, tool]})
    assert spent.seconds < 1.0  # naively: 2**30 copies, the worker killed
    assert param == "tools[1].function.parameters"
    assert message.startswith(f"{param}: the schema is too large once its allOf $refs are inlined")
    assert message.endswith('(tool "f")')


@pytest.mark.parametrize("levels", [8, 12, 30, 60])
def test_a_doubling_chain_is_bounded_or_refused(levels: int) -> None:
    with cpu_spent() as spent:
        try:
            fitted = fit_schema(chain(levels), P)
        except InvalidRequestError as exc:
            assert exc.param is not None and exc.param.startswith(P)
            assert "too large" in exc.message or "nested more than" in exc.message
        else:
            assert len(json.dumps(fitted)) <= MAX_INLINED + 10_000
    assert spent.seconds < 1.0


def test_a_reused_definition_too_deep_where_it_is_inlined_is_refused() -> None:
    deep: dict[str, Any] = S
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    shallow_use = {"allOf": [{"$ref": "#/$defs/Deep"}]}
    deep_use: dict[str, Any] = shallow_use
    for _ in range(30):
        deep_use = {"type": "array", "items": deep_use}
    schema = obj({"near": shallow_use, "far": deep_use}, **{"$defs": {"Deep": deep}})
    with pytest.raises(InvalidRequestError) as caught:
        fit_schema(schema, P)
    assert "nested more than" in caught.value.message
    assert fit_schema(obj({"near": shallow_use}, **{"$defs": {"Deep": deep}}), P)["properties"]["near"]
