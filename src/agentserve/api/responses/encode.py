"""Responses output: OutputEvents into SSE events and the non-streaming Response."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from typing import Any

from agentserve.api._common import finish_error
from agentserve.api.dispatch_gate import DispatchGate
from agentserve.api.errors import ApiError, InternalError
from agentserve.api.ids import is_safe_id, new_id
from agentserve.api.logprobs import tokens_json
from agentserve.api.request import ResponsesRequest, ResponsesTool
from agentserve.api.responses.common import custom_input
from agentserve.api.signing import Signer
from agentserve.api.sse import PING_COMMENT, dumps, quote
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
    TokenProb,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
    Usage,
)

_FAILED_CODES = frozenset({"context_length_exceeded", "rate_limit_exceeded", "insufficient_quota"})


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        # cache_write_tokens: the current SDK requires it; our prefix cache has no paid writes.
        "input_tokens_details": {
            "cached_tokens": min(usage.cached_tokens, usage.input_tokens),
            "cache_write_tokens": 0,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def failed_error_json(error: ApiError) -> dict[str, Any]:
    code = error.code if error.code in _FAILED_CODES else "server_error"
    return {"code": code, "message": error.message}


def _item_id(prefix: str, call_id: str) -> str:
    # Derived from the call id, so the same call always has the same item id: `output_item.added` and
    # `.done` must agree (the SDK rejects a stream where they differ). Ids outside the alphabet
    # (Kimi's `functions.NAME:IDX`) are hashed, not replaced by a fresh random id per event.
    rest = call_id.removeprefix("call_")
    if rest and is_safe_id(rest):
        return prefix + rest
    return prefix + hashlib.sha256(call_id.encode("utf-8")).hexdigest()[:24]


def _arguments(arguments: str | None) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _client_call(kind: str, call_id: str, arguments: str | None) -> dict[str, Any]:
    """A call of OpenAI's client tools in its own item type (openai-python `ResponseOutputItem`):
    `local_shell_call` (`action: exec`), `shell_call` (`action: {commands, …}`), `apply_patch_call`
    (`operation`). The model's arguments are the action's / operation's fields."""
    args = _arguments(arguments)
    status = "completed" if arguments is not None else "in_progress"
    if kind == "local_shell":
        action: dict[str, Any] = {
            "type": "exec",
            "command": args.get("command", []),
            "env": args.get("env", {}),
        }
        for key in ("working_directory", "timeout_ms", "user"):
            if key in args:
                action[key] = args[key]
        return {"type": "local_shell_call", "id": _item_id("lsh_", call_id), "call_id": call_id,
                "action": action, "status": status}  # fmt: skip
    if kind == "shell":
        action = {"commands": args.get("commands", [])}
        for key in ("timeout_ms", "max_output_length"):
            action[key] = args.get(key)
        return {"type": "shell_call", "id": _item_id("sh_", call_id), "call_id": call_id,
                "action": action, "status": status}  # fmt: skip
    operation = {"type": args.get("type", "update_file"), "path": args.get("path", "")}
    if operation["type"] != "delete_file":
        operation["diff"] = args.get("diff", "")
    return {"type": "apply_patch_call", "id": _item_id("apc_", call_id), "call_id": call_id,
            "operation": operation, "status": status}  # fmt: skip


