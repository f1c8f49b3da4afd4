"""OutputEvents as JSON, merged streams, and a checked summary of a parsed turn.

`event_to_json` is the stable schema printed by `agentserve parse` (docs/parse-events.md).
`merge_deltas` joins adjacent deltas of the same kind, so two chunkings of one output compare equal.
`summarize` checks the event-stream invariants every parser must keep and folds a turn into
segments (`{"reasoning": …}`, `{"text": …}`, `{"call": name, "args": {…}}`, `{"error": …}`): the
form the test corpus is written in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from agentserve.conversation import (
    Finish,
    OutputEvent,
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
)


def event_to_json(event: OutputEvent) -> dict[str, Any]:
    match event:
        case ReasoningDelta(text):
            return {"type": "reasoning_delta", "text": text}
        case ReasoningEnd():
            return {"type": "reasoning_end"}
        case TextDelta(text):
            return {"type": "text_delta", "text": text}
        case ToolCallStart(index, call_id, name):
            return {"type": "tool_call_start", "index": index, "id": call_id, "name": name}
        case ToolCallArgsDelta(index, fragment):
            return {"type": "tool_call_args_delta", "index": index, "fragment": fragment}
        case ToolCallEnd(index, arguments):
            return {"type": "tool_call_end", "index": index, "arguments": json.loads(arguments)}
        case ToolCallError(index, reason, raw, message):
            return {
                "type": "tool_call_error",
                "index": index,
                "reason": reason,
                "raw": raw,
                "message": message,
            }
        case Finish(reason, usage):
            return {
                "type": "finish",
                "reason": reason,
                "usage": {
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                    "cached_tokens": usage.cached_tokens,
                    "reasoning_tokens": usage.reasoning_tokens,
                },
            }
    raise TypeError(f"not an OutputEvent: {event!r}")


def merge_deltas(events: Iterable[OutputEvent]) -> list[OutputEvent]:
    out: list[OutputEvent] = []
    for e in events:
        last = out[-1] if out else None
        if isinstance(e, ReasoningDelta) and isinstance(last, ReasoningDelta):
            out[-1] = ReasoningDelta(last.text + e.text)
        elif isinstance(e, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + e.text)
        elif (
            isinstance(e, ToolCallArgsDelta) and isinstance(last, ToolCallArgsDelta) and last.index == e.index
        ):
            out[-1] = ToolCallArgsDelta(e.index, last.fragment + e.fragment)
        else:
            out.append(e)
    return out


class EventStreamError(AssertionError):
    """The events break an invariant of the OutputEvent stream."""


def summarize(events: Iterable[OutputEvent]) -> list[dict[str, Any]]:
    """Check the stream invariants and fold it into segments (see module docstring)."""
    summary: list[dict[str, Any]] = []
    reasoning: list[str] | None = None
    text: list[str] | None = None
    call: dict[str, Any] | None = None
    next_index = 0

    def flush_text() -> None:
        nonlocal text
        if text is not None:
            summary.append({"text": "".join(text)})
            text = None

    for e in events:
        if call is not None and not isinstance(e, ToolCallArgsDelta | ToolCallEnd | ToolCallError):
            raise EventStreamError(f"{e!r} inside open tool call {call['index']}")
        if reasoning is not None and not isinstance(e, ReasoningDelta | ReasoningEnd):
            raise EventStreamError(f"{e!r} before the reasoning segment ended")
        match e:
            case ReasoningDelta(t):
                flush_text()
                if not t:
                    raise EventStreamError("empty reasoning delta")
                reasoning = [*(reasoning or []), t]
            case ReasoningEnd():
                if reasoning is None:
                    raise EventStreamError("reasoning end without reasoning")
                summary.append({"reasoning": "".join(reasoning)})
                reasoning = None
            case TextDelta(t):
                if not t:
                    raise EventStreamError("empty text delta")
                text = [*(text or []), t]
            case ToolCallStart(index, call_id, name):
                flush_text()
                if index != next_index:
                    raise EventStreamError(f"tool call index {index}, expected {next_index}")
                if not call_id or not name:
                    raise EventStreamError("tool call without id or name")
                next_index += 1
                call = {"index": index, "name": name, "fragments": []}
            case ToolCallArgsDelta(index, fragment):
                if call is None or call["index"] != index:
                    raise EventStreamError(f"arguments delta for call {index} that is not open")
                call["fragments"].append(fragment)
            case ToolCallEnd(index, arguments):
                if call is None or call["index"] != index:
                    raise EventStreamError(f"end of call {index} that is not open")
                joined = "".join(call["fragments"])
                if joined != arguments:
                    raise EventStreamError(f"call {index}: fragments {joined!r} != arguments {arguments!r}")
                args = json.loads(arguments)
                if not isinstance(args, dict):
                    raise EventStreamError(f"call {index}: arguments are not an object")
                summary.append({"call": call["name"], "args": args})
                call = None
            case ToolCallError(index, reason, _raw, _message):
                if call is None or call["index"] != index:
                    raise EventStreamError(f"error for call {index} that is not open")
                summary.append({"error": reason, "name": call["name"]})
                call = None
            case Finish():
                pass
    if reasoning is not None or call is not None:
        raise EventStreamError("stream ended with an open reasoning segment or tool call")
    flush_text()
    return summary
