"""A model turn's OutputEvents folded back into the assistant Message that history will carry.

This is what every API codec does in spirit (events → wire message → the client echoes it back →
Conversation), without a wire format in between: the round-trip law is tested on it per family.
Reasoning segments stay separate and in order; a call that was never dispatched (`ToolCallError`)
comes back as the text the model wrote, since that is what the client saw.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentserve.conversation import (
    Message,
    OutputEvent,
    Part,
    Reasoning,
    ReasoningDelta,
    ReasoningEnd,
    Text,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
)


def events_to_message(events: Iterable[OutputEvent]) -> Message:
    parts: list[Part] = []
    reasoning: list[str] = []
    calls: dict[int, ToolCallStart] = {}

    def add_text(text: str) -> None:
        if parts and isinstance(parts[-1], Text):
            parts[-1] = Text(parts[-1].text + text)
        else:
            parts.append(Text(text))

    def end_reasoning() -> None:
        if reasoning:
            parts.append(Reasoning("".join(reasoning)))
            reasoning.clear()

    for event in events:
        if isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ReasoningEnd):
            end_reasoning()
        elif isinstance(event, TextDelta):
            end_reasoning()
            add_text(event.text)
        elif isinstance(event, ToolCallStart):
            end_reasoning()
            calls[event.index] = event
        elif isinstance(event, ToolCallEnd):
            start = calls.pop(event.index)
            parts.append(ToolCall(start.id, start.name, event.arguments))
        elif isinstance(event, ToolCallError):
            calls.pop(event.index, None)
            add_text(event.raw)
    end_reasoning()
    return Message("assistant", tuple(parts))
