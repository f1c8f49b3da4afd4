"""Responses `truncation: "auto"`: drop the oldest conversation items until the prompt fits.

OpenAI documents `auto` as: when the input exceeds the context window, items are dropped from the
beginning of the conversation. Here an item is a *unit* that must stay whole: a message, and an
assistant turn together with the tool results that answer its calls (a call never loses its result,
nor a result its call). The system text (instructions, developer messages before the first item)
is never dropped. A pure function: the caller says whether a conversation fits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from agentserve.conversation import Conversation, Message


def unit_starts(messages: tuple[Message, ...]) -> list[int]:
    """Indices where a droppable unit starts: every message but a tool result (it belongs to the
    turn whose call it answers)."""
    return [i for i, m in enumerate(messages) if m.role != "tool"]


def truncate_oldest(
    conversation: Conversation, fits: Callable[[Conversation], bool]
) -> tuple[Conversation, int] | None:
    """The conversation with the fewest oldest units dropped that fits, and how many messages went;
    None when not even the last unit alone fits. Cuts prefer a user message first (templates expect
    a conversation to open with one); `fits` is called O(log n) times (dropping more never grows
    the prompt)."""
    messages = conversation.messages
    starts = [i for i in unit_starts(messages) if i > 0]
    users = [i for i in starts if messages[i].role == "user"]
    for cuts in (users, starts):
        if not cuts:
            continue
        lo, hi = 0, len(cuts) - 1
        if not fits(_cut(conversation, cuts[hi])):
            continue
        while lo < hi:  # the smallest cut that fits
            mid = (lo + hi) // 2
            if fits(_cut(conversation, cuts[mid])):
                hi = mid
            else:
                lo = mid + 1
        return _cut(conversation, cuts[lo]), cuts[lo]
    return None


def _cut(conversation: Conversation, start: int) -> Conversation:
    return replace(conversation, messages=conversation.messages[start:])
