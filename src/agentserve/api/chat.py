"""OpenAI Chat Completions codec: `/v1/chat/completions` bodies in, chunks / completion JSON out.

Decoding (`decode_chat`):
- Leading `system`/`developer` messages form `Conversation.system`; later ones stay in place as
  system messages (OpenClaw and pi put context there).
- Assistant `reasoning_content` or `reasoning` (either; vLLM renamed one to the other) becomes a
  Reasoning part before the text and calls. `tool` messages become `role: "tool"` messages naming their
  call; a result for an unknown call id is a 400, as on the real API.
- With a `CallMemory`, an assistant message that still describes a turn we produced (same calls,
  equal arguments, same text, reasoning dropped or unchanged) is replaced by that turn exactly as the
  model wrote it: reasoning segments in their places, argument text byte-exact, our call ids (tool
  messages follow, even when the client rewrote the ids).
- Legacy `functions` / `function_call` / `role: "function"` are mapped onto tools and calls.
- `n` other than 1 is a 400: one choice per request.

Encoding (`ChatStreamEncoder`, `build_chat_completion`):
- First chunk carries the role; reasoning deltas carry both `reasoning_content` and `reasoning`;
  reasoning segments after the first are preceded by a blank line in this flat field.
- A tool call is held until complete and sent as one `tool_calls` delta (index, id, type, name and
  the whole arguments); `stream_tool_arguments=True` streams id/type/name first and then argument
  fragments (index on every fragment). Indexes count the calls actually sent.
- At each ToolCallEnd with `dispatch=True`, a side-channel `event: tool_call_dispatch` frame carries
  `{"choice_index", "tool_call"}` (Dynamo's fields). It is also a valid chunk with `choices: []`,
  because the official SDKs hand every data frame to the caller as a chunk whatever its event name;
  consumers see an empty chunk (like the usage chunk) and move on. `dispatch=False` drops only this
  frame (`--no-enable-streaming-tool-dispatch`); the chunks are the same.
- A failed call is never a tool call: held calls surface their raw text as content; a live call that
  fails ends the stream with an error frame.
- `finish_reason` is `tool_calls` once a call was sent, else `length` / `stop`; with
  `include_usage` a final `choices: []` chunk carries usage (`cached_tokens`, `reasoning_tokens`);
  the stream ends with `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from agentserve.api._check import (
    at,
    expect_dict,
    expect_list,
    missing,
    one_of,
    opt_bool,
    opt_dict,
    opt_int,
    opt_number,
    opt_str,
    req_str,
    wrong_type,
)
from agentserve.api._common import finish_error, parse_data_url
from agentserve.api.errors import ApiError, InternalError, InvalidRequestError
from agentserve.api.ids import new_id
from agentserve.api.memory import CallMemory
from agentserve.api.nvext import parse_nvext
from agentserve.api.options import (
    GenerationOptions,
    ReasoningOptions,
    ResponseFormat,
    ThinkingMode,
    ToolChoice,
)
from agentserve.api.request import DecodedRequest
from agentserve.api.sse import DONE, PING_COMMENT, dumps
from agentserve.api.sse import event as sse_event
from agentserve.api.turn import FailedCall, TurnAccumulator
from agentserve.conversation import (
    Conversation,
    Finish,
    Image,
    Message,
    OutputEvent,
    Part,
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
    Usage,
)

REASONING_SEPARATOR = "\n\n"  # between reasoning segments in the flat reasoning field
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
_KNOWN_FIELDS = frozenset(
    {
        "model", "messages", "tools", "functions", "tool_choice", "function_call", "parallel_tool_calls",
        "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
        "stop", "seed", "presence_penalty", "frequency_penalty", "n", "response_format", "reasoning_effort",
        "chat_template_kwargs", "nvext", "user", "store", "metadata",
    }
)  # fmt: skip


class _Decoder:
    def __init__(self, memory: CallMemory | None, scope: str) -> None:
        self.memory = memory
        self.scope = scope
        self.call_names: dict[str, str] = {}
        self.id_map: dict[str, str] = {}  # client's call id -> ours, for restored turns
        self.legacy_calls: list[tuple[str, str]] = []  # (id, name) of unanswered legacy function calls
        self.ignored: list[str] = []
        self.restored = 0

    def texts(self, content: Any, path: str, *, images: bool) -> tuple[Text | Image, ...]:
        if content is None:
            return ()
        if type(content) is str:
            return (Text(content),) if content else ()
        out: list[Text | Image] = []
        for j, raw in enumerate(expect_list(content, path)):
            ppath = at(path, j)
            part = expect_dict(raw, ppath)
            kind = req_str(part, "type", ppath)
            if kind == "text":
                out.append(Text(req_str(part, "text", ppath)))
            elif kind == "refusal" and not images:
                out.append(Text(req_str(part, "refusal", ppath)))
            elif kind == "image_url" and images:
                image = part.get("image_url")
                ipath = at(ppath, "image_url")
                url = image if type(image) is str else req_str(expect_dict(image, ipath), "url", ipath)
                out.append(parse_data_url(url))
            else:
                raise InvalidRequestError(f"unsupported content part type {kind!r}", param=at(ppath, "type"))
        return tuple(out)

    def tool_call(self, raw: Any, path: str) -> ToolCall:
        call = expect_dict(raw, path)
        kind = call.get("type", "function")
        if kind != "function":
            raise InvalidRequestError(f"unsupported tool call type {kind!r}", param=at(path, "type"))
        call_id = req_str(call, "id", path, nonempty=True)
        fpath = at(path, "function")
        function = expect_dict(call.get("function"), fpath)
        name = req_str(function, "name", fpath, nonempty=True)
        arguments = function.get("arguments")
        if type(arguments) is dict:
            arguments = json.dumps(arguments, ensure_ascii=False)  # lenient: some clients send an object
        elif arguments is None:
            arguments = "{}"
        elif type(arguments) is not str:
            raise wrong_type(at(fpath, "arguments"), "a string", arguments)
        return ToolCall(call_id, name, arguments)

    def assistant(self, m: dict[str, Any], path: str) -> Message:
        reasoning = opt_str(m, "reasoning_content", path)
        if reasoning is None:
            reasoning = opt_str(m, "reasoning", path)
        parts: list[Part] = []
        if reasoning:
            parts.append(Reasoning(reasoning))
        parts += [
            p for p in self.texts(m.get("content"), at(path, "content"), images=False) if isinstance(p, Text)
        ]
        raw_calls = m.get("tool_calls")
        calls: list[ToolCall] = []
        if raw_calls is not None:
            cpath = at(path, "tool_calls")
            for k, raw in enumerate(expect_list(raw_calls, cpath)):
                call = self.tool_call(raw, at(cpath, k))
                if call.id in self.call_names or any(c.id == call.id for c in calls):
                    raise InvalidRequestError(
                        f"duplicate tool call id {call.id!r}", param=at(at(cpath, k), "id")
                    )
                calls.append(call)
        legacy = opt_dict(m, "function_call", path)
        if legacy is not None:
            lpath = at(path, "function_call")
            arguments = legacy.get("arguments", "{}")
            if type(arguments) is not str:
                raise wrong_type(at(lpath, "arguments"), "a string", arguments)
            call = ToolCall(f"call_legacy_{len(self.call_names)}", req_str(legacy, "name", lpath), arguments)
            self.legacy_calls.append((call.id, call.name))
            calls.append(call)
        message = Message("assistant", (*parts, *calls))
        if calls and self.memory is not None:
            turn = self.memory.restore_turn(message, reasoning, REASONING_SEPARATOR, self.scope)
            if turn is not None:
                for sent, mine in zip(calls, turn.tool_calls, strict=True):
                    self.id_map[sent.id] = mine.id
                message = turn
                self.restored += len(calls)
        for call in message.tool_calls:
            self.call_names[call.id] = call.name
        return message

    def tool(self, m: dict[str, Any], path: str) -> Message:
        sent_id = req_str(m, "tool_call_id", path)
        call_id = self.id_map.get(sent_id, sent_id)
        name = self.call_names.get(call_id)
        if name is None:
            raise InvalidRequestError(
                f"tool message answers {sent_id!r}, which no preceding assistant tool_calls contain",
                param=at(path, "tool_call_id"),
            )
        content = self.texts(m.get("content"), at(path, "content"), images=True)
        return Message("tool", (ToolResult(call_id, content, False, name),))

    def function_result(self, m: dict[str, Any], path: str) -> Message:
        name = req_str(m, "name", path)
        for k, (call_id, call_name) in enumerate(self.legacy_calls):
            if call_name == name:
                del self.legacy_calls[k]
                content = self.texts(m.get("content"), at(path, "content"), images=False)
                return Message("tool", (ToolResult(call_id, content, False, name),))
        raise InvalidRequestError(
            f"function message for {name!r} answers no function_call", param=at(path, "name")
        )

    def messages(self, value: Any) -> tuple[tuple[Text, ...], tuple[Message, ...]]:
        if value is None:
            raise missing("messages")
        items = expect_list(value, "messages")
        if not items:
            raise InvalidRequestError("at least one message is required", param="messages")
        system: list[Text] = []
        out: list[Message] = []
        for i, raw in enumerate(items):
            path = at("messages", i)
            m = expect_dict(raw, path)
            role = req_str(m, "role", path)
            if role in ("system", "developer"):
                texts = tuple(
                    p
                    for p in self.texts(m.get("content"), at(path, "content"), images=False)
                    if isinstance(p, Text)
                )
                if out:
                    out.append(Message("system", texts))
                else:
                    system += texts
            elif role == "user":
                content = m.get("content")
                if content is None:
                    raise missing(at(path, "content"))
                out.append(Message("user", self.texts(content, at(path, "content"), images=True)))
            elif role == "assistant":
                out.append(self.assistant(m, path))
            elif role == "tool":
                out.append(self.tool(m, path))
            elif role == "function":
                out.append(self.function_result(m, path))
            else:
                raise InvalidRequestError(
                    f"unknown role {role!r}: expected system, developer, user, assistant or tool",
                    param=at(path, "role"),
                )
        return tuple(system), tuple(out)

    def tools(self, b: dict[str, Any]) -> tuple[ToolSpec, ...]:
        specs: list[ToolSpec] = []
        seen: set[str] = set()

        def add(function: dict[str, Any], path: str) -> None:
            name = req_str(function, "name", path, nonempty=True)
            if name in seen:
                raise InvalidRequestError(f"tool names must be unique: {name!r}", param=at(path, "name"))
            seen.add(name)
            parameters = opt_dict(function, "parameters", path)
            specs.append(ToolSpec(name, opt_str(function, "description", path) or "", parameters or {}))

        tools = b.get("tools")
        if tools is not None:
            for i, raw in enumerate(expect_list(tools, "tools")):
                path = at("tools", i)
                tool = expect_dict(raw, path)
                kind = tool.get("type", "function")
                if kind != "function":
                    self.ignored.append(path)
                    continue
                add(expect_dict(tool.get("function"), at(path, "function")), at(path, "function"))
        functions = b.get("functions")
        if functions is not None:
            for i, raw in enumerate(expect_list(functions, "functions")):
                add(expect_dict(raw, at("functions", i)), at("functions", i))
        return tuple(specs)


def _tool_choice(b: dict[str, Any]) -> ToolChoice:
    value = b.get("tool_choice")
    path = "tool_choice"
    if value is None and b.get("function_call") is not None:
        value, path = b["function_call"], "function_call"
        if type(value) is dict:
            return ToolChoice("named", req_str(value, "name", path, nonempty=True))
    if value is None:
        return ToolChoice()
    if type(value) is str:
        mode = one_of(value, ("auto", "none", "required"), path)
        return ToolChoice(mode)  # type: ignore[arg-type]
    choice = expect_dict(value, path)
    one_of(req_str(choice, "type", path), ("function",), at(path, "type"))
    function = expect_dict(choice.get("function"), at(path, "function"))
    return ToolChoice("named", req_str(function, "name", at(path, "function"), nonempty=True))


def _response_format(b: dict[str, Any]) -> ResponseFormat | None:
    value = opt_dict(b, "response_format", "")
    if value is None:
        return None
    kind = one_of(
        req_str(value, "type", "response_format"),
        ("text", "json_object", "json_schema"),
        "response_format.type",
    )
    if kind == "json_schema":
        spec = expect_dict(value.get("json_schema"), "response_format.json_schema")
        return ResponseFormat(
            "json_schema",
            opt_dict(spec, "schema", "response_format.json_schema"),
            opt_str(spec, "name", "response_format.json_schema"),
            opt_bool(spec, "strict", "response_format.json_schema"),
        )
    return ResponseFormat(kind)  # type: ignore[arg-type]


def _stop(b: dict[str, Any]) -> tuple[str, ...]:
    value = b.get("stop")
    if value is None:
        return ()
    if type(value) is str:
        return (value,)
    items = expect_list(value, "stop")
    for i, item in enumerate(items):
        if type(item) is not str:
            raise wrong_type(at("stop", i), "a string", item)
    return tuple(items)


def decode_chat(body: Any, *, memory: CallMemory | None = None, memory_scope: str = "") -> DecodedRequest:
    """Decode a `POST /v1/chat/completions` body (already parsed JSON). Raises only ApiError."""
    b = expect_dict(body, "body")
    d = _Decoder(memory, memory_scope)
    model = req_str(b, "model", "", nonempty=True)
    n = opt_int(b, "n", "")
    if n is not None and n != 1:
        raise InvalidRequestError("only n=1 is supported: send one request per choice", param="n")
    system, messages = d.messages(b.get("messages"))
    tools = d.tools(b)
    max_tokens = opt_int(b, "max_completion_tokens", "", minimum=0)
    if max_tokens is None:
        max_tokens = opt_int(b, "max_tokens", "", minimum=0)
    stream_options = opt_dict(b, "stream_options", "")
    include_usage = (
        bool(opt_bool(stream_options, "include_usage", "stream_options")) if stream_options else False
    )
    effort = opt_str(b, "reasoning_effort", "")
    if effort is not None:
        one_of(effort, _EFFORTS, "reasoning_effort")
    kwargs = opt_dict(b, "chat_template_kwargs", "") or {}
    mode: ThinkingMode = "default"
    thinking = kwargs.get("enable_thinking", kwargs.get("thinking"))
    if type(thinking) is bool:
        mode = "enabled" if thinking else "disabled"
    top_k = opt_int(b, "top_k", "", minimum=-1)
    seed = opt_int(b, "seed", "")
    nvext = parse_nvext(b.get("nvext"))
    for key in b:
        if key not in _KNOWN_FIELDS and b[key] is not None:
            d.ignored.append(key)
    options = GenerationOptions(
        model=model,
        max_tokens=max_tokens,
        temperature=opt_number(b, "temperature", "", minimum=0.0, maximum=2.0),
        top_p=opt_number(b, "top_p", "", minimum=0.0, maximum=1.0),
        top_k=None if top_k in (None, -1, 0) else top_k,
        stop=_stop(b),
        seed=seed,
        presence_penalty=opt_number(b, "presence_penalty", "", minimum=-2.0, maximum=2.0),
        frequency_penalty=opt_number(b, "frequency_penalty", "", minimum=-2.0, maximum=2.0),
        stream=bool(opt_bool(b, "stream", "")),
        tool_choice=_tool_choice(b),
        parallel_tool_calls=opt_bool(b, "parallel_tool_calls", "") is not False,
        reasoning=ReasoningOptions(mode=mode, effort=effort),
        response_format=_response_format(b),
        include_usage=include_usage,
        template_kwargs=kwargs,
    )
    opt_str(b, "user", "")
    return DecodedRequest(
        api="chat",
        conversation=Conversation(system, messages, tools),
        options=options,
        nvext=nvext,
        ignored=tuple(d.ignored) + nvext.ignored,
        restored=d.restored,
    )


# --------------------------------------------------------------------------------------------------
# Encoding


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


def _tool_call_json(index: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
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
    ) -> None:
        self.model = model
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
        reason = "null" if finish is None else dumps(finish)
        return (
            self._envelope
            + '"choices":[{"index":0,"delta":'
            + dumps(delta)
            + ',"logprobs":null,"finish_reason":'
            + reason
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
        match event:
            case ReasoningDelta(text):
                if not self._in_reasoning:
                    if self._reasoned:
                        text = REASONING_SEPARATOR + text
                    self._in_reasoning = self._reasoned = True
                return out + self._chunk({"reasoning_content": text, "reasoning": text})
            case ReasoningEnd():
                self._in_reasoning = False
                return out
            case TextDelta(text):
                self._in_reasoning = False
                return out + self._chunk({"content": text})
            case ToolCallStart(_, call_id, name):
                self._in_reasoning = False
                self._call = (call_id, name, [])
                if self._stream_arguments:
                    out += self._chunk({"tool_calls": [_tool_call_json(self._sent_calls, call_id, name, "")]})
                return out
            case ToolCallArgsDelta(_, fragment):
                if self._call is not None:
                    self._call[2].append(fragment)
                    if self._stream_arguments and fragment:
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
                "tool_call": _tool_call_json(index, call_id, name, arguments),
            }
            out += sse_event("tool_call_dispatch", payload)
        if not self._stream_arguments:
            out += self._chunk({"tool_calls": [_tool_call_json(index, call_id, name, arguments)]})
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
        return ("data: " + dumps(error.openai_body()) + "\n\n").encode()


def build_chat_completion(
    events: Iterable[OutputEvent] | TurnAccumulator,
    *,
    model: str,
    completion_id: str | None = None,
    created: int | None = None,
) -> dict[str, Any]:
    """The non-streaming response for a finished turn. Raises ApiError if generation failed."""
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
            call = _tool_call_json(len(calls), item.id, item.name, item.arguments)
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
                "logprobs": None,
                "finish_reason": finish_reason(finish, len(calls)),
            }
        ],
        "usage": usage_json(finish.usage),
    }
