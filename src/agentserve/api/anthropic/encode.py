"""Anthropic Messages responses: OutputEvents into SSE frames and the non-streaming message."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from agentserve.api._common import finish_error
from agentserve.api.dispatch_gate import DispatchGate
from agentserve.api.errors import ApiError, InternalError
from agentserve.api.ids import anthropic_tool_id, new_id
from agentserve.api.signing import Signer
from agentserve.api.sse import event as sse_event
from agentserve.api.sse import quote
from agentserve.api.turn import FailedCall, TurnAccumulator
from agentserve.conversation import (
    Finish,
    OutputEvent,
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
    Usage,
)


def _usage_json(usage: Usage) -> dict[str, Any]:
    cached = min(usage.cached_tokens, usage.input_tokens)
    return {
        "input_tokens": usage.input_tokens - cached,  # the uncached remainder: never double count
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": usage.output_tokens,
    }


def stop_reason(finish: Finish, dispatched: int, stop_sequence: str | None) -> str:
    if dispatched:
        return "tool_use"
    if finish.reason == "length":
        return "max_tokens"
    if stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


def _signature(signer: Signer, text: str, omitted: bool) -> str:
    # Omitted thinking travels sealed in its signature, as the real API's does, and comes back whole.
    return signer.seal_reasoning(text) if omitted else signer.sign_thinking(text)


def error_event(error: ApiError) -> bytes:
    return sse_event("error", error.anthropic_body() | {"type": "error"})


class AnthropicStreamEncoder:
    """OutputEvents in, Anthropic SSE bytes out. Call `start` first, then `feed`, then `finish`.

    Block indexes count the blocks actually sent, so a failed call leaves no gap.
    """

    __slots__ = (
        "_call",
        "_context_management",
        "_dispatched",
        "_done",
        "_gate",
        "_index",
        "_input_usage",
        "_omit_thinking",
        "_open",
        "_signer",
        "_started",
        "_stream_tool_input",
        "_thinking",
        "message_id",
        "model",
    )

    def __init__(
        self,
        model: str,
        *,
        signer: Signer,
        message_id: str | None = None,
        stream_tool_input: bool = False,
        dispatch: bool = True,
        omit_thinking: bool = False,
        context_management: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        # `{applied_edits: […]}` when the request asked for context edits (on `message_delta`).
        self._context_management = context_management
        self.message_id = message_id or new_id("msg_")
        # Streaming tool dispatch off: everything from the first finished call on waits for the end.
        self._gate = None if dispatch else DispatchGate()
        self._signer = signer
        self._stream_tool_input = stream_tool_input
        self._omit_thinking = omit_thinking
        self._index = 0
        self._open: str | None = None  # "thinking" | "text" | "tool_use" (live only)
        self._thinking: list[str] = []
        self._call: tuple[str, str, list[str]] | None = None  # (call id, name, fragments)
        self._dispatched = 0
        self._started = False
        self._done = False
        self._input_usage = Usage()

    @property
    def done(self) -> bool:
        return self._done

    def start(self, usage: Usage | None = None) -> bytes:
        """`message_start` with the prompt's usage (cached part as cache reads), then a `ping`."""
        if self._started:
            return b""
        self._started = True
        self._input_usage = usage or Usage()
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage_json(Usage(self._input_usage.input_tokens, 0, self._input_usage.cached_tokens)),
        }
        return sse_event("message_start", {"type": "message_start", "message": message}) + self.ping()

    @staticmethod
    def ping() -> bytes:
        return sse_event("ping", {"type": "ping"})

    # -- blocks -----------------------------------------------------------------------------------

    def _block_start(self, block: dict[str, Any]) -> bytes:
        return sse_event(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def _text(self, kind: str, field: str, text: str) -> bytes:
        """A text-carrying delta, rendered by hand: this is the per-token path."""
        return (
            'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
            + str(self._index)
            + ',"delta":{"type":"'
            + kind
            + '","'
            + field
            + '":'
            + quote(text)
            + "}}\n\n"
        ).encode()

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event(
            "content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}
        )

    def _block_stop(self) -> bytes:
        frame = sse_event("content_block_stop", {"type": "content_block_stop", "index": self._index})
        self._index += 1
        return frame

    def _close(self) -> bytes:
        kind, self._open = self._open, None
        if kind is None:
            return b""
        if kind == "thinking":
            signature = _signature(self._signer, "".join(self._thinking), self._omit_thinking)
            self._thinking = []
            return self._delta({"type": "signature_delta", "signature": signature}) + self._block_stop()
        return self._block_stop()

    def _text_block(self, text: str) -> bytes:
        return (
            self._block_start({"type": "text", "text": ""})
            + self._delta({"type": "text_delta", "text": text})
            + self._block_stop()
        )

    def _tool_start(self, call_id: str, name: str) -> bytes:
        return self._block_start(
            {"type": "tool_use", "id": anthropic_tool_id(call_id), "name": name, "input": {}}
        )

    # -- events -----------------------------------------------------------------------------------

    def feed(self, event: OutputEvent) -> bytes:
        if self._done:
            return b""
        out = self._feed(event)
        gate = self._gate
        return out if gate is None else gate.admit(out, self._dispatched, self._done)

    def _feed(self, event: OutputEvent) -> bytes:
        out = b"" if self._started else self.start()
        match event:  # the deltas first: they are nearly every event
            case TextDelta(text):
                if self._open != "text":
                    out += self._close() + self._block_start({"type": "text", "text": ""})
                    self._open = "text"
                return out + self._text("text_delta", "text", text)
            case ReasoningDelta(text):
                if self._open != "thinking":
                    out += self._close() + self._block_start(
                        {"type": "thinking", "thinking": "", "signature": ""}
                    )
                    self._open = "thinking"
                self._thinking.append(text)
                if self._omit_thinking:
                    return out
                return out + self._text("thinking_delta", "thinking", text)
            case ReasoningEnd():
                return out + (self._close() if self._open == "thinking" else b"")
            case ToolCallStart(_, call_id, name):
                out += self._close()
                self._call = (call_id, name, [])
                if self._stream_tool_input:
                    self._open = "tool_use"
                    out += self._tool_start(call_id, name)
                return out
            case ToolCallArgsDelta(_, fragment):
                if self._call is None:
                    return out
                self._call[2].append(fragment)
                if self._stream_tool_input and fragment:
                    out += self._text("input_json_delta", "partial_json", fragment)
                return out
            case ToolCallEnd(_, arguments):
                return out + self._end_call(arguments)
            case ToolCallError(_, _, raw, message):
                return out + self._fail_call(raw, message)
            case Finish():
                return out + self._finish(event, None)
        return out

    def _end_call(self, arguments: str) -> bytes:
        if self._call is None:
            return b""
        call_id, name, _ = self._call
        self._call = None
        self._dispatched += 1
        if self._stream_tool_input:
            self._open = None
            return self._block_stop()
        # A held call goes out whole: its arguments in one delta (the end event is authoritative).
        out = self._tool_start(call_id, name) + self._text("input_json_delta", "partial_json", arguments)
        return out + self._block_stop()  # the dispatch point

    def _fail_call(self, raw: str, message: str) -> bytes:
        if self._call is None:
            return b""
        self._call = None
        if self._stream_tool_input:
            # Half a call is already on the wire: end the stream rather than let it run.
            self._done = True
            return error_event(InternalError(message or "the model produced an invalid tool call; retry"))
        return self._text_block(raw) if raw else b""

    def finish(self, finish: Finish, stop_sequence: str | None = None) -> bytes:
        """Close what is open, then `message_delta` (stop reason, usage) and `message_stop`."""
        if self._done:
            return b""
        held = b"" if self._gate is None else self._gate.release()
        return held + self._finish(finish, stop_sequence)

    def _finish(self, finish: Finish, stop_sequence: str | None) -> bytes:
        out = b"" if self._started else self.start(finish.usage)
        out += self._close() if self._open != "tool_use" else b""
        if self._call is not None:  # a call still open at the end was cut off
            out += self._fail_call("".join(self._call[2]), "the response ended inside a tool call")
            if self._done:
                return out
        error = finish_error(finish)
        if error is not None:
            self._done = True
            return out + error_event(error)
        self._done = True
        usage = (
            _usage_json(finish.usage)
            if finish.usage.input_tokens
            else {"output_tokens": finish.usage.output_tokens}
        )
        reason = stop_reason(finish, self._dispatched, stop_sequence)
        delta = {"stop_reason": reason, "stop_sequence": stop_sequence if reason == "stop_sequence" else None}
        event: dict[str, Any] = {"type": "message_delta", "delta": delta, "usage": usage}
        if self._context_management is not None:
            event["context_management"] = self._context_management
        return out + sse_event("message_delta", event) + sse_event("message_stop", {"type": "message_stop"})

    def error(self, error: ApiError) -> bytes:
        """End the stream with an `error` event (after HTTP 200 the status cannot change)."""
        if self._done:
            return b""
        self._done = True
        out = b"" if self._gate is None else self._gate.release()
        return out + error_event(error)


def build_message(
    events: Iterable[OutputEvent] | TurnAccumulator,
    *,
    model: str,
    signer: Signer,
    message_id: str | None = None,
    stop_sequence: str | None = None,
    omit_thinking: bool = False,
    context_management: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The non-streaming `/v1/messages` response for a finished turn. Raises ApiError if it failed.
    `context_management` (`{applied_edits: […]}`) is reported when the request asked for edits."""
    turn = events if isinstance(events, TurnAccumulator) else TurnAccumulator().feed_all(list(events))
    finish = turn.finish or Finish("stop")
    error = finish_error(finish)
    if error is not None:
        raise error
    content: list[dict[str, Any]] = []
    dispatched = 0
    for item in turn.items:
        if isinstance(item, Reasoning):
            content.append(
                {
                    "type": "thinking",
                    "thinking": "" if omit_thinking else item.text,
                    "signature": _signature(signer, item.text, omit_thinking),
                }
            )
        elif isinstance(item, Text):
            content.append({"type": "text", "text": item.text})
        elif isinstance(item, ToolCall):
            dispatched += 1
            content.append(
                {
                    "type": "tool_use",
                    "id": anthropic_tool_id(item.id),
                    "name": item.name,
                    "input": json.loads(item.arguments),
                }
            )
        elif isinstance(item, FailedCall) and item.raw:
            content.append({"type": "text", "text": item.raw})
    reason = stop_reason(finish, dispatched, stop_sequence)
    body: dict[str, Any] = {
        "id": message_id or new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
        "usage": _usage_json(finish.usage),
    }
    if context_management is not None:
        body["context_management"] = context_management
    return body
