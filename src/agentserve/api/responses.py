"""OpenAI Responses API codec (Codex): `/v1/responses` bodies in, SSE events / Response JSON out.

Decoding (`decode_responses`):
- `instructions`, then the leading `system`/`developer` input messages, form `Conversation.system`;
  later ones stay in place as system messages.
- Consecutive assistant-side items (reasoning, assistant message, function_call, custom_tool_call)
  are one assistant turn, in their order: reasoning_0 → call_0 → reasoning_1 → call_1 round-trips.
- A reasoning item's text is, in order of trust: our own sealed `encrypted_content` (exact text,
  even if the client dropped `content`), its `reasoning_text` content, else nothing (a summary of
  someone else's reasoning is not the model's reasoning).
- `function_call_output` / `custom_tool_call_output` become `role: "tool"` messages naming their call
  (string or input_text/input_image array output); an output for an unknown call is a 400.
- `custom` (freeform) tools are offered to the model as functions taking `{"input": string}`;
  `namespace` tools are flattened (the namespace is echoed on output items); hosted tools
  (web_search, local_shell, mcp…) and `item_reference`-free server items are accepted and ignored.
- `previous_response_id` prepends the stored history (`ResponseStore`); unknown, or no store, is a
  400 `previous_response_not_found`. `store: false` needs nothing from us: clients send everything.

Encoding (`ResponsesStreamEncoder`, `build_response`): every event Codex reads, each with
`sequence_number`; items are `rs_…` reasoning (raw text as `reasoning_text` content, mirrored into
summary parts when the request asked for a summary, sealed into `encrypted_content` when `include`
asks for it), `msg_…` messages, `fc_…` function calls with our `call_…` ids (`ctc_…` custom calls).
A function call is sent whole at its ToolCallEnd (added, arguments delta/done, `output_item.done`:
the dispatch point); `stream_tool_arguments=True` streams the arguments live instead, and
`dispatch=False` holds everything from the first completed call until the end of the turn. A failed call
becomes a message with its raw text, or (live) `response.failed`. Length with no call dispatched is
`response.incomplete` (max_output_tokens); errors are `response.failed` with a code Codex knows
(`context_length_exceeded`, `rate_limit_exceeded`, else `server_error`).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
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
    str_list,
    wrong_type,
)
from agentserve.api._common import finish_error, parse_data_url
from agentserve.api.errors import ApiError, InternalError, InvalidRequestError
from agentserve.api.identity import BodyIdentity
from agentserve.api.ids import is_safe_id, new_id
from agentserve.api.nvext import is_valid_id, parse_nvext
from agentserve.api.options import GenerationOptions, ReasoningOptions, ResponseFormat, ToolChoice
from agentserve.api.request import ResponsesRequest, ResponsesTool
from agentserve.api.signing import Signer
from agentserve.api.sse import PING_COMMENT, dumps
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

_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_SUMMARIES = ("auto", "concise", "detailed", "none")
_VERBOSITY = ("low", "medium", "high")
_KNOWN_FIELDS = frozenset(
    {
        "model", "instructions", "input", "tools", "tool_choice", "parallel_tool_calls", "reasoning", "text",
        "include", "store", "previous_response_id", "prompt_cache_key", "stream", "stream_options",
        "max_output_tokens", "temperature", "top_p", "truncation", "metadata", "user", "service_tier",
        "client_metadata", "safety_identifier", "prompt_cache_retention", "nvext", "max_tool_calls",
    }
)  # fmt: skip
# Items produced by hosted tools on OpenAI's side: nothing our model can replay.
_HOSTED_ITEMS = frozenset(
    {
        "web_search_call", "file_search_call", "computer_call", "computer_call_output",
        "code_interpreter_call", "image_generation_call", "local_shell_call", "local_shell_call_output",
        "mcp_call", "mcp_list_tools",
        "mcp_approval_request", "mcp_approval_response", "shell_call", "shell_call_output",
        "apply_patch_call", "apply_patch_call_output", "compaction", "tool_search_call", "tool_search_output",
    }
)  # fmt: skip
_FAILED_CODES = frozenset({"context_length_exceeded", "rate_limit_exceeded", "insufficient_quota"})
CUSTOM_INPUT = "input"  # the one argument of a freeform tool offered as a function


def custom_tool_parameters(description: str = "") -> dict[str, Any]:
    prop: dict[str, Any] = {"type": "string"}
    if description:
        prop["description"] = description
    return {"type": "object", "properties": {CUSTOM_INPUT: prop}, "required": [CUSTOM_INPUT]}


def custom_input(arguments: str) -> str:
    """The freeform input inside a custom call's arguments (the raw text if they are not that shape)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_INPUT), str):
        return value[CUSTOM_INPUT]  # type: ignore[no-any-return]
    return arguments


