"""Conversation values as compact JSON for the shared store (pure functions, no I/O).

Parts are `[tag, fields…]` lists, so an entry is small and decoding is a table lookup. Anything
that does not decode (another version's entry, a hand-edited key) raises `ValueError`: the caller
treats it as a miss.
"""

from __future__ import annotations

import json
from typing import Any

from agentserve.conversation import Image, Message, Part, Reasoning, Text, ToolCall, ToolResult

_ROLES = frozenset(("system", "user", "assistant", "tool"))


def _part(p: Part) -> list[Any]:
    if type(p) is Text:
        return ["t", p.text]
    if type(p) is Reasoning:
        return ["r", p.text, p.signature]
    if type(p) is ToolCall:
        return ["c", p.id, p.name, p.arguments]
    if type(p) is Image:
        return ["i", p.media_type, p.data, p.url]
    assert type(p) is ToolResult
    return ["x", p.call_id, [_part(c) for c in p.content], p.is_error, p.name]


def _unpart(v: Any) -> Part:
    tag = v[0]
    if tag == "t":
        return Text(str(v[1]))
    if tag == "r":
        return Reasoning(str(v[1]), None if v[2] is None else str(v[2]))
    if tag == "c":
        return ToolCall(str(v[1]), str(v[2]), str(v[3]))
    if tag == "i":
        return Image(str(v[1]), str(v[2]), str(v[3]))
    if tag == "x":
        content = tuple(_unpart(c) for c in v[2])
        if not all(isinstance(c, Text | Image) for c in content):
            raise ValueError("a tool result holds only text and images")
        return ToolResult(str(v[1]), content, bool(v[3]), str(v[4]))  # type: ignore[arg-type]
    raise ValueError(f"unknown part tag {tag!r}")


def message_json(m: Message) -> list[Any]:
    return [m.role, [_part(p) for p in m.parts]]


def message_from_json(v: Any) -> Message:
    try:
        role, parts = v
        if role not in _ROLES:
            raise ValueError(f"unknown role {role!r}")
        return Message(role, tuple(_unpart(p) for p in parts))
    except (TypeError, IndexError, KeyError) as exc:
        raise ValueError(f"not a stored message: {exc}") from None


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def loads(data: bytes) -> Any:
    return json.loads(data)


def encode_turn(m: Message) -> bytes:
    return dumps(message_json(m))


def decode_turn(data: bytes) -> Message:
    return message_from_json(loads(data))


def encode_response(
    system: tuple[Text, ...], history: tuple[Message, ...], body: dict[str, Any] | None
) -> bytes:
    """A stored response: its system text, its whole history (input + output) and the response
    object served by GET /v1/responses/{id}."""
    return dumps({"s": [t.text for t in system], "h": [message_json(m) for m in history], "b": body})


def decode_response(data: bytes) -> tuple[tuple[Text, ...], tuple[Message, ...], dict[str, Any] | None]:
    try:
        v = loads(data)
        system = tuple(Text(str(t)) for t in v["s"])
        history = tuple(message_from_json(m) for m in v["h"])
        body = v.get("b")
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"not a stored response: {exc}") from None
    if body is not None and not isinstance(body, dict):
        raise ValueError("a stored response's body is an object")
    return system, history, body
