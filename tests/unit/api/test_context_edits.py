"""Anthropic context edits (`api/anthropic/context.py`): parsing and the pure history edits."""

from __future__ import annotations

import pytest

from agentserve.api.anthropic.context import (
    CLEARED_RESULT,
    AppliedEdit,
    ClearThinking,
    ClearToolUses,
    ContextManagement,
    apply_edits,
    parse_context_management,
)
from agentserve.api.errors import InvalidRequestError
from agentserve.conversation import Conversation, Message, Reasoning, Text, ToolCall, ToolResult


def history(uses: int, names: tuple[str, ...] = ("Read",)) -> Conversation:
    messages = [Message("user", (Text("go"),))]
    for i in range(uses):
        name = names[i % len(names)]
        messages.append(
            Message("assistant", (Reasoning(f"step {i}"), ToolCall(f"c{i}", name, f'{{"i": {i}}}')))
        )
        messages.append(Message("tool", (ToolResult(f"c{i}", (Text("x" * 100),), False, name),)))
    return Conversation((), tuple(messages))


def size(conversation: Conversation) -> int:
    """A stand-in token count: characters of every part."""
    total = 0
    for m in conversation.messages:
        for p in m.parts:
            if isinstance(p, ToolResult):
                total += len(p.text)
            elif isinstance(p, ToolCall):
                total += len(p.arguments)
            elif isinstance(p, Text | Reasoning):
                total += len(p.text)
    return total


def results(conversation: Conversation) -> list[str]:
    return [p.text for m in conversation.messages for p in m.parts if isinstance(p, ToolResult)]


def test_parse_reads_every_documented_option() -> None:
    parsed = parse_context_management(
        {
            "edits": [
                {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}},
                {
                    "type": "clear_tool_uses_20250919",
                    "trigger": {"type": "tool_uses", "value": 4},
                    "keep": {"type": "tool_uses", "value": 1},
                    "clear_at_least": {"type": "input_tokens", "value": 50},
                    "exclude_tools": ["Bash"],
                    "clear_tool_inputs": ["Read"],
                },
            ]
        },
        "context_management",
    )
    assert parsed == ContextManagement(
        (
            ClearThinking(2),
            ClearToolUses("tool_uses", 4, 1, 50, frozenset({"Bash"}), frozenset({"Read"})),
        )
    )
    assert parse_context_management({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}, "c") == (
        ContextManagement((ClearThinking(None),))
    )
    defaults = parse_context_management({"edits": [{"type": "clear_tool_uses_20250919"}]}, "c")
    assert defaults == ContextManagement((ClearToolUses("input_tokens", 100_000, 3),))


@pytest.mark.parametrize(
    ("edit", "param"),
    [
        ({"type": "compact_20260112"}, "context_management.edits[0].type"),
        ({"type": "clear_tool_uses_20250919", "keep": {"type": "input_tokens", "value": 1}}, "keep.type"),
        ({"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses"}}, "trigger.value"),
        ({"type": "clear_tool_uses_20250919", "exclude_tools": [3]}, "exclude_tools[0]"),
    ],
)
def test_parse_refuses_what_it_cannot_apply(edit: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        parse_context_management({"edits": [edit]}, "context_management")
    assert (caught.value.param or "").endswith(param)


def test_clear_tool_uses_keeps_the_newest_and_the_excluded() -> None:
    conversation = history(5, ("Read", "Bash"))
    edit = ClearToolUses(trigger_value=10, keep=1, exclude_tools=frozenset({"Bash"}))
    edited, applied = apply_edits(conversation, ContextManagement((edit,)), size)
    # Read calls are c0, c2, c4: the newest (c4) stays, c0 and c2 go; Bash (c1, c3) is excluded.
    assert results(edited) == [CLEARED_RESULT, "x" * 100, CLEARED_RESULT, "x" * 100, "x" * 100]
    assert applied == (AppliedEdit("clear_tool_uses_20250919", size(conversation) - size(edited), 2),)
    # The calls themselves stay, with their inputs unless asked.
    assert next(c.arguments for m in edited.messages for c in m.tool_calls) == '{"i": 0}'
    inputs = ClearToolUses(trigger_value=10, keep=1, clear_inputs=True)
    cleared, _ = apply_edits(conversation, ContextManagement((inputs,)), size)
    assert [c.arguments for m in cleared.messages for c in m.tool_calls] == ["{}"] * 4 + ['{"i": 4}']


def test_clear_tool_uses_waits_for_its_trigger_and_clear_at_least() -> None:
    conversation = history(4)
    below = ClearToolUses(trigger_value=size(conversation))  # not over the trigger
    assert apply_edits(conversation, ContextManagement((below,)), size) == (conversation, ())
    by_uses = ClearToolUses(trigger="tool_uses", trigger_value=3, keep=3)
    edited, applied = apply_edits(conversation, ContextManagement((by_uses,)), size)
    assert len(applied) == 1 and applied[0].cleared == 1 and results(edited)[0] == CLEARED_RESULT
    greedy = ClearToolUses(trigger_value=1, keep=3, clear_at_least=10_000)  # clearing 1 is not enough
    assert apply_edits(conversation, ContextManagement((greedy,)), size) == (conversation, ())


def test_clear_thinking_keeps_the_last_turns() -> None:
    conversation = history(4)
    edited, applied = apply_edits(conversation, ContextManagement((ClearThinking(1),)), size)
    kept = [any(isinstance(p, Reasoning) for p in m.parts) for m in edited.messages if m.role == "assistant"]
    assert kept == [False, False, False, True]
    assert applied == (AppliedEdit("clear_thinking_20251015", len("step 0") * 3, 3),)
    assert applied[0].to_json() == {
        "type": "clear_thinking_20251015",
        "cleared_input_tokens": 18,
        "cleared_thinking_turns": 3,
    }


def test_keep_all_costs_no_count() -> None:
    """Claude Code sends `keep: all` on every request: nothing to do, nothing rendered."""

    def never(conversation: Conversation) -> int:
        raise AssertionError("counted")

    conversation = history(3)
    assert apply_edits(conversation, ContextManagement((ClearThinking(None),)), never) == (conversation, ())
