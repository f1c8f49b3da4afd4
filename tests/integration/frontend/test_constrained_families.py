"""Constrained decoding for every model family, on all three APIs, streamed and not.

Each family's sim says its canonical parallel-calls turn (two `get_weather` calls; gpt-oss, whose
calls end the turn, one) whatever is asked, or its canonical prose answer for `PROSE`: so
`tool_choice` none / named / required, no parallel calls and a JSON-schema answer are each obeyed
while the script would break them. The control (no constraint) shows the script's own calls.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import openai
import pydantic
import pytest
from constrained_client import (
    Specs,
    anthropic_tools,
    anthropic_turn,
    chat_tools,
    chat_turn,
    responses_tools,
    responses_turn,
)
from prompt_cases import FAMILY_NAMES, KWARGS, TOOLS, cases
from sim_scenarios import write_scenario
from stack import Served, served

SPECS: Specs = tuple((t.name, t.parameters) for t in TOOLS)  # get_weather, read, bash
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp": {"type": "integer", "minimum": -50, "maximum": 60}},
    "required": ["city", "temp"],
}
Turn = Callable[..., tuple[str, list[tuple[str, Any]]]]
TURNS: dict[str, Turn] = {"anthropic": anthropic_turn, "chat": chat_turn, "responses": responses_turn}


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    name: str = request.param
    by_name = {c.name: c.raw for c in cases(name)}
    calls, answer = by_name.get("parallel", by_name["call"]), by_name["answer"]
    if KWARGS.get(name, {}).get("enable_thinking"):
        # Written for a template that opened `<think>`; these requests keep thinking off (a forced
        # tool cannot go with Anthropic thinking), so the model opens the block itself.
        calls, answer = "<think>" + calls, "<think>" + answer
    scenario = write_scenario(tmp_path_factory.mktemp(name), [{"match": "PROSE", "output": answer}], calls)
    with served({"script": scenario, "family": name, "model": f"{name}-sim"}) as s:
        yield s


def tools_for(api: str) -> list[dict[str, Any]]:
    return {"anthropic": anthropic_tools, "chat": chat_tools, "responses": responses_tools}[api](tools=SPECS)


def choice(api: str, kind: str) -> dict[str, Any]:
    """The API's spelling of a tool choice (with its tools)."""
    tools = {"tools": tools_for(api)}
    if api == "anthropic":
        spelled: dict[str, Any] = {
            "none": {"tool_choice": {"type": "none"}},
            "required": {"tool_choice": {"type": "any"}},
            "named": {"tool_choice": {"type": "tool", "name": "read"}},
            "single": {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
            "auto": {},
        }
    elif api == "chat":
        spelled = {
            "none": {"tool_choice": "none"},
            "required": {"tool_choice": "required"},
            "named": {"tool_choice": {"type": "function", "function": {"name": "read"}}},
            "single": {"parallel_tool_calls": False},
            "auto": {},
        }
    else:
        spelled = {
            "none": {"tool_choice": "none"},
            "required": {"tool_choice": "required"},
            "named": {"tool_choice": {"type": "function", "name": "read"}},
            "single": {"parallel_tool_calls": False},
            "auto": {},
        }
    return tools | spelled[kind]


def output_format(api: str) -> dict[str, Any]:
    if api == "anthropic":
        return {"output_config": {"format": {"type": "json_schema", "schema": ANSWER_SCHEMA}}}
    if api == "chat":
        return {
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER_SCHEMA}}
        }
    return {"text": {"format": {"type": "json_schema", "name": "a", "schema": ANSWER_SCHEMA}}}


APIS = pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
STREAM = pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
SCHEMAS = dict(SPECS)


def check_arguments(calls: list[tuple[str, Any]]) -> None:
    for name, arguments in calls:
        jsonschema.validate(arguments, SCHEMAS[name])


@APIS
@STREAM
def test_every_choice_is_obeyed(family: Served, api: str, stream: bool) -> None:
    turn = TURNS[api]
    _, control = turn(family, stream, "go", **choice(api, "auto"))
    assert control and all(name == "get_weather" for name, _ in control)  # the script's own calls

    _, calls = turn(family, stream, "go", **choice(api, "none"))
    assert calls == []

    _, calls = turn(family, stream, "go", **choice(api, "named"))
    assert calls and all(name == "read" for name, _ in calls)
    check_arguments(calls)

    _, calls = turn(family, stream, "go", **choice(api, "single"))
    assert len(calls) == 1 and calls[0][0] == "get_weather"

    _, calls = turn(family, stream, "PROSE", **choice(api, "required"))
    assert len(calls) >= 1
    check_arguments(calls)


@APIS
@STREAM
def test_json_schema_answer(family: Served, api: str, stream: bool) -> None:
    text, calls = TURNS[api](family, stream, "PROSE", **output_format(api))
    assert calls == []
    jsonschema.validate(json.loads(text), ANSWER_SCHEMA)