class ResponseStore:
    """Bounded memory of stored responses (`store: true`) for `previous_response_id`."""

    __slots__ = ("_items", "_max")

    def __init__(self, max_responses: int = 1024) -> None:
        self._max = max_responses
        self._items: OrderedDict[str, tuple[Message, ...]] = OrderedDict()

    def put(self, response_id: str, history: tuple[Message, ...]) -> None:
        self._items[response_id] = history
        self._items.move_to_end(response_id)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[Message, ...] | None:
        history = self._items.get(response_id)
        if history is not None:
            self._items.move_to_end(response_id)
        return history

    def remember(self, request: ResponsesRequest, response_id: str, turn: Message) -> None:
        """After a completed response: its whole history (input + output) under its id, if stored."""
        if request.store:
            self.put(response_id, (*request.conversation.messages, turn))


# --------------------------------------------------------------------------------------------------
# Decoding


class _Decoder:
    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self.call_names: dict[str, str] = {}
        self.ignored: list[str] = []
        self.system: list[Text] = []
        self.messages: list[Message] = []
        self.turn: list[Part] | None = None  # the assistant turn being collected
        self.tools: list[ToolSpec] = []
        self.tool_kinds: dict[str, ResponsesTool] = {}

    def flush(self) -> None:
        if self.turn is not None:
            self.messages.append(Message("assistant", tuple(self.turn)))
            self.turn = None

    def assistant_part(self, part: Part) -> None:
        if self.turn is None:
            self.turn = []
        self.turn.append(part)

    def content(self, value: Any, path: str, *, role: str) -> tuple[Text | Image, ...]:
        if type(value) is str:
            return (Text(value),) if value else ()
        out: list[Text | Image] = []
        for j, raw in enumerate(expect_list(value, path)):
            ppath = at(path, j)
            part = expect_dict(raw, ppath)
            kind = req_str(part, "type", ppath)
            if kind in ("input_text", "output_text", "text"):
                out.append(Text(req_str(part, "text", ppath)))
            elif kind == "refusal":
                out.append(Text(req_str(part, "refusal", ppath)))
            elif kind == "input_image" and role != "assistant":
                url = opt_str(part, "image_url", ppath)
                if url is None:
                    raise InvalidRequestError("only image_url images are supported (no file_id)", param=ppath)
                out.append(parse_data_url(url))
            else:
                raise InvalidRequestError(f"unsupported content type {kind!r}", param=at(ppath, "type"))
        return tuple(out)

    def message(self, item: dict[str, Any], path: str) -> None:
        role = req_str(item, "role", path)
        one_of(role, ("user", "assistant", "system", "developer"), at(path, "role"))
        content = item.get("content")
        if content is None:
            raise missing(at(path, "content"))
        parts = self.content(content, at(path, "content"), role=role)
        if role == "assistant":
            for part in parts:
                self.assistant_part(part)
            return
        self.flush()
        if role == "user":
            self.messages.append(Message("user", parts))
            return
        texts = tuple(p for p in parts if isinstance(p, Text))
        if self.messages:
            self.messages.append(Message("system", texts))
        else:
            self.system += texts

    def reasoning(self, item: dict[str, Any], path: str) -> None:
        texts = []
        content = item.get("content")
        if content is not None:
            cpath = at(path, "content")
            for j, raw in enumerate(expect_list(content, cpath)):
                texts.append(req_str(expect_dict(raw, at(cpath, j)), "text", at(cpath, j)))
        summary = item.get("summary")
        if summary is not None:
            expect_list(summary, at(path, "summary"))
        sealed = opt_str(item, "encrypted_content", path)
        text = self.signer.unseal_reasoning(sealed) if sealed else None
        if text is None:
            text = "".join(texts)
        if text:
            self.assistant_part(Reasoning(text))

    def call(self, item: dict[str, Any], path: str, *, custom: bool) -> None:
        call_id = req_str(item, "call_id", path, nonempty=True)
        if call_id in self.call_names:
            raise InvalidRequestError(f"duplicate call_id {call_id!r}", param=at(path, "call_id"))
        name = req_str(item, "name", path, nonempty=True)
        if custom:
            arguments = json.dumps({CUSTOM_INPUT: req_str(item, "input", path)}, ensure_ascii=False)
        else:
            arguments = req_str(item, "arguments", path)
        self.call_names[call_id] = name
        self.assistant_part(ToolCall(call_id, name, arguments))

    def output(self, item: dict[str, Any], path: str) -> None:
        self.flush()
        call_id = req_str(item, "call_id", path)
        name = self.call_names.get(call_id)
        if name is None:
            raise InvalidRequestError(
                f"no tool call found for output with call_id {call_id!r}", param=at(path, "call_id")
            )
        value = item.get("output")
        if value is None:
            raise missing(at(path, "output"))
        content = self.content(value, at(path, "output"), role="tool")
        self.messages.append(Message("tool", (ToolResult(call_id, content, False, name),)))

    def items(self, value: Any) -> None:
        if type(value) is str:
            self.messages.append(Message("user", (Text(value),)))
            return
        for i, raw in enumerate(expect_list(value, "input")):
            path = at("input", i)
            item = expect_dict(raw, path)
            kind = item.get("type", "message")
            if type(kind) is not str:
                raise wrong_type(at(path, "type"), "a string", kind)
            if kind == "message":
                self.message(item, path)
            elif kind == "reasoning":
                self.reasoning(item, path)
            elif kind == "function_call":
                self.call(item, path, custom=False)
            elif kind == "custom_tool_call":
                self.call(item, path, custom=True)
            elif kind in ("function_call_output", "custom_tool_call_output"):
                self.output(item, path)
            elif kind == "additional_tools":
                self.add_tools(item.get("tools"), at(path, "tools"))
            elif kind in _HOSTED_ITEMS:
                self.ignored.append(path)
            elif kind == "item_reference":
                raise InvalidRequestError("item_reference is not supported: send the items", param=path)
            else:
                raise InvalidRequestError(f"unsupported input item type {kind!r}", param=at(path, "type"))
        self.flush()

    def add_tools(self, value: Any, path: str, namespace: str | None = None) -> None:
        if value is None:
            return
        for i, raw in enumerate(expect_list(value, path)):
            tpath = at(path, i)
            tool = expect_dict(raw, tpath)
            kind = req_str(tool, "type", tpath)
            if kind == "namespace" and namespace is None:
                self.add_tools(
                    tool.get("tools"), at(tpath, "tools"), req_str(tool, "name", tpath, nonempty=True)
                )
                continue
            if kind not in ("function", "custom"):
                self.ignored.append(tpath)  # hosted tools run on OpenAI's side, not here
                continue
            name = req_str(tool, "name", tpath, nonempty=True)
            if name in self.tool_kinds:
                raise InvalidRequestError(f"tool names must be unique: {name!r}", param=at(tpath, "name"))
            description = opt_str(tool, "description", tpath) or ""
            if kind == "function":
                parameters = opt_dict(tool, "parameters", tpath) or {"type": "object", "properties": {}}
            else:
                opt_dict(tool, "format", tpath)
                parameters = custom_tool_parameters()
            self.tools.append(ToolSpec(name, description, parameters))
            self.tool_kinds[name] = ResponsesTool(kind, namespace)  # type: ignore[arg-type]


