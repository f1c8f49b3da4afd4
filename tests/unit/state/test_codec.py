"""The shared store's JSON codec: every conversation value round-trips; anything else is a ValueError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentserve.conversation import Image, Message, Reasoning, Text, ToolCall, ToolResult
from agentserve.state import codec

text = st.text(max_size=30)
parts = st.one_of(
    st.builds(Text, text),
    st.builds(Reasoning, text, st.none() | text),
    st.builds(ToolCall, text, text, text),
    st.builds(Image, text, text, text),
    st.builds(
        ToolResult,
        text,
        st.tuples(st.builds(Text, text)) | st.tuples(st.builds(Image, text, text, text)),
        st.booleans(),
        text,
    ),
)
messages = st.builds(
    Message, st.sampled_from(["system", "user", "assistant", "tool"]), st.lists(parts, max_size=5).map(tuple)
)


@given(messages)
def test_turn_round_trips(m: Message) -> None:
    assert codec.decode_turn(codec.encode_turn(m)) == m


@given(st.lists(st.builds(Text, text), max_size=3).map(tuple), st.lists(messages, max_size=4).map(tuple))
def test_response_round_trips(system: tuple[Text, ...], history: tuple[Message, ...]) -> None:
    body = {"id": "resp_1", "output": [{"type": "message"}]}
    assert codec.decode_response(codec.encode_response(system, history, body)) == (system, history, body)


@pytest.mark.parametrize(
    "data",
    [b'["robot", []]', b'["user", [["z", 1]]]', b'["user", [["c", "id"]]]', b"{}", b'"x"', b"[1]"],
)
def test_unreadable_turn_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        codec.decode_turn(data)


@pytest.mark.parametrize("data", [b"{}", b'{"s": [], "h": [], "b": 3}', b'{"s": [], "h": [["user"]]}', b"[]"])
def test_unreadable_response_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        codec.decode_response(data)