class _Items:
    """Builds output items (shared by the stream encoder and the non-streaming builder)."""

    def __init__(self, request: ResponsesRequest, signer: Signer) -> None:
        self.request = request
        self.signer = signer
        self.summaries = request.options.reasoning.summary not in (None, "none")

    def reasoning(self, item_id: str, text: str | None) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "reasoning", "id": item_id, "summary": [], "content": []}
        if text is not None:
            item["content"] = [{"type": "reasoning_text", "text": text}]
            if self.summaries:
                item["summary"] = [{"type": "summary_text", "text": text}]
            if self.request.wants_encrypted_reasoning:
                item["encrypted_content"] = self.signer.seal_reasoning(text)
        return item

    @staticmethod
    def output_text(text: str, logprobs: Iterable[TokenProb] | None = None) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": tokens_json(logprobs)}

    def message(
        self, item_id: str, text: str | None, logprobs: Iterable[TokenProb] | None = None
    ) -> dict[str, Any]:
        done = text is not None
        return {
            "type": "message",
            "id": item_id,
            "status": "completed" if done else "in_progress",
            "role": "assistant",
            "content": [self.output_text(text, logprobs)] if text is not None else [],
        }

    def call(self, call_id: str, name: str, arguments: str | None) -> dict[str, Any]:
        tool = self.request.tool_kinds.get(name) or ResponsesTool()
        done = arguments is not None
        if tool.kind in ("local_shell", "shell", "apply_patch"):
            return _client_call(tool.kind, call_id, arguments)
        if tool.kind == "custom":
            item: dict[str, Any] = {
                "type": "custom_tool_call",
                "id": _item_id("ctc_", call_id),
                "call_id": call_id,
                "name": name,
                "input": custom_input(arguments) if arguments is not None else "",
            }
        else:
            item = {
                "type": "function_call",
                "id": _item_id("fc_", call_id),
                "call_id": call_id,
                "name": name,
                "arguments": arguments or "",
                "status": "completed" if done else "in_progress",
            }
        if tool.namespace is not None:
            item["namespace"] = tool.namespace
        return item

    def response(
        self, response_id: str, created_at: int, status: str, output: list[dict[str, Any]], **extra: Any
    ) -> dict[str, Any]:
        body = {
            "id": response_id,
            "object": "response",
            "created_at": created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": self.request.options.model,
            "output": output,
            "usage": None,
        }
        body.update(self.request.echo)
        body.update(extra)
        return body


