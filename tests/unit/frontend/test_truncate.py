"""Responses `truncation: auto` (`frontend/truncate.py`): whole oldest units go first."""

from __future__ import annotations

from agentserve.conversation import Conversation, Message, Text, ToolCall, ToolResult
from agentserve.frontend.truncate import truncate_oldest, unit_starts


def user(text: str) -> Message:
    return Message("user", (Text(text),))


def call_turn(i: int) -> list[Message]:
    return [
        Message("assistant", (ToolCall(f"c{i}", "Read", "{}"),)),
        Message("tool", (ToolResult(f"c{i}", (Text("r" * 10),)),)),
    ]


def conversation() -> Conversation:
    messages = [user("a" * 10), *call_turn(0), user("b" * 10), *call_turn(1), user("c" * 10)]
    return Conversation((Text("instructions"),), tuple(messages))


def length(c: Conversation) -> int:
    return sum(len(p.text) if isinstance(p, Text) else 10 for m in c.messages for p in m.parts)


def test_units_never_split_a_call_from_its_result() -> None:
    assert unit_starts(conversation().messages) == [0, 1, 3, 4, 6]


def test_the_fewest_oldest_units_go_and_instructions_stay() -> None:
    c = conversation()
    assert length(c) == 70
    cut, dropped = truncate_oldest(c, lambda x: length(x) <= 45) or (None, 0)
    assert cut is not None
    # A cut that opens on a user message is preferred: dropping through the first call turn.
    assert dropped == 3 and cut.messages[0] == user("b" * 10)
    assert cut.system == c.system
    assert all(
        any(isinstance(p, ToolCall) and p.id == r.call_id for m in cut.messages for p in m.parts)
        for m in cut.messages
        for r in m.parts
        if isinstance(r, ToolResult)
    )


def test_nothing_that_fits_is_none() -> None:
    assert truncate_oldest(conversation(), lambda x: False) is None


def test_without_a_user_cut_any_unit_boundary_serves() -> None:
    messages = (user("a" * 10), *call_turn(0), *call_turn(1))
    c = Conversation((), messages)
    cut, dropped = truncate_oldest(c, lambda x: length(x) <= 20) or (None, 0)
    assert cut is not None and dropped == 3 and cut.messages[0].role == "assistant"
