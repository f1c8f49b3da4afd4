"""Reasoning replay: which past reasoning goes back into the prompt, and in what form.

The KV cache is reused only if each prompt extends the previous prompt plus the model's own output, so
reasoning the model wrote must come back exactly where it was, or the prompt diverges there.

Policies (`ReplayPolicy`, per deployment):
- `native`: hand each segment to the template as `reasoning_content` (the template places it);
- `inject`: write each segment as the family's think block into the content right before its own
  tool call (a turn whose reasoning is interleaved with its calls is split into runs, one per
  segment, so no segment moves to the front);
- `drop`: never replay reasoning;
- `auto`: `native` when the template reads reasoning itself, else `inject` when the family has an
  inline think block, else `drop` (gpt-oss channels and Llama-style models have no block to inject).

Per turn kind: a *turn* runs from one user query to the next (tool results do not start one). Agent
turns (turns with a tool call) and the turn after the last user query keep their reasoning; plain chat
turns before the last query follow the family default, which for all twelve families is to drop it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

from agentserve.config import ReplayPolicy
from agentserve.conversation import Message, Part, Reasoning, Text, ToolCall, ToolResult
from agentserve.prompt.markup import FamilyMarkup
from agentserve.prompt.template import ChatTemplate

ReplayMode = Literal["native", "inject", "drop"]


def resolve_mode(policy: ReplayPolicy, template: ChatTemplate, markup: FamilyMarkup) -> ReplayMode:
    """The mode a policy means for this template and family."""
    if policy is ReplayPolicy.DROP:
        return "drop"
    if policy is ReplayPolicy.NATIVE:
        return "native"
    if policy is ReplayPolicy.INJECT and markup.can_inject:
        return "inject"
    # auto, or inject for a family with no inline think block
    if template.reads_reasoning:
        return "native"
    return "inject" if markup.can_inject else "drop"


def is_user_query(message: Message) -> bool:
    """A user message that starts a turn: anything but a message carrying only tool results."""
    return message.role == "user" and not any(isinstance(p, ToolResult) for p in message.parts)


def kept_reasoning(messages: Sequence[Message], keep_chat_reasoning: bool = False) -> list[bool]:
    """Per message: whether its reasoning is replayed (always False for non-assistant messages)."""
    starts = [i for i, m in enumerate(messages) if is_user_query(m)]
    last_query = starts[-1] if starts else -1
    bounds = [0, *starts, len(messages)]
    keep = [False] * len(messages)
    for lo, hi in pairwise(bounds):
        turn = range(lo, hi)
        agent_turn = any(
            isinstance(p, ToolCall)
            for i in turn
            if messages[i].role == "assistant"
            for p in messages[i].parts
        )
        for i in turn:
            if messages[i].role == "assistant":
                keep[i] = agent_turn or i > last_query or keep_chat_reasoning
    return keep


@dataclass(frozen=True, slots=True)
class Run:
    """A stretch of an assistant turn in the order templates render it: reasoning, text, tool calls."""

    reasoning: str | None
    text: str
    calls: tuple[ToolCall, ...]


PART_SEPARATOR = "\n"  # between adjacent text parts of a system, user or tool message
# Adjacent text parts of an assistant turn are one stretch of the model's output that an API split
# into blocks or items (Anthropic text blocks around a failed call or at citations, Responses message
# items): they join with nothing, or the replayed turn differs from what the model wrote.
ASSISTANT_PART_SEPARATOR = ""


def assistant_runs(parts: Sequence[Part]) -> list[Run]:
    """Split an assistant turn into runs so each reasoning segment stays right before what it explains.

    A new run starts at every reasoning segment after the first part and at text that follows a tool
    call. `[R1, C1, R2, C2]` gives two runs; the usual `[R, T, C, C]` gives one.
    """
    runs: list[Run] = []
    reasoning: str | None = None
    texts: list[str] = []
    calls: list[ToolCall] = []

    def flush() -> None:
        if reasoning is not None or texts or calls:
            runs.append(Run(reasoning, ASSISTANT_PART_SEPARATOR.join(texts), tuple(calls)))

    for part in parts:
        if isinstance(part, Reasoning):
            flush()
            reasoning, texts, calls = part.text, [], []
        elif isinstance(part, Text):
            if calls:
                flush()
                reasoning, texts, calls = None, [], []
            texts.append(part.text)
        elif isinstance(part, ToolCall):
            calls.append(part)
    flush()
    return runs