class ResponsesStreamEncoder:
    """OutputEvents in, Responses SSE bytes out: `start`, `feed`…, `finish` (or `fail`)."""

    def __init__(
        self,
        request: ResponsesRequest,
        *,
        signer: Signer,
        response_id: str | None = None,
        created_at: int | None = None,
        stream_tool_arguments: bool = False,
        dispatch: bool = True,
    ) -> None:
        self.response_id = response_id or new_id("resp_")
        # Streaming tool dispatch off: everything from the first finished call on waits for the end.
        self._gate = None if dispatch else DispatchGate()
        self.created_at = int(time.time()) if created_at is None else created_at
        self._items = _Items(request, signer)
        self._stream_arguments = stream_tool_arguments
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # finished items, in output order
        self._open: str | None = None  # "reasoning" | "message" | "call" (live)
        self._open_id = ""
        self._text: list[str] = []
        self._logprobs: list[TokenProb] = []  # the open message's answer tokens
        self._call: tuple[str, str, list[str]] | None = None
        self._dispatched = 0
        self._started = False
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    @property
    def output(self) -> list[dict[str, Any]]:
        return self._output

    def _event(self, kind: str, payload: dict[str, Any]) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **payload}
        self._seq += 1
        return sse_event(kind, payload)

    def _delta(self, kind: str, index_field: str, text: str, tail: str = "") -> bytes:
        """A delta event rendered by hand: this is the per-token path."""
        frame = (
            f'event: {kind}\ndata: {{"type":"{kind}","sequence_number":{self._seq},'
            f'"item_id":"{self._open_id}","output_index":{self._index}{index_field},'
            f'"delta":{quote(text)}{tail}}}\n\n'
        )
        self._seq += 1
        return frame.encode()

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        return self._items.response(self.response_id, self.created_at, status, self._output, **extra)

    def start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        skeleton = self._items.response(self.response_id, self.created_at, "in_progress", [])
        return self._event("response.created", {"response": skeleton}) + self._event(
            "response.in_progress", {"response": skeleton}
        )

    @staticmethod
    def ping() -> bytes:
        """An SSE comment: keeps proxies and idle timers awake, ignored by clients."""
        return PING_COMMENT

    @property
    def _index(self) -> int:
        return len(self._output)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._open_id, "output_index": self._index}

    # -- items ------------------------------------------------------------------------------------

    def _open_reasoning(self) -> bytes:
        self._open, self._open_id, self._text = "reasoning", new_id("rs_"), []
        out = self._event(
            "response.output_item.added",
            {"output_index": self._index, "item": self._items.reasoning(self._open_id, None)},
        )
        out += self._event(
            "response.content_part.added",
            {**self._where(), "content_index": 0, "part": {"type": "reasoning_text", "text": ""}},
        )
        if self._items.summaries:
            out += self._event(
                "response.reasoning_summary_part.added",
                {**self._where(), "summary_index": 0, "part": {"type": "summary_text", "text": ""}},
            )
        return out

    def _open_message(self) -> bytes:
        self._open, self._open_id, self._text = "message", new_id("msg_"), []
        self._logprobs = []
        out = self._event(
            "response.output_item.added",
            {"output_index": self._index, "item": self._items.message(self._open_id, None)},
        )
        return out + self._event(
            "response.content_part.added",
            {**self._where(), "content_index": 0, "part": self._items.output_text("")},
        )

    def _close(self) -> bytes:
        kind, self._open = self._open, None
        if kind is None or kind == "call":
            return b""
        text = "".join(self._text)
        where = {"item_id": self._open_id, "output_index": self._index}
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            out = self._event("response.reasoning_text.done", {**where, "content_index": 0, "text": text})
            out += self._event("response.content_part.done", {**where, "content_index": 0, "part": part})
            if self._items.summaries:
                summary = {"type": "summary_text", "text": text}
                out += self._event(
                    "response.reasoning_summary_text.done", {**where, "summary_index": 0, "text": text}
                )
                out += self._event(
                    "response.reasoning_summary_part.done", {**where, "summary_index": 0, "part": summary}
                )
            item = self._items.reasoning(self._open_id, text)
        else:
            lps = self._logprobs
            out = self._event(
                "response.output_text.done",
                {**where, "content_index": 0, "text": text, "logprobs": tokens_json(lps)},
            )
            out += self._event(
                "response.content_part.done",
                {**where, "content_index": 0, "part": self._items.output_text(text, lps)},
            )
            item = self._items.message(self._open_id, text, lps)
        out += self._event("response.output_item.done", {"output_index": self._index, "item": item})
        self._output.append(item)
        return out

    def _message(self, text: str) -> bytes:
        out = self._open_message()
        out += self._event(
            "response.output_text.delta", {**self._where(), "content_index": 0, "delta": text, "logprobs": []}
        )
        self._text.append(text)
        return out + self._close()

    def _call_events(self, call_id: str, name: str, arguments: str | None) -> bytes:
        """A call item from `added`: whole (held call, arguments in one delta) or, if None, just opened."""
        item = self._items.call(call_id, name, None)
        self._open_id = item["id"]
        out = self._event("response.output_item.added", {"output_index": self._index, "item": item})
        if arguments is None:
            return out
        if item["type"] == "function_call" and arguments:
            out += self._delta("response.function_call_arguments.delta", "", arguments)
        return out + self._finish_call(call_id, name, arguments)

    def _finish_call(self, call_id: str, name: str, arguments: str) -> bytes:
        item = self._items.call(call_id, name, arguments)
        where = {"item_id": item["id"], "output_index": self._index}
        if item["type"] == "custom_tool_call":
            out = self._event("response.custom_tool_call_input.delta", {**where, "delta": item["input"]})
            out += self._event("response.custom_tool_call_input.done", {**where, "input": item["input"]})
        elif item["type"] != "function_call":
            out = b""  # a client tool's item (local_shell_call, …) comes whole in output_item.done
        else:
            out = self._event(
                "response.function_call_arguments.done", {**where, "name": name, "arguments": arguments}
            )
        out += self._event(
            "response.output_item.done", {"output_index": self._index, "item": item}
        )  # dispatch
        self._output.append(item)
        self._dispatched += 1
        return out

    def _live(self, name: str) -> bool:
        kind = (self._items.request.tool_kinds.get(name) or ResponsesTool()).kind
        return self._stream_arguments and kind == "function"

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
            case TextDelta(text, logprobs):
                if self._open != "message":
                    out += self._close() + self._open_message()
                self._text.append(text)
                if logprobs is None:
                    return out + self._delta(
                        "response.output_text.delta", ',"content_index":0', text, ',"logprobs":[]'
                    )
                self._logprobs += logprobs
                lps = ',"logprobs":' + dumps(tokens_json(logprobs))
                return out + self._delta("response.output_text.delta", ',"content_index":0', text, lps)
            case ReasoningDelta(text):
                if self._open != "reasoning":
                    out += self._close() + self._open_reasoning()
                self._text.append(text)
                out += self._delta("response.reasoning_text.delta", ',"content_index":0', text)
                if self._items.summaries:
                    out += self._delta("response.reasoning_summary_text.delta", ',"summary_index":0', text)
                return out
            case ReasoningEnd():
                return out + (self._close() if self._open == "reasoning" else b"")
            case ToolCallStart(_, call_id, name):
                out += self._close()
                self._call = (call_id, name, [])
                if self._live(name):
                    self._open = "call"
                    out += self._call_events(call_id, name, None)
                return out
            case ToolCallArgsDelta(_, fragment):
                if self._call is not None:
                    self._call[2].append(fragment)
                    if self._open == "call" and fragment:
                        out += self._delta("response.function_call_arguments.delta", "", fragment)
                return out
            case ToolCallEnd(_, arguments):
                if self._call is None:
                    return out
                call_id, name, _ = self._call
                self._call = None
                if self._open == "call":
                    self._open = None
                    return out + self._finish_call(call_id, name, arguments)
                return out + self._call_events(call_id, name, arguments)
            case ToolCallError(_, _, raw, message):
                return out + self._fail_call(raw, message)
            case Finish():
                return out + self._finish(event)
        return out

    def _fail_call(self, raw: str, message: str) -> bytes:
        if self._call is None:
            return b""
        self._call = None
        if self._open == "call":
            self._open = None
            return self._failed(InternalError(message or "the model produced an invalid tool call; retry"))
        return self._message(raw) if raw else b""

    def finish(self, finish: Finish) -> bytes:
        """Close what is open, then `response.completed` (or `.incomplete` / `.failed`)."""
        if self._done:
            return b""
        held = b"" if self._gate is None else self._gate.release()
        return held + self._finish(finish)

    def _finish(self, finish: Finish) -> bytes:
        out = b"" if self._started else self.start()
        if self._call is not None:
            out += self._fail_call("".join(self._call[2]), "the response ended inside a tool call")
            if self._done:
                return out
        out += self._close()
        error = finish_error(finish)
        if error is not None:
            return out + self._failed(error)
        self._done = True
        usage = usage_json(finish.usage)
        if finish.reason == "length" and not self._dispatched:
            response = self._response(
                "incomplete", usage=usage, incomplete_details={"reason": "max_output_tokens"}
            )
            return out + self._event("response.incomplete", {"response": response})
        return out + self._event("response.completed", {"response": self._response("completed", usage=usage)})

    def fail(self, error: ApiError) -> bytes:
        """`response.failed` (after `response.created` if nothing was sent yet)."""
        if self._done:
            return b""
        held = b"" if self._gate is None else self._gate.release()
        return held + self._failed(error)

    def _failed(self, error: ApiError) -> bytes:
        out = b"" if self._started else self.start()
        self._done = True
        response = self._response("failed", error=failed_error_json(error))
        return out + self._event("response.failed", {"response": response})


