"""Local `$ref`s kept valid where part of a schema is used on its own (`agentserve.schema_refs`),
checked against a real validator (jsonschema) and the real grammar engine (llguidance)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from llguidance import LLMatcher

from agentserve.constraints.engine import engine_for, schema_error
from agentserve.schema_refs import deref, has_local_refs, inlined, nested, pointer, rebased, standalone
from agentserve.worker.tokenizer import EMBEDDED_TOKENIZER, HFTokenizer

TOKENIZER = HFTokenizer.from_file(EMBEDDED_TOKENIZER)
ENGINE = engine_for(TOKENIZER.to_json())

ROOT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "start": {"$ref": "#/$defs/Point"},
        "color": {"$ref": "#/$defs/Color", "description": "beside the ref"},
        "a/b": {"$ref": "#/properties/color"},
        "tree": {"$ref": "#/$defs/Node"},
    },
    "required": ["start", "color"],
    "$defs": {
        "Point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        "Color": {"type": "string", "enum": ["red", "green"]},
        "Node": {
            "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
        },
        "Loop": {"$ref": "#/$defs/Loop"},
    },
}


def accepts(schema: Any, value: Any) -> bool:
    """What llguidance's compiled grammar says of `value` as JSON text."""
    grammar = LLMatcher.grammar_from_json_schema(schema)
    matcher = ENGINE.matcher(grammar)
    ids = TOKENIZER.encode(json.dumps(value))
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


def test_pointers_follow_json_pointer_escapes() -> None:
    assert pointer(ROOT, "#") is ROOT
    assert pointer(ROOT, "#/properties/a~1b") == {"$ref": "#/properties/color"}
    assert pointer(ROOT, "#/$defs/Nope") is None and pointer({"a": [1, 2]}, "#/a/1") == 2


def test_deref_follows_refs_to_refs_and_keeps_the_siblings() -> None:
    color = deref(ROOT["properties"]["a/b"], ROOT)
    assert color == {"type": "string", "enum": ["red", "green"], "description": "beside the ref"}
    assert deref({"$ref": "#/$defs/Loop"}, ROOT) == {}  # a cycle of refs resolves to nothing
    assert deref({"$ref": "#/nowhere", "type": "integer"}, ROOT) == {"type": "integer"}
    assert deref({"$ref": "other.json#/x"}, ROOT) == {"$ref": "other.json#/x"}  # not local: left alone


def test_inlined_cuts_a_recursive_schema_at_its_depth() -> None:
    tree = inlined(ROOT["properties"]["tree"], ROOT, depth=4)
    assert not has_local_refs(tree)
    assert tree["properties"]["kids"]["items"]["type"] == "object"  # type: ignore[index]


def test_rebased_refs_reach_the_same_targets_from_a_wrapper() -> None:
    wrapper = {"type": "object", "properties": {"arguments": nested(ROOT, "#/properties/arguments")}}
    assert schema_error(wrapper) is None
    good = {"arguments": {"start": {"x": 1}, "color": "red", "tree": {"kids": [{"kids": []}]}}}
    bad = {"arguments": {"start": {"x": "1"}, "color": "red"}}
    jsonschema.validate(good, wrapper)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, wrapper)
    assert accepts(wrapper, good) and not accepts(wrapper, bad)
    assert nested({"type": "string"}, "#/x") == {"type": "string"}  # nothing to rebase: as it is
    assert rebased({"$ref": "#"}, "#/a") == {"$ref": "#/a"}


@pytest.mark.parametrize(
    ("key", "good", "bad"),
    [
        ("start", {"x": 3}, {"x": 3.5}),
        ("color", "green", "blue"),
        ("a/b", "red", "Red"),
        ("tree", {"kids": [{"kids": [{}]}]}, {"kids": [{"kids": 1}]}),
    ],
)
def test_a_part_standing_alone_keeps_its_refs(key: str, good: Any, bad: Any) -> None:
    part = standalone(ROOT["properties"][key], ROOT)
    assert schema_error(part) is None
    jsonschema.validate(good, part)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, part)
    assert accepts(part, good) and not accepts(part, bad)
    plain = {"type": "integer"}
    assert standalone(plain, {"properties": {"n": plain}}) is plain  # a root without refs: as it is