def _tool_choice(value: Any) -> ToolChoice:
    if value is None:
        return ToolChoice()
    if type(value) is str:
        return ToolChoice(one_of(value, ("auto", "none", "required"), "tool_choice"))  # type: ignore[arg-type]
    choice = expect_dict(value, "tool_choice")
    kind = req_str(choice, "type", "tool_choice")
    if kind in ("function", "custom"):
        return ToolChoice("named", req_str(choice, "name", "tool_choice", nonempty=True))
    if kind == "allowed_tools":
        mode = opt_str(choice, "mode", "tool_choice") or "auto"
        return ToolChoice(one_of(mode, ("auto", "required"), "tool_choice.mode"))  # type: ignore[arg-type]
    return ToolChoice()  # a hosted tool: nothing we can force


def _text(value: Any) -> tuple[str | None, ResponseFormat | None]:
    if value is None:
        return None, None
    text = expect_dict(value, "text")
    verbosity = opt_str(text, "verbosity", "text")
    if verbosity is not None:
        one_of(verbosity, _VERBOSITY, "text.verbosity")
    fmt = None
    raw = opt_dict(text, "format", "text")
    if raw is not None:
        kind = one_of(
            req_str(raw, "type", "text.format"), ("text", "json_object", "json_schema"), "text.format.type"
        )
        if kind == "json_schema":
            fmt = ResponseFormat(
                "json_schema",
                opt_dict(raw, "schema", "text.format"),
                opt_str(raw, "name", "text.format"),
                opt_bool(raw, "strict", "text.format"),
            )
        elif kind == "json_object":
            fmt = ResponseFormat("json_object")
    return verbosity, fmt