def build_response(
    events: Iterable[OutputEvent] | TurnAccumulator,
    request: ResponsesRequest,
    *,
    signer: Signer,
    response_id: str | None = None,
    created_at: int | None = None,
) -> dict[str, Any]:
    """The non-streaming Response for a finished turn. Raises ApiError if generation failed."""
    turn = events if isinstance(events, TurnAccumulator) else TurnAccumulator().feed_all(list(events))
    finish = turn.finish or Finish("stop")
    error = finish_error(finish)
    if error is not None:
        raise error
    items = _Items(request, signer)
    output: list[dict[str, Any]] = []
    dispatched = 0
    texts = iter(turn.text_logprobs)  # one per Text item, in order
    for item in turn.items:
        if isinstance(item, Reasoning):
            output.append(items.reasoning(new_id("rs_"), item.text))
        elif isinstance(item, Text):
            output.append(items.message(new_id("msg_"), item.text, next(texts, None)))
        elif isinstance(item, FailedCall):
            if item.raw:
                output.append(items.message(new_id("msg_"), item.raw))
        elif isinstance(item, ToolCall):
            dispatched += 1
            output.append(items.call(item.id, item.name, item.arguments))
    rid = response_id or new_id("resp_")
    created = int(time.time()) if created_at is None else created_at
    usage = usage_json(finish.usage)
    if finish.reason == "length" and not dispatched:
        return items.response(
            rid,
            created,
            "incomplete",
            output,
            usage=usage,
            incomplete_details={"reason": "max_output_tokens"},
        )
    return items.response(rid, created, "completed", output, usage=usage)
