"""Constrained decoding for every model family, on all three APIs, streamed and not.

Each family's sim says its canonical parallel-calls turn (two `get_weather` calls; gpt-oss, whose
calls end the turn, one) whatever is asked, or its canonical prose answer for `PROSE`: so
`tool_choice` none / named / required, no parallel calls and a JSON-schema answer are each obeyed
while the script would break them. The control (no constraint) shows the script's own calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
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
