"""Replay policy: mode resolution, per-turn-kind retention, runs."""

from __future__ import annotations

import pytest

from agentserve.config import ReplayPolicy
from agentserve.conversation import Message, Reasoning, Text, ToolCall, ToolResult
from agentserve.prompt.markup import FamilyMarkup
from agentserve.prompt.replay import Run, assistant_runs, kept_reasoning, resolve_mode
from agentserve.prompt.template import ChatTemplate

READS = ChatTemplate("{{ messages[0].reasoning_content }}")
BLIND = ChatTemplate("{{ messages[0].content }}")
THINK = FamilyMarkup("<think>", "</think>")
NO_BLOCK = FamilyMarkup()


@pytest.mark.parametrize(
    ("policy", "template", "markup", "mode"),
    [
        (ReplayPolicy.AUTO, READS, THINK, "native"),
        (ReplayPolicy.AUTO, BLIND, THINK, "inject"),
        (ReplayPolicy.AUTO, BLIND, NO_BLOCK, "drop"),
        (ReplayPolicy.AUTO, READS, NO_BLOCK, "native"),
        (ReplayPolicy.INJECT, READS, THINK, "inject"),
        (ReplayPolicy.INJECT, READS, NO_BLOCK, "native"),
        (ReplayPolicy.INJECT, BLIND, NO_BLOCK, "drop"),
        (ReplayPolicy.NATIVE, BLIND, THINK, "native"),
        (ReplayPolicy.DROP, READS, THINK, "drop"),
    ],
)
def test_resolve_mode(policy: ReplayPolicy, template: ChatTemplate, markup: FamilyMarkup, mode: str) -> None:
    assert resolve_mode(policy, template, markup) == mode


def m(role: str, *parts: object) -> Message:
    return Message(role, tuple(Text(p) if isinstance(p, str) else p for p in parts))  # type: ignore[arg-type]


def test_agent_turns_and_the_last_turn_keep_reasoning_plain_chat_turns_do_not() -> None:
    messages = [
        m("user", "chat question"),
        m("assistant", Reasoning("r"), "chat answer"),  # plain chat, before the last query: dropped
        m("user", "agent task"),
        m("assistant", Reasoning("r"), ToolCall("1", "f")),  # agent turn
        m("user", ToolResult("1", (Text("ok"),))),  # a tool result does not start a turn
        m("assistant", Reasoning("r"), "done"),  # same agent turn: kept
        m("user", "last question"),
        m("assistant", Reasoning("r"), "answer"),  # after the last query: kept
    ]
    assert kept_reasoning(messages) == [False, False, False, True, False, True, False, True]
    assert kept_reasoning(messages, keep_chat_reasoning=True)[1] is True


def test_runs_keep_each_segment_before_what_it_explains() -> None:
    c1, c2 = ToolCall("1", "a"), ToolCall("2", "b")
    assert assistant_runs([Reasoning("r"), Text("t"), c1, c2]) == [Run("r", "t", (c1, c2))]
    assert assistant_runs([Reasoning("r1"), c1, Reasoning("r2"), c2]) == [
        Run("r1", "", (c1,)),
        Run("r2", "", (c2,)),
    ]
    assert assistant_runs([c1, Text("after")]) == [Run(None, "", (c1,)), Run(None, "after", ())]
    # Adjacent texts are one stretch of output an API split into blocks: they join with nothing.
    assert assistant_runs([Text("Let me check."), Text("< oops")]) == [Run(None, "Let me check.< oops", ())]
    assert assistant_runs([]) == []