def decode_responses(body: Any, *, signer: Signer, store: ResponseStore | None = None) -> ResponsesRequest:
    """Decode a `POST /v1/responses` body (already parsed JSON). Raises only ApiError."""
    b = expect_dict(body, "body")
    d = _Decoder(signer)
    model = req_str(b, "model", "", nonempty=True)
    instructions = opt_str(b, "instructions", "")
    if instructions:
        d.system.append(Text(instructions))
    previous = opt_str(b, "previous_response_id", "")
    if previous is not None:
        history = store.get(previous) if store is not None else None
        if history is None:
            raise InvalidRequestError(
                f"Previous response with id {previous!r} not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        d.messages += history
        for message in history:
            for call in message.tool_calls:
                d.call_names[call.id] = call.name
    value = b.get("input")
    if value is None and previous is None:
        raise missing("input")
    if value is not None:
        if type(value) is not str and type(value) is not list:
            raise wrong_type("input", "a string or an array of input items", value)
        d.items(value)
    d.add_tools(b.get("tools"), "tools")

    reasoning = opt_dict(b, "reasoning", "") or {}
    effort = opt_str(reasoning, "effort", "reasoning")
    if effort is not None:
        one_of(effort, _EFFORTS, "reasoning.effort")
    summary = opt_str(reasoning, "summary", "reasoning") or opt_str(
        reasoning, "generate_summary", "reasoning"
    )
    if summary is not None:
        one_of(summary, _SUMMARIES, "reasoning.summary")
    verbosity, fmt = _text(b.get("text"))
    include = str_list(b["include"], "include") if b.get("include") is not None else ()
    cache_key = opt_str(b, "prompt_cache_key", "")
    if cache_key is not None and len(cache_key) > 1024:
        raise InvalidRequestError("must be at most 1024 characters", param="prompt_cache_key")
    store_flag = opt_bool(b, "store", "")
    parallel = opt_bool(b, "parallel_tool_calls", "")
    truncation = opt_str(b, "truncation", "")
    if truncation is not None:
        one_of(truncation, ("auto", "disabled"), "truncation")
    metadata = opt_dict(b, "metadata", "")
    nvext = parse_nvext(b.get("nvext"))
    if b.get("background"):
        raise InvalidRequestError("background responses are not supported", param="background")
    for key in ("conversation", "prompt"):
        if b.get(key) is not None:
            raise InvalidRequestError(f"{key} is not supported", param=key)
    for key in b:
        if key not in _KNOWN_FIELDS and key != "background" and b[key] is not None:
            d.ignored.append(key)

    tool_choice = _tool_choice(b.get("tool_choice"))
    options = GenerationOptions(
        model=model,
        max_tokens=opt_int(b, "max_output_tokens", "", minimum=1),
        temperature=opt_number(b, "temperature", "", minimum=0.0, maximum=2.0),
        top_p=opt_number(b, "top_p", "", minimum=0.0, maximum=1.0),
        stream=bool(opt_bool(b, "stream", "")),
        tool_choice=tool_choice,
        parallel_tool_calls=parallel is not False,
        reasoning=ReasoningOptions(effort=effort, summary=summary),
        response_format=fmt,
        verbosity=verbosity,
    )
    text_echo: dict[str, Any] = {"format": {"type": "text"}, "verbosity": verbosity or "medium"}
    if fmt is not None:
        text_echo["format"] = b["text"]["format"]
    echo: dict[str, Any] = {
        "instructions": instructions,
        "max_output_tokens": options.max_tokens,
        "parallel_tool_calls": options.parallel_tool_calls,
        "previous_response_id": previous,
        "reasoning": {"effort": effort, "summary": summary},
        "store": store_flag is not False,
        "temperature": options.temperature,
        "text": text_echo,
        "tool_choice": b.get("tool_choice") if b.get("tool_choice") is not None else "auto",
        "tools": b.get("tools") or [],
        "top_p": options.top_p,
        "truncation": truncation or "disabled",
        "metadata": metadata or {},
        "user": opt_str(b, "user", ""),
        "prompt_cache_key": cache_key,
    }
    session = cache_key if cache_key is not None and is_valid_id(cache_key) else None
    return ResponsesRequest(
        api="responses",
        conversation=Conversation(tuple(d.system), tuple(d.messages), tuple(d.tools)),
        options=options,
        identity=BodyIdentity(session, "prompt_cache_key" if session else None),
        nvext=nvext,
        ignored=tuple(d.ignored) + nvext.ignored,
        store=store_flag is not False,
        previous_response_id=previous,
        include=include,
        prompt_cache_key=cache_key,
        instructions=instructions,
        tool_kinds=d.tool_kinds,
        echo=echo,
    )


# --------------------------------------------------------------------------------------------------
# Encoding


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
    # Derived from the call id, so the same call always has the same item id.
    rest = call_id.removeprefix("call_")
    return prefix + rest if rest and is_safe_id(rest) else new_id(prefix)


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
    def output_text(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def message(self, item_id: str, text: str | None) -> dict[str, Any]:
        done = text is not None
        return {
            "type": "message",
            "id": item_id,
            "status": "completed" if done else "in_progress",
            "role": "assistant",
            "content": [self.output_text(text)] if text is not None else [],
        }

    def call(self, call_id: str, name: str, arguments: str | None) -> dict[str, Any]:
        tool = self.request.tool_kinds.get(name) or ResponsesTool()
        done = arguments is not None
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
        self._dispatch = dispatch
        self._held: list[bytes] = []
        self.created_at = int(time.time()) if created_at is None else created_at
        self._items = _Items(request, signer)
        self._stream_arguments = stream_tool_arguments
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # finished items, in output order
        self._open: str | None = None  # "reasoning" | "message" | "call" (live)
        self._open_id = ""
        self._text: list[str] = []
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
            f'"delta":{dumps(text)}{tail}}}\n\n'
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
        out = self._event(
            "response.output_item.added",
            {"output_index": self._index, "item": self._items.message(self._open_id, None)},
        )
        return out + self._event(
            "response.content_part.added",
            {**self._where(), "content_index": 0, "part": {**self._items.output_text(""), "logprobs": []}},
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
            out = self._event(
                "response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": []}
            )
            out += self._event(
                "response.content_part.done",
                {**where, "content_index": 0, "part": self._items.output_text(text)},
            )
            item = self._items.message(self._open_id, text)
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

    def _call_events(self, call_id: str, name: str, fragments: list[str], arguments: str | None) -> bytes:
        """Events of a call item from `added` (when arguments is None: stop after the deltas)."""
        item = self._items.call(call_id, name, None)
        self._open_id = item["id"]
        out = self._event("response.output_item.added", {"output_index": self._index, "item": item})
        if item["type"] == "function_call":
            for fragment in fragments:
                if fragment:
                    out += self._event(
                        "response.function_call_arguments.delta", {**self._where(), "delta": fragment}
                    )
        return out if arguments is None else out + self._finish_call(call_id, name, arguments)

    def _finish_call(self, call_id: str, name: str, arguments: str) -> bytes:
        item = self._items.call(call_id, name, arguments)
        where = {"item_id": item["id"], "output_index": self._index}
        if item["type"] == "custom_tool_call":
            out = self._event("response.custom_tool_call_input.delta", {**where, "delta": item["input"]})
            out += self._event("response.custom_tool_call_input.done", {**where, "input": item["input"]})
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
        if self._dispatch or not self._dispatched or self._done:
            if self._held:
                out, self._held = b"".join(self._held) + out, []
            return out
        self._held.append(out)
        return b""

    def _feed(self, event: OutputEvent) -> bytes:
        out = b"" if self._started else self.start()
        match event:
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
            case TextDelta(text):
                if self._open != "message":
                    out += self._close() + self._open_message()
                self._text.append(text)
                return out + self._delta(
                    "response.output_text.delta", ',"content_index":0', text, ',"logprobs":[]'
                )
            case ToolCallStart(_, call_id, name):
                out += self._close()
                self._call = (call_id, name, [])
                if self._live(name):
                    self._open = "call"
                    out += self._call_events(call_id, name, [], None)
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
                call_id, name, fragments = self._call
                self._call = None
                if self._open == "call":
                    self._open = None
                    return out + self._finish_call(call_id, name, arguments)
                if "".join(fragments) != arguments:
                    fragments = [arguments]
                return out + self._call_events(call_id, name, fragments, arguments)
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
        held, self._held = b"".join(self._held), []
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
        held, self._held = b"".join(self._held), []
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
    for item in turn.items:
        if isinstance(item, Reasoning):
            output.append(items.reasoning(new_id("rs_"), item.text))
        elif isinstance(item, Text):
            output.append(items.message(new_id("msg_"), item.text))
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
