"""Chat Completions responses: OutputEvents into chunks and the non-streaming completion."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from agentserve.api._common import finish_error
from agentserve.api.errors import ApiError, InternalError
from agentserve.api.ids import new_id
from agentserve.api.logprobs import tokens_json
from agentserve.api.responses.common import custom_input
from agentserve.api.sse import DONE, PING_COMMENT, dumps, quote
from agentserve.api.sse import event as sse_event
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

REASONING_SEPARATOR = "\n\n"  # between reasoning segments in the flat reasoning field


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": min(usage.cached_tokens, usage.input_tokens)},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def finish_reason(finish: Finish, dispatched: int) -> str:
    if dispatched:
        return "tool_calls"
    return "length" if finish.reason == "length" else "stop"


def _tool_call_json(
    index: int, call_id: str, name: str, arguments: str, custom: frozenset[str] = frozenset()
) -> dict[str, Any]:
    if name in custom:  # a custom tool's call carries its freeform input, not JSON arguments
        return {
            "index": index,
            "id": call_id,
            "type": "custom",
            "custom": {"name": name, "input": custom_input(arguments)},
        }
    return {
        "index": index,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class ChatStreamEncoder:
    """OutputEvents in, Chat Completions SSE bytes out: `start`, `feed`…, `finish` (or `error`)."""

    __slots__ = (
        "_call",
        "_custom",
        "_dispatch",
        "_done",
        "_envelope",
        "_in_reasoning",
        "_include_usage",
        "_reasoned",
        "_sent_calls",
        "_started",
        "_stream_arguments",
        "completion_id",
        "created",
        "model",
    )

    def __init__(
        self,
        model: str,
        *,
        completion_id: str | None = None,
        created: int | None = None,
        include_usage: bool = False,
        dispatch: bool = True,
        stream_tool_arguments: bool = False,
        custom_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.model = model
        self._custom = custom_tools
        self.completion_id = completion_id or new_id("chatcmpl-")
        self.created = int(time.time()) if created is None else created
        self._include_usage = include_usage
        self._dispatch = dispatch
        self._stream_arguments = stream_tool_arguments
        # Every chunk starts the same: render that once (this runs per token).
        self._envelope = (
            'data: {"id":'
            + dumps(self.completion_id)
            + ',"object":"chat.completion.chunk","created":'
            + str(self.created)
            + ',"model":'
            + dumps(model)
            + ","
        )
        self._started = False
        self._done = False
        self._reasoned = False  # a reasoning segment was sent (the next one needs a separator)
        self._in_reasoning = False
        self._call: tuple[str, str, list[str]] | None = None
        self._sent_calls = 0

    @property
    def done(self) -> bool:
        return self._done

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return self._raw_chunk(dumps(delta), "null" if finish is None else dumps(finish))

    def _raw_chunk(self, delta_json: str, finish_json: str = "null", logprobs_json: str = "null") -> bytes:
        return (
            self._envelope
            + '"choices":[{"index":0,"delta":'
            + delta_json
            + ',"logprobs":'
            + logprobs_json
            + ',"finish_reason":'
            + finish_json
            + "}]}\n\n"
        ).encode()

    def start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self._chunk({"role": "assistant", "content": ""})

    @staticmethod
    def ping() -> bytes:
        """An SSE comment: keeps proxies and idle timers awake, ignored by clients."""
        return PING_COMMENT

    def feed(self, event: OutputEvent) -> bytes:
        if self._done:
            return b""
        out = b"" if self._started else self.start()
        match event:  # the deltas first: they are nearly every event
            case TextDelta(text, logprobs):
                self._in_reasoning = False
                if logprobs is None:
                    return out + self._raw_chunk('{"content":' + quote(text) + "}")
                lps = dumps({"content": tokens_json(logprobs), "refusal": None})
                return out + self._raw_chunk('{"content":' + quote(text) + "}", logprobs_json=lps)
            case ReasoningDelta(text):
                if not self._in_reasoning:
                    if self._reasoned:
                        text = REASONING_SEPARATOR + text
                    self._in_reasoning = self._reasoned = True
                quoted = quote(text)  # the per-token path: render by hand, encode the text once
                return out + self._raw_chunk(
                    '{"reasoning_content":' + quoted + ',"reasoning":' + quoted + "}"
                )
            case ReasoningEnd():
                self._in_reasoning = False
                return out
            case ToolCallStart(_, call_id, name):
                self._in_reasoning = False
                self._call = (call_id, name, [])
                if self._stream_arguments and name not in self._custom:
                    out += self._chunk({"tool_calls": [_tool_call_json(self._sent_calls, call_id, name, "")]})
                return out
            case ToolCallArgsDelta(_, fragment):
                if self._call is not None:
                    self._call[2].append(fragment)
                    if self._stream_arguments and fragment and self._call[1] not in self._custom:
                        delta = {"index": self._sent_calls, "function": {"arguments": fragment}}
                        out += self._chunk({"tool_calls": [delta]})
                return out
            case ToolCallEnd(_, arguments):
                return out + self._end_call(arguments)
            case ToolCallError(_, _, raw, message):
                return out + self._fail_call(raw, message)
            case Finish():
                return out + self.finish(event)
        return out

    def _end_call(self, arguments: str) -> bytes:
        if self._call is None:
            return b""
        call_id, name, _ = self._call
        self._call = None
        index = self._sent_calls
        self._sent_calls += 1
        out = b""
        if self._dispatch:
            payload = {
                "id": self.completion_id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "choice_index": 0,
                "tool_call": _tool_call_json(index, call_id, name, arguments, self._custom),
            }
            out += sse_event("tool_call_dispatch", payload)
        if not self._stream_arguments or name in self._custom:  # a custom call's input comes whole
            out += self._chunk(
                {"tool_calls": [_tool_call_json(index, call_id, name, arguments, self._custom)]}
            )
        return out

    def _fail_call(self, raw: str, message: str) -> bytes:
        if self._call is None:
            return b""
        self._call = None
        if self._stream_arguments:
            return self.error(InternalError(message or "the model produced an invalid tool call; retry"))
        return self._chunk({"content": raw}) if raw else b""

    def finish(self, finish: Finish) -> bytes:
        if self._done:
            return b""
        out = b"" if self._started else self.start()
        if self._call is not None:
            out += self._fail_call("".join(self._call[2]), "the response ended inside a tool call")
            if self._done:
                return out
        error = finish_error(finish)
        if error is not None:
            return out + self.error(error)
        self._done = True
        out += self._chunk({}, finish_reason(finish, self._sent_calls))
        if self._include_usage:
            out += (
                self._envelope + '"choices":[],"usage":' + dumps(usage_json(finish.usage)) + "}\n\n"
            ).encode()
        return out + DONE

    def error(self, error: ApiError) -> bytes:
        """An error frame the SDKs raise on (after HTTP 200 the status cannot change)."""
        if self._done:
            return b""
        self._done = True
        # `[DONE]` after the error chunk: every stream ends with it (clients wait for it to close).
        return ("data: " + dumps(error.openai_body()) + "\n\n").encode() + DONE


def build_chat_completion(
    events: Iterable[OutputEvent] | TurnAccumulator,
    *,
    model: str,
    completion_id: str | None = None,
    created: int | None = None,
    custom_tools: frozenset[str] = frozenset(),
    logprobs: bool = False,
) -> dict[str, Any]:
    """The non-streaming response for a finished turn (`logprobs`: the request asked for the
    answer's log-probabilities). Raises ApiError if generation failed."""
    turn = events if isinstance(events, TurnAccumulator) else TurnAccumulator().feed_all(list(events))
    finish = turn.finish or Finish("stop")
    error = finish_error(finish)
    if error is not None:
        raise error
    reasoning: list[str] = []
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in turn.items:
        if isinstance(item, Reasoning):
            reasoning.append(item.text)
        elif isinstance(item, Text):
            text.append(item.text)
        elif isinstance(item, FailedCall):
            text.append(item.raw)
        elif isinstance(item, ToolCall):
            call = _tool_call_json(len(calls), item.id, item.name, item.arguments, custom_tools)
            del call["index"]
            calls.append(call)
    flat_reasoning = REASONING_SEPARATOR.join(reasoning) or None
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(text) or None,
        "reasoning_content": flat_reasoning,
        "reasoning": flat_reasoning,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    return {
        "id": completion_id or new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": (
                    {"content": [e for lp in turn.text_logprobs for e in tokens_json(lp)], "refusal": None}
                    if logprobs
                    else None
                ),
                "finish_reason": finish_reason(finish, len(calls)),
            }
        ],
        "usage": usage_json(finish.usage),
    }