# Strict-mode conformant, as OpenAI requires of a strict schema: every property required (the
# optional one nullable), no additional properties.
STRICT_WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Rome", "Oslo"]},
        "days": {"type": ["integer", "null"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


def strict_ready(schema: dict[str, Any]) -> dict[str, Any]:
    """A flat object schema made strict-mode conformant (all properties required, none extra)."""
    return {**schema, "required": list(schema.get("properties", {})), "additionalProperties": False}


@APIS
@STREAM
def test_strict_arguments_are_obeyed(family: Served, api: str, stream: bool) -> None:
    """The script calls get_weather for Paris; the strict schema allows only Rome or Oslo."""
    specs: Specs = (("get_weather", STRICT_WEATHER), *((n, strict_ready(p)) for n, p in SPECS[1:]))
    tools = {"anthropic": anthropic_tools, "chat": chat_tools, "responses": responses_tools}[api](
        strict=True, tools=specs
    )
    _, calls = TURNS[api](family, stream, "go", tools=tools)
    assert calls and all(name == "get_weather" for name, _ in calls)
    for _, arguments in calls:
        jsonschema.validate(arguments, STRICT_WEATHER)


class Point(pydantic.BaseModel):
    x: int
    y: int


class Color(enum.StrEnum):
    red = "red"
    green = "green"


class Weather(pydantic.BaseModel):
    """Pydantic writes nested models and enums as `$ref`s into `$defs` (as the SDKs send them)."""

    city: Color
    at: Point
    note: str | None = None


WEATHER_REFS = Weather.model_json_schema()


@APIS
@STREAM
def test_a_forced_call_obeys_a_schema_of_refs(family: Served, api: str, stream: bool) -> None:
    """The script calls get_weather for Paris; the forced schema, all `$ref`s, wants a color and a
    point: every family's syntax (a wrapper object, one value per parameter) keeps the refs."""
    assert "$defs" in WEATHER_REFS and "$ref" in json.dumps(WEATHER_REFS["properties"])
    tools = {"anthropic": anthropic_tools, "chat": chat_tools, "responses": responses_tools}[api](
        tools=(("get_weather", WEATHER_REFS),)
    )
    named = {
        "anthropic": {"type": "tool", "name": "get_weather"},
        "chat": {"type": "function", "function": {"name": "get_weather"}},
        "responses": {"type": "function", "name": "get_weather"},
    }[api]
    _, calls = TURNS[api](family, stream, "go", tools=tools, tool_choice=named)
    assert calls and all(name == "get_weather" for name, _ in calls)
    for _, arguments in calls:
        jsonschema.validate(arguments, WEATHER_REFS)
        Weather.model_validate(arguments)


# Schemas every family's syntax must enforce: where a parameter is written as raw text (the XML
# families) or as a keyword argument (pythonic), these take care (an unescaped `/` in a pattern,
# enum members of several types or holding the closing tag, a type list, a nullable string).
ENFORCEABLE: dict[str, dict[str, Any]] = {
    "pattern_with_slash": {"properties": {"path": {"type": "string", "pattern": "^/usr/[a-z]+$"}}},
    "mixed_enum": {"properties": {"m": {"enum": ["a", 1, None, True]}}},
    "enum_holding_a_closing_tag": {"properties": {"t": {"enum": ["</parameter>", "</arg_value>", "ok"]}}},
    "required_without_properties": {"required": ["must"]},
    "type_list": {"properties": {"s": {"type": ["string"]}}},
    "nullable_string": {"properties": {"s": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
    "optional_literal": {"properties": {"v": {"anyOf": [{"type": "null"}, {"enum": ["red", "blue"]}]}}},
    # a pattern that matches the closing tag: the value still ends at the tag's first occurrence
    "pattern_matching_the_closing_tag": {
        "properties": {"p": {"type": "string", "pattern": "^[A-Za-z<>/=]+$"}}
    },
    # a pattern the script cannot finish: the steering must find the last character it wants
    "pattern_wanting_a_last_character": {"properties": {"p": {"type": "string", "pattern": "^x[^\\n]*y$"}}},
    "pattern_of_words": {"properties": {"w": {"type": "string", "pattern": "^[a-z]+( [a-z]+)*$"}}},
}
# Schemas a family may refuse (a 400 naming the tool) but never answer with arguments that break them.
REFUSABLE: dict[str, dict[str, Any]] = {
    "root_any_of": {
        "anyOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]},
        ]
    },
    "additional_properties_schema": {"additionalProperties": {"type": "integer"}, "minProperties": 1},
    "pattern_and_max_length": {
        "properties": {"c": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}}
    },
}


def _whole(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties", {})
    return {"type": "object", **schema, "required": schema.get("required", list(props))}


@STREAM
@pytest.mark.parametrize("name", [*ENFORCEABLE, *REFUSABLE])
def test_a_forced_call_obeys_or_refuses_its_schema(family: Served, stream: bool, name: str) -> None:
    schema = _whole({**ENFORCEABLE, **REFUSABLE}[name])
    kw = {
        "tools": chat_tools(tools=(("f", schema),)),
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }
    try:
        _, calls = chat_turn(family, stream, "go", **kw)
    except openai.BadRequestError as exc:
        assert name in REFUSABLE, exc.message
        assert isinstance(exc.body, dict) and exc.body.get("param") == "tools[0].function.parameters"
        return
    assert calls and all(n == "f" for n, _ in calls)
    for _, arguments in calls:
        jsonschema.validate(arguments, schema)


@pytest.mark.parametrize("tool", ["mcp.server-tool", "a b", "ns/tool:1", "9lives"])
def test_a_forced_tool_is_called_by_its_own_name_or_refused(family: Served, tool: str) -> None:
    """A name the family's call syntax cannot carry is a 400, never a call read back as another
    tool or as text."""
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    kw = {
        "tools": chat_tools(tools=((tool, schema),)),
        "tool_choice": {"type": "function", "function": {"name": tool}},
    }
    try:
        _, calls = chat_turn(family, False, "go", **kw)
    except openai.BadRequestError as exc:
        assert tool != "mcp.server-tool", exc.message  # every family writes MCP's dotted names
        assert isinstance(exc.body, dict) and exc.body.get("param") == "tools[0].function.name"
        return
    assert calls and [name for name, _ in calls] == [tool] * len(calls)
