"""OpenAI's strict-mode schema rules (api/strict.py) and where the decoders apply them."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agentserve.api.chat import decode_chat
from agentserve.api.errors import InvalidRequestError
from agentserve.api.strict import StrictSchemaError, check_strict


def obj(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
        **extra,
    }


GOOD = obj(
    {
        "name": {"type": "string", "pattern": "^[a-z]+$"},
        "when": {"type": "string", "format": "date-time"},
        "age": {"type": ["integer", "null"], "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3},
        "pet": {"anyOf": [obj({"kind": {"const": "cat"}}), {"$ref": "#/$defs/dog"}]},
    },
    **{"$defs": {"dog": obj({"kind": {"const": "dog"}})}},
)


def test_a_conformant_schema_passes() -> None:
    check_strict(GOOD)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            {"type": "array", "items": {}},
            "schema must be a JSON Schema of 'type: \"object\"', got 'type: \"array\"'.",
        ),
        ({"anyOf": [obj({})]}, "got 'type: \"anyOf\"'"),
        (
            {**obj({"a": {"type": "string"}}), "additionalProperties": True},
            "In context=(), 'additionalProperties' is required to be supplied and to be false.",
        ),
        (
            {k: v for k, v in obj({"a": {"type": "string"}}).items() if k != "additionalProperties"},
            "In context=(), 'additionalProperties'",
        ),
        (
            {**obj({"a": {"type": "string"}, "b": {"type": "string"}}), "required": ["a"]},
            "In context=(), 'required' is required to be supplied and to be an array including every key "
            "in properties. Missing 'b'.",
        ),
        (
            obj({"o": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}),
            "In context=('properties', 'o'), 'additionalProperties'",
        ),
        (
            obj({"l": {"type": "array", "items": {"type": "object", "properties": {}}}}),
            "In context=('properties', 'l', 'items'), 'additionalProperties'",
        ),
        (
            obj(
                {
                    "u": {
                        "anyOf": [
                            {"type": "string"},
                            {"type": "object", "properties": {"z": {}}, "additionalProperties": False},
                        ]
                    }
                }
            ),
            "In context=('properties', 'u', 'anyOf', '1'), 'required'",
        ),
        (
            obj({"p": {"type": "string", "default": "x"}}),
            "In context=('properties', 'p'), 'default' is not permitted.",
        ),
        (obj({"p": {"allOf": [{"type": "string"}]}}), "'allOf' is not permitted."),
        (
            obj({"p": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}),
            "'uniqueItems' is not permitted.",
        ),
        (
            obj({"p": {"type": "string", "format": "credit-card"}}),
            "In context=('properties', 'p'), 'format' 'credit-card' is not supported.",
        ),
        (obj({"p": {"$ref": "https://example.com/s.json"}}), "'$ref' must point inside the schema"),
        (
            {
                **obj({}),
                "$defs": {
                    "d": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
                },
            },
            "In context=('$defs', 'd'), 'additionalProperties'",
        ),
    ],
)
def test_broken_rules_are_named_with_their_context(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(StrictSchemaError) as caught:
        check_strict(schema)
    assert message in str(caught.value)


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = obj({"leaf": {"type": "string"}})
    for _ in range(levels - 1):
        schema = obj({"n": schema})
    return schema


def test_limits() -> None:
    check_strict(nested(10))
    with pytest.raises(StrictSchemaError, match=re.escape("11 levels of nesting exceeds limit of 10.")):
        check_strict(nested(11))
    with pytest.raises(StrictSchemaError, match=re.escape("5001 object properties exceeds limit of 5000.")):
        check_strict(obj({f"p{i}": {"type": "string"} for i in range(5001)}))
    with pytest.raises(StrictSchemaError, match=re.escape("1001 enum values exceeds limit of 1000.")):
        check_strict(obj({"a": {"enum": list(range(600))}, "b": {"enum": list(range(401))}}))
    with pytest.raises(StrictSchemaError, match="over the limit of 15000"):
        check_strict(obj({"a": {"enum": [f"{i:060d}" for i in range(251)]}}))
    with pytest.raises(StrictSchemaError, match="exceeds limit of 120000"):
        check_strict(obj({f"{i:0200d}": {"type": "string"} for i in range(601)}))


def chat(tool: dict[str, Any] | None = None, **body: Any) -> Any:
    request: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], **body}
    if tool is not None:
        request["tools"] = [{"type": "function", "function": tool}]
    return decode_chat(request)


def test_only_strict_schemas_are_held_to_the_rules_with_openais_error() -> None:
    loose = {"type": "object", "properties": {"a": {"type": "string"}}}
    chat({"name": "f", "parameters": loose})  # not strict: as written
    with pytest.raises(InvalidRequestError) as caught:
        chat({"name": "f", "parameters": loose, "strict": True})
    error = caught.value
    assert error.param == "tools[0].function.parameters" and error.code == "invalid_function_parameters"
    assert error.message.startswith("Invalid schema for function 'f': In context=(), 'additionalProperties'")
    fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": loose, "strict": True}}
    with pytest.raises(InvalidRequestError) as caught:
        chat(response_format=fmt)
    assert caught.value.param == "response_format"
    assert caught.value.message.startswith("Invalid schema for response_format 'out': In context=()")
    chat(
        {"name": "f", "parameters": GOOD, "strict": True},
        response_format={**fmt, "json_schema": {**fmt["json_schema"], "schema": GOOD}},
    )
