"""OutputEvents folded into the assistant message history carries; the canonical JSON form."""

from __future__ import annotations

import pytest

from agentserve.conversation import (
    Conversation,
    Finish,
    Image,
    Message,
    Reasoning,
    ReasoningDelta,
    ReasoningEnd,
    Text,
    TextDelta,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
    ToolResult,
    ToolSpec,
)
from agentserve.prompt.canonical import RequestFormatError, conversation_from_json, conversation_to_json
from agentserve.prompt.history import events_to_message


def test_segments_stay_separate_and_in_order() -> None:
    events = [
        ReasoningDelta("first "),
        ReasoningDelta("thought"),
        ReasoningEnd(),
        TextDelta("Let me "),
        TextDelta("check."),
        ToolCallStart(0, "c0", "read"),
        ToolCallArgsDelta(0, '{"path"'),
        ToolCallArgsDelta(0, ': "a"}'),
        ToolCallEnd(0, '{"path": "a"}'),
        ReasoningDelta("second"),
        ReasoningEnd(),
        ToolCallStart(1, "c1", "bash"),
        ToolCallEnd(1, "{}"),
        Finish("tool_calls"),
    ]
    assert events_to_message(events) == Message(
        "assistant",
        (
            Reasoning("first thought"),
            Text("Let me check."),
            ToolCall("c0", "read", '{"path": "a"}'),
            Reasoning("second"),
            ToolCall("c1", "bash", "{}"),
        ),
    )


def test_a_call_that_was_never_dispatched_comes_back_as_the_text_the_model_wrote() -> None:
    events = [
        TextDelta("Trying. "),
        ToolCallStart(0, "c0", "write"),
        ToolCallError(0, "truncated", '<tool_call>{"name": "write"'),
    ]
    assert events_to_message(events).parts == (Text('Trying. <tool_call>{"name": "write"'),)


def test_reasoning_without_an_explicit_end_is_kept() -> None:
    assert events_to_message([ReasoningDelta("r")]).parts == (Reasoning("r"),)


def test_canonical_json_round_trips_a_conversation() -> None:
    conv = Conversation(
        (Text("sys"),),
        (
            Message("user", (Text("hi"), Image("image/png", "AAAA"))),
            Message("assistant", (Reasoning("r", "sig"), ToolCall("1", "f", '{"a": 1}'))),
            Message("tool", (ToolResult("1", (Text("ok"),), True, "f"),)),
        ),
        (ToolSpec("f", "does f", {"type": "object"}),),
    )
    assert conversation_from_json(conversation_to_json(conv)) == conv


def test_canonical_shorthands() -> None:
    conv = conversation_from_json(
        {
            "system": "sys",
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "reasoning": "why",
                    "content": [{"type": "tool_call", "id": "1", "name": "f", "arguments": {"a": "é"}}],
                },
                {"role": "user", "content": [{"type": "tool_result", "call_id": "1", "content": "ok"}]},
            ],
        }
    )
    assert conv.system == (Text("sys"),)
    assert conv.tools[0].parameters == {"type": "object"}
    assert conv.messages[1].parts == (Reasoning("why"), ToolCall("1", "f", '{"a": "é"}'))
    assert conv.messages[2].parts == (ToolResult("1", (Text("ok"),)),)


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
        {"tools": [{"description": "no name"}]},
    ],
)
def test_malformed_canonical_requests_are_clear_errors(body: object) -> None:
    with pytest.raises(RequestFormatError):
        conversation_from_json(body)
