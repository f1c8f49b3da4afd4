"""xmlargs: schema typing of XML-style parameter values and the incremental arguments writer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentserve.conversation import OutputEvent, ToolCallArgsDelta, ToolCallEnd, ToolSpec
from agentserve.parsing import ToolCalls, sequential_call_id
from agentserve.parsing.xmlargs import (
    SPECULATE_LIMIT,
    ArgsWriter,
    convert,
    escape,
    tool_properties,
    value_types,
)


@pytest.mark.parametrize(
    ("schema", "types"),
    [
        (None, ("string",)),
        ({}, ("string",)),
        ({"description": "no type"}, ("string",)),
        ({"type": "string"}, ("string",)),
        ({"type": "integer"}, ("integer",)),
        ({"type": "int"}, ("integer",)),
        ({"type": "any"}, ("string",)),
        ({"type": ["string", "null"]}, ("null", "string")),
        ({"type": "string", "nullable": True}, ("null", "string")),
        ({"anyOf": [{"type": "object"}, {"type": "string"}]}, ("object", "string")),
        ({"oneOf": [{"type": "array"}, {"type": "null"}]}, ("array", "null")),
        ({"anyOf": [{"anyOf": [{"type": "integer"}]}, {"type": "boolean"}]}, ("integer", "boolean")),
        ({"enum": [1, 2]}, ("integer",)),
        ({"enum": ["a", None]}, ("null", "string")),
        ({"properties": {"a": {}}}, ("object",)),
        ({"items": {"type": "string"}}, ("array",)),
        ("not a schema", ("string",)),
    ],
)
def test_value_types(schema: object, types: tuple[str, ...]) -> None:
    assert value_types(schema) == types


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ("3", "integer", "3"),
        (" 42 ", "integer", "42"),
        ("3.0", "integer", "3"),
        ("3.5", "integer", None),
        ("ten", "integer", None),
        ("true", "integer", None),
        ("0.5", "number", "0.5"),
        ("7", "number", "7"),
        ("1.", "number", "1.0"),
        (".5", "number", "0.5"),
        ("NaN", "number", None),
        ("1e999", "number", None),
        ("five", "number", None),
        ("true", "boolean", "true"),
        ("False", "boolean", "false"),
        ("yes", "boolean", None),
        ("null", "null", "null"),
        ("None", "null", "null"),
        ("nil", "null", None),
        ('{"a": [1, 2]}', "object", '{"a": [1, 2]}'),
        ("{'a': None, 'b': (1, 2)}", "object", '{"a": null, "b": [1, 2]}'),
        ("{'a': {1, 2}}", "object", None),  # a set: no JSON for it
        ('{"a": NaN}', "object", None),
        ("[1, 2]", "object", None),
        ("[1, 'x']", "array", '[1, "x"]'),
        ("[1e999]", "array", None),
        ("[" * 10_000, "array", None),
        ("['\\d']", "array", '["\\\\d"]'),  # Python warns about the escape: never surfaces
        ("x", "array", None),
        ('a "quoted"\n', "string", '"a \\"quoted\\"\\n"'),
    ],
)
def test_convert(text: str, kind: str, expected: str | None) -> None:
    assert convert(text, kind) == expected


def test_tool_properties_of_unknown_or_odd_tools_are_empty() -> None:
    tools = {
        "ok": ToolSpec("ok", parameters={"properties": {"a": {"type": "integer"}}}),
        "odd": ToolSpec("odd", parameters={"properties": ["a"]}),
    }
    assert tool_properties(tools, "ok") == {"a": {"type": "integer"}}
    assert tool_properties(tools, "odd") == {}
    assert tool_properties(tools, "missing") == {}


def write(props: dict[str, Any], params: list[tuple[str, list[str]]]) -> tuple[str, list[OutputEvent]]:
    """Write the parameters (each value as the given pieces) and return the dispatched arguments."""
    calls = ToolCalls(sequential_call_id)
    out: list[OutputEvent] = []
    calls.start("f", out)
    writer = ArgsWriter(calls, props)
    for key, pieces in params:
        writer.begin(key, out)
        for piece in pieces:
            writer.text(piece, out)
        writer.end(out)
    assert writer.finish(out)
    end = out[-1]
    assert isinstance(end, ToolCallEnd)
    fragments = "".join(e.fragment for e in out if isinstance(e, ToolCallArgsDelta))
    assert fragments == end.arguments
    return end.arguments, out


def fragments_after(writer_calls: list[OutputEvent], start: int) -> str:
    return "".join(e.fragment for e in writer_calls[start:] if isinstance(e, ToolCallArgsDelta))


def test_string_values_stream_before_the_value_ends() -> None:
    calls = ToolCalls(sequential_call_id)
    out: list[OutputEvent] = []
    calls.start("write", out)
    writer = ArgsWriter(calls, {"content": {"type": "string"}})
    writer.begin("content", out)
    mark = len(out)
    writer.text('line "one"\n', out)
    assert fragments_after(out, mark) == 'line \\"one\\"\\n'  # sent at once, escaped
    mark = len(out)
    writer.text("two", out)
    assert fragments_after(out, mark) == "two"
    writer.end(out)
    assert writer.finish(out)
    assert out[-1] == ToolCallEnd(0, '{"content": "line \\"one\\"\\ntwo"}')


def test_a_nullable_string_is_held_only_while_it_could_be_null() -> None:
    calls = ToolCalls(sequential_call_id)
    out: list[OutputEvent] = []
    calls.start("f", out)
    writer = ArgsWriter(calls, {"note": {"type": ["string", "null"]}})
    writer.begin("note", out)
    mark = len(out)
    writer.text("nu", out)
    assert fragments_after(out, mark) == ""  # still maybe `null`
    writer.text("ance is key", out)
    assert fragments_after(out, mark) == '"nuance is key'  # ruled out: streams as a string
    writer.end(out)
    writer.finish(out)
    assert json.loads(calls.streamed) == {"note": "nuance is key"}


@pytest.mark.parametrize(
    ("schema", "pieces", "value"),
    [
        ({"anyOf": [{"type": "object"}, {"type": "string"}]}, ['{"x": ', "[1, 2]}"], {"x": [1, 2]}),
        ({"anyOf": [{"type": "object"}, {"type": "string"}]}, ["{not ", "json"], "{not json"),
        ({"anyOf": [{"type": "object"}, {"type": "string"}]}, ["plain"], "plain"),
        ({"type": ["integer", "string"]}, ["1", "2"], 12),
        ({"type": ["integer", "string"]}, ["12", "a"], "12a"),
        ({"type": ["boolean", "string"]}, ["tr", "ue"], True),
        ({"type": ["array", "null"]}, ["None"], None),
        ({"type": ["string", "null"]}, ["  null  "], None),
        ({"type": ["string", "null"]}, ["  text  "], "  text  "),
        ({"type": "integer"}, ["null"], None),  # a non-string parameter written `null`
        ({"type": "integer"}, ["n/a"], "n/a"),
        ({"type": ["number", "string"]}, ["1" * (SPECULATE_LIMIT + 1)], "1" * (SPECULATE_LIMIT + 1)),
    ],
)
def test_unions_try_other_types_then_string_without_double_encoding(
    schema: dict[str, Any], pieces: list[str], value: object
) -> None:
    arguments, _ = write({"v": schema}, [("v", pieces)])
    assert json.loads(arguments) == {"v": value}


def test_keys_and_separators_make_one_object() -> None:
    arguments, _ = write(
        {"n": {"type": "integer"}},
        [('we"ird', ["a"]), ("n", ["5"]), ("ünï", ["🚀"])],
    )
    assert arguments == '{"we\\"ird": "a", "n": 5, "ünï": "🚀"}'


def test_no_parameters_is_an_empty_object() -> None:
    arguments, _ = write({}, [])
    assert arguments == "{}"


@given(st.lists(st.text(), max_size=8))
def test_escaped_fragments_concatenate_to_the_escaped_text(pieces: list[str]) -> None:
    assert "".join(escape(p) for p in pieces) == escape("".join(pieces))
    arguments, _ = write({}, [("k", pieces)])
    assert json.loads(arguments) == {"k": "".join(pieces)}


@given(
    st.sampled_from(
        [
            {"type": "integer"},
            {"type": "number"},
            {"type": "boolean"},
            {"type": "object"},
            {"type": "array"},
            {"type": ["string", "null"]},
            {"anyOf": [{"type": "object"}, {"type": "integer"}, {"type": "string"}]},
        ]
    ),
    st.text(alphabet=st.sampled_from(list("0123456789.-+eE {}[]'\":,nultrefasNoTF\\x\n")), max_size=30),
    st.lists(st.integers(0, 30), max_size=6),
)
def test_any_text_any_split_gives_valid_arguments_independent_of_chunking(
    schema: dict[str, Any], text: str, cuts: list[int]
) -> None:
    points = sorted({c % (len(text) + 1) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    whole, _ = write({"v": schema}, [("v", [text])])
    split, _ = write({"v": schema}, [("v", pieces)])
    assert split == whole
    assert isinstance(json.loads(whole), dict)
