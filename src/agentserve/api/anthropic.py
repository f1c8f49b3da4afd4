"""Anthropic Messages API codec: `/v1/messages` bodies in, SSE frames / message JSON out.

Decoding (`decode_messages`, `decode_count_tokens`) maps the body onto Conversation + options:
- `system` (string or text blocks) becomes `Conversation.system`; `role: "system"` entries inside
  `messages` (Claude Code's mid-conversation system beta) stay where they are as system messages.
- Consecutive user (or assistant) messages are one turn, as on the real API.
- `tool_result` blocks become `role: "tool"` messages in place (the canonical form every API shares),
  each naming its call; a result for a call that never appeared is a 400, like the real API.
- `thinking` blocks become Reasoning(text, signature) in order; `redacted_thinking` cannot be read and
  is dropped. `tool_use.input` becomes arguments text: the model's exact text when the call memory
  still has it, else `json.dumps` with the usual separators (what models write).
- Tool ids map back through `ids.canonical_call_id` (we hand out `toolu_…` for `call_…`).
- `cache_control` is accepted anywhere and ignored (our prefix cache needs no breakpoints);
  server tools, server-tool blocks and unknown top-level fields are accepted and listed in `ignored`.

Encoding: `AnthropicStreamEncoder` (sans-IO, fed OutputEvents, returns SSE bytes) and
`build_message` (non-streaming JSON). Decisions:
- Each reasoning segment is its own `thinking` block, closed by a `signature_delta` carrying an HMAC
  of its text (`signing.Signer`), so N segments stay N blocks and we recognise them when they return.
  With `thinking.display: "omitted"` (`omit_thinking=True`) the block carries no text and the
  signature seals it instead, as the real API does; the decoder (given the signer) restores it.
  Thinking blocks are emitted whenever the model reasons, even if the request did not ask for
  thinking: dropping them would lose them from the next prompt (ask the template not to think).
- A `tool_use` block is held until its call completes, then sent whole (start, its
  `input_json_delta` fragments, stop): the `content_block_stop` is the dispatch point and Claude Code
  never sees a call that will not be dispatched. With `stream_tool_input=True` the fragments stream
  live instead; a call that then fails ends the stream with an `error` event, so the client retries
  rather than running half a call.
- A call that fails (ToolCallError, or cut off by max_tokens) is never a `tool_use`: its raw text
  becomes a text block, so nothing the model wrote is lost.
- With `dispatch=False` (streaming tool dispatch turned off) everything from the first completed
  call on is held until the end of the turn: the same stream, only later.
- `stop_reason` is `tool_use` as soon as one call was dispatched (the client may already be running
  it), else `max_tokens` / `stop_sequence` / `end_turn`.
"""

from __future__ import annotations

import json
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
from agentserve.api._common import finish_error
from agentserve.api.errors import ApiError, InternalError, InvalidRequestError
from agentserve.api.identity import BodyIdentity, session_from_user_id
from agentserve.api.ids import anthropic_tool_id, canonical_call_id, is_safe_id, new_id
from agentserve.api.memory import CallMemory
from agentserve.api.nvext import parse_nvext
from agentserve.api.options import (
    GenerationOptions,
    ReasoningOptions,
    ResponseFormat,
    ThinkingMode,
    ToolChoice,
)
from agentserve.api.request import AnthropicRequest
from agentserve.api.signing import Signer
from agentserve.api.sse import dumps
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

# --------------------------------------------------------------------------------------------------
# Decoding

_KNOWN_FIELDS = frozenset(
    {
        "model", "max_tokens", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
        "stop_sequences", "temperature", "top_p", "top_k", "metadata", "stream", "cache_control",
        "context_management", "nvext",
    }
)  # fmt: skip
_IGNORED_FIELDS = frozenset({"service_tier", "container", "inference_geo", "mcp_servers", "betas"})
# Blocks the real API produces for its own server tools: history we cannot use, not an error.
_SERVER_BLOCKS = frozenset(
    {
        "server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
        "bash_code_execution_tool_result", "text_editor_code_execution_tool_result",
        "mcp_tool_use", "mcp_tool_result", "container_upload", "tool_search_tool_result",
    }
)  # fmt: skip
_EFFORTS = ("low", "medium", "high", "max", "xhigh")
MAX_TOOL_NAME = 256


def _dumps_input(value: Any) -> str:
    # The separators models write ({"a": 1}); ensure_ascii off keeps their raw unicode.
    return json.dumps(value, ensure_ascii=False)


class _Decoder:
    """One request's decoding state: tool ids seen so far (to pair results) and ignored fields."""

    def __init__(self, memory: CallMemory | None, scope: str, signer: Signer | None) -> None:
        self.memory = memory
        self.scope = scope
        self.signer = signer
        self.call_names: dict[str, str] = {}
        self.ignored: list[str] = []
        self.restored = 0

    # -- content --------------------------------------------------------------------------------

    def text_block(self, block: dict[str, Any], path: str) -> Text:
        return Text(req_str(block, "text", path))

    def image(self, block: dict[str, Any], path: str) -> Image:
        source = expect_dict(block.get("source"), at(path, "source"))
        spath = at(path, "source")
        kind = req_str(source, "type", spath)
        if kind == "base64":
            return Image(media_type=req_str(source, "media_type", spath), data=req_str(source, "data", spath))
        if kind == "url":
            return Image(url=req_str(source, "url", spath, nonempty=True))
        raise InvalidRequestError(f"unsupported image source type {kind!r}", param=at(spath, "type"))

    def document(self, block: dict[str, Any], path: str) -> Text:
        source = expect_dict(block.get("source"), at(path, "source"))
        if source.get("type") == "text":
            return Text(req_str(source, "data", at(path, "source")))
        raise InvalidRequestError(
            "only plain-text document sources are supported", param=at(at(path, "source"), "type")
        )

    def result_content(self, value: Any, path: str) -> tuple[Text | Image, ...]:
        if value is None:
            return ()
        if type(value) is str:
            return (Text(value),) if value else ()
        items = expect_list(value, path)
        out: list[Text | Image] = []
        for j, raw in enumerate(items):
            bpath = at(path, j)
            block = expect_dict(raw, bpath)
            kind = req_str(block, "type", bpath)
            if kind == "text":
                out.append(self.text_block(block, bpath))
            elif kind == "image":
                out.append(self.image(block, bpath))
            elif kind == "document":
                out.append(self.document(block, bpath))
            elif kind == "search_result":
                for k, inner in enumerate(expect_list(block.get("content"), at(bpath, "content"))):
                    ipath = at(at(bpath, "content"), k)
                    out.append(self.text_block(expect_dict(inner, ipath), ipath))
            elif kind == "tool_reference":
                self.ignored.append(bpath)  # tool-search bookkeeping: nothing for the model to read
            else:
                raise InvalidRequestError(f"unsupported tool_result content type {kind!r}", param=bpath)
        return tuple(out)

    def tool_use(self, block: dict[str, Any], path: str) -> ToolCall:
        wire_id = req_str(block, "id", path)
        if not is_safe_id(wire_id):
            raise InvalidRequestError("tool_use ids must match ^[a-zA-Z0-9_-]+$", param=at(path, "id"))
        call_id = canonical_call_id(wire_id)
        if call_id in self.call_names:
            raise InvalidRequestError(f"tool_use ids must be unique: {wire_id!r}", param=at(path, "id"))
        name = req_str(block, "name", path, nonempty=True)
        value = block.get("input")
        if type(value) is not dict:
            raise wrong_type(at(path, "input"), "an object", value)
        arguments = None
        if self.memory is not None:
            arguments = self.memory.restore_arguments(call_id, name, value, self.scope)
            if arguments is not None:
                self.restored += 1
        if arguments is None:
            arguments = _dumps_input(value)
        self.call_names[call_id] = name
        return ToolCall(call_id, name, arguments)

    def tool_result(self, block: dict[str, Any], path: str) -> ToolResult:
        wire_id = req_str(block, "tool_use_id", path)
        call_id = canonical_call_id(wire_id)
        name = self.call_names.get(call_id)
        if name is None:
            raise InvalidRequestError(
                f"unexpected tool_use_id {wire_id!r} in tool_result: no tool_use with this id precedes it",
                param=at(path, "tool_use_id"),
            )
        is_error = opt_bool(block, "is_error", path) or False
        return ToolResult(
            call_id, self.result_content(block.get("content"), at(path, "content")), is_error, name
        )

    # -- messages -------------------------------------------------------------------------------

    def system_text(self, value: Any, path: str) -> tuple[Text, ...]:
        if value is None:
            return ()
        if type(value) is str:
            return (Text(value),) if value else ()
        out: list[Text] = []
        for j, raw in enumerate(expect_list(value, path)):
            bpath = at(path, j)
            block = expect_dict(raw, bpath)
            kind = req_str(block, "type", bpath)
            if kind != "text":
                raise InvalidRequestError(
                    f"system blocks must be text, got {kind!r}", param=at(bpath, "type")
                )
            out.append(self.text_block(block, bpath))
        return tuple(out)

    def user(self, content: Any, path: str, out: list[Message]) -> None:
        if type(content) is str:
            _append(out, "user", (Text(content),))
            return
        blocks = expect_list(content, path)
        if not blocks:
            raise InvalidRequestError("at least one content block is required", param=path)
        pending: list[Part] = []
        for j, raw in enumerate(blocks):
            bpath = at(path, j)
            block = expect_dict(raw, bpath)
            kind = req_str(block, "type", bpath)
            if kind == "text":
                pending.append(self.text_block(block, bpath))
            elif kind == "image":
                pending.append(self.image(block, bpath))
            elif kind == "document":
                pending.append(self.document(block, bpath))
            elif kind == "tool_result":
                if pending:
                    _append(out, "user", tuple(pending))
                    pending = []
                out.append(Message("tool", (self.tool_result(block, bpath),)))
            elif kind in ("tool_use", "thinking", "redacted_thinking"):
                raise InvalidRequestError(f"{kind} blocks are not allowed in user messages", param=bpath)
            elif kind in _SERVER_BLOCKS or kind == "search_result":
                self.ignored.append(bpath)
            else:
                raise InvalidRequestError(f"unsupported content block type {kind!r}", param=at(bpath, "type"))
        if pending:
            _append(out, "user", tuple(pending))

    def assistant(self, content: Any, path: str, out: list[Message]) -> None:
        if type(content) is str:
            _append(out, "assistant", (Text(content),) if content else ())
            return
        parts: list[Part] = []
        for j, raw in enumerate(expect_list(content, path)):
            bpath = at(path, j)
            block = expect_dict(raw, bpath)
            kind = req_str(block, "type", bpath)
            if kind == "text":
                text = self.text_block(block, bpath)
                if text.text:
                    parts.append(text)
            elif kind == "thinking":
                thinking = req_str(block, "thinking", bpath)
                signature = opt_str(block, "signature", bpath)
                if not thinking and signature and self.signer is not None:
                    thinking = self.signer.unseal_reasoning(signature) or ""  # our omitted thinking
                if thinking:
                    parts.append(Reasoning(thinking, signature or None))
            elif kind == "redacted_thinking":
                opt_str(block, "data", bpath)
                self.ignored.append(bpath)
            elif kind == "tool_use":
                parts.append(self.tool_use(block, bpath))
            elif kind in _SERVER_BLOCKS:
                self.ignored.append(bpath)
            elif kind in ("tool_result", "image", "document"):
                raise InvalidRequestError(f"{kind} blocks are not allowed in assistant messages", param=bpath)
            else:
                raise InvalidRequestError(f"unsupported content block type {kind!r}", param=at(bpath, "type"))
        _append(out, "assistant", tuple(parts))

    def messages(self, value: Any, path: str) -> tuple[Message, ...]:
        if value is None:
            raise missing(path)
        items = expect_list(value, path)
        if not items:
            raise InvalidRequestError("at least one message is required", param=path)
        out: list[Message] = []
        for i, raw in enumerate(items):
            mpath = at(path, i)
            m = expect_dict(raw, mpath)
            role = req_str(m, "role", mpath)
            content = m.get("content")
            cpath = at(mpath, "content")
            if content is None:
                raise missing(cpath)
            if type(content) is not str and type(content) is not list:
                raise wrong_type(cpath, "a string or an array of content blocks", content)
            if role == "user":
                self.user(content, cpath, out)
            elif role == "assistant":
                self.assistant(content, cpath, out)
            elif role == "system":
                out.append(Message("system", self.system_text(content, cpath)))
            else:
                raise InvalidRequestError(
                    f"unknown role {role!r}: expected 'user', 'assistant' or 'system'",
                    param=at(mpath, "role"),
                )
        return tuple(out)

    # -- tools and options ------------------------------------------------------------------------

    def tools(self, value: Any, path: str) -> tuple[ToolSpec, ...]:
        if value is None:
            return ()
        specs: list[ToolSpec] = []
        seen: set[str] = set()
        for i, raw in enumerate(expect_list(value, path)):
            tpath = at(path, i)
            tool = expect_dict(raw, tpath)
            kind = tool.get("type")
            if kind is not None and kind != "custom":
                if type(kind) is not str:
                    raise wrong_type(at(tpath, "type"), "a string", kind)
                self.ignored.append(tpath)  # a server tool (web_search_…): we cannot run it
                continue
            name = req_str(tool, "name", tpath, nonempty=True)
            if len(name) > MAX_TOOL_NAME:
                raise InvalidRequestError(
                    f"must be at most {MAX_TOOL_NAME} characters", param=at(tpath, "name")
                )
            if name in seen:
                raise InvalidRequestError(f"tool names must be unique: {name!r}", param=at(tpath, "name"))
            seen.add(name)
            schema = tool.get("input_schema")
            if schema is None:
                raise missing(at(tpath, "input_schema"))
            schema = expect_dict(schema, at(tpath, "input_schema"))
            specs.append(ToolSpec(name, opt_str(tool, "description", tpath) or "", schema))
        return tuple(specs)


def _append(out: list[Message], role: str, parts: tuple[Part, ...]) -> None:
    """Consecutive user (or assistant) messages are one turn on the Anthropic API."""
    if out and out[-1].role == role:
        out[-1] = Message(out[-1].role, out[-1].parts + parts)
    else:
        out.append(Message(role, parts))  # type: ignore[arg-type]


def _tool_choice(value: Any, path: str) -> tuple[ToolChoice, bool]:
    if value is None:
        return ToolChoice(), True
    choice = expect_dict(value, path)
    kind = one_of(req_str(choice, "type", path), ("auto", "any", "tool", "none"), at(path, "type"))
    parallel = not (opt_bool(choice, "disable_parallel_tool_use", path) or False)
    if kind == "auto":
        return ToolChoice("auto"), parallel
    if kind == "any":
        return ToolChoice("required"), parallel
    if kind == "none":
        return ToolChoice("none"), parallel
    return ToolChoice("named", req_str(choice, "name", path, nonempty=True)), parallel


def _thinking(value: Any, path: str, max_tokens: int | None) -> tuple[ThinkingMode, int | None, str | None]:
    if value is None:
        return "default", None, None
    thinking = expect_dict(value, path)
    kind = one_of(req_str(thinking, "type", path), ("enabled", "disabled", "adaptive"), at(path, "type"))
    if kind == "enabled":
        budget = opt_int(thinking, "budget_tokens", path, minimum=1)
        if budget is None:
            raise missing(at(path, "budget_tokens"))
        if max_tokens is not None and max_tokens > 0 and budget >= max_tokens:
            raise InvalidRequestError("must be less than max_tokens", param=at(path, "budget_tokens"))
        return "enabled", budget, None
    if kind == "adaptive":
        display = opt_str(thinking, "display", path)
        if display is not None:
            one_of(display, ("summarized", "omitted"), at(path, "display"))
        return "adaptive", None, display
    return "disabled", None, None


def _output_config(value: Any, path: str) -> tuple[str | None, ResponseFormat | None]:
    if value is None:
        return None, None
    config = expect_dict(value, path)
    effort = opt_str(config, "effort", path)
    if effort is not None:
        one_of(effort, _EFFORTS, at(path, "effort"))
    fmt = None
    raw_format = opt_dict(config, "format", path)
    if raw_format is not None:
        fpath = at(path, "format")
        one_of(req_str(raw_format, "type", fpath), ("json_schema",), at(fpath, "type"))
        schema = opt_dict(raw_format, "schema", fpath)
        if schema is None:
            raise missing(at(fpath, "schema"))
        fmt = ResponseFormat("json_schema", schema)
    return effort, fmt


def _decode(
    body: Any, *, count_tokens: bool, memory: CallMemory | None, memory_scope: str, signer: Signer | None
) -> AnthropicRequest:
    b = expect_dict(body, "body")
    d = _Decoder(memory, memory_scope, signer)
    model = req_str(b, "model", "", nonempty=True)
    max_tokens = opt_int(b, "max_tokens", "", minimum=0)
    if max_tokens is None and not count_tokens:
        raise missing("max_tokens")
    system = d.system_text(b.get("system"), "system")
    messages = d.messages(b.get("messages"), "messages")
    tools = d.tools(b.get("tools"), "tools")
    tool_choice, parallel = _tool_choice(b.get("tool_choice"), "tool_choice")
    mode, budget, display = _thinking(b.get("thinking"), "thinking", max_tokens)
    effort, fmt = _output_config(b.get("output_config"), "output_config")
    stop = str_list(b["stop_sequences"], "stop_sequences") if b.get("stop_sequences") is not None else ()

    user_id = None
    metadata = opt_dict(b, "metadata", "")
    if metadata is not None:
        user_id = opt_str(metadata, "user_id", "metadata")
        if user_id is not None and len(user_id) > 4096:
            raise InvalidRequestError("must be at most 4096 characters", param="metadata.user_id")
    context_management = opt_dict(b, "context_management", "")
    opt_dict(b, "cache_control", "")  # accepted, ignored: our prefix cache needs no breakpoints
    nvext = parse_nvext(b.get("nvext"))

    for key in b:
        if key not in _KNOWN_FIELDS and (key in _IGNORED_FIELDS or b[key] is not None):
            d.ignored.append(key)

    options = GenerationOptions(
        model=model,
        max_tokens=max_tokens,
        temperature=opt_number(b, "temperature", "", minimum=0.0, maximum=1.0),
        top_p=opt_number(b, "top_p", "", minimum=0.0, maximum=1.0),
        top_k=opt_int(b, "top_k", "", minimum=0),
        stop=stop,
        stream=bool(opt_bool(b, "stream", "")),
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        reasoning=ReasoningOptions(mode=mode, budget_tokens=budget, effort=effort, display=display),
        response_format=fmt,
    )
    session = session_from_user_id(user_id) if user_id else None
    return AnthropicRequest(
        api="anthropic",
        conversation=Conversation(system, messages, tools),
        options=options,
        identity=BodyIdentity(session, "metadata.user_id" if session else None),
        nvext=nvext,
        ignored=tuple(d.ignored) + nvext.ignored,
        restored=d.restored,
        user_id=user_id,
        context_management=context_management,
    )


def decode_messages(
    body: Any, *, memory: CallMemory | None = None, memory_scope: str = "", signer: Signer | None = None
) -> AnthropicRequest:
    """Decode a `POST /v1/messages` body (already parsed JSON). Raises only ApiError.

    `signer` restores thinking we sent omitted (empty text, sealed signature).
    """
    return _decode(body, count_tokens=False, memory=memory, memory_scope=memory_scope, signer=signer)


def decode_count_tokens(
    body: Any, *, memory: CallMemory | None = None, memory_scope: str = "", signer: Signer | None = None
) -> AnthropicRequest:
    """Decode a `POST /v1/messages/count_tokens` body: the same shape without `max_tokens`."""
    return _decode(body, count_tokens=True, memory=memory, memory_scope=memory_scope, signer=signer)


def count_tokens_body(input_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens}


# --------------------------------------------------------------------------------------------------
# Encoding


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
        "_dispatch",
        "_dispatched",
        "_done",
        "_held",
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
    ) -> None:
        self.model = model
        self.message_id = message_id or new_id("msg_")
        # Streaming tool dispatch off: everything from the first finished call on waits for the end.
        self._dispatch = dispatch
        self._held: list[bytes] = []
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
            + dumps(text)
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
            case TextDelta(text):
                if self._open != "text":
                    out += self._close() + self._block_start({"type": "text", "text": ""})
                    self._open = "text"
                return out + self._text("text_delta", "text", text)
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
        call_id, name, fragments = self._call
        self._call = None
        self._dispatched += 1
        if self._stream_tool_input:
            self._open = None
            return self._block_stop()
        if "".join(fragments) != arguments:
            fragments = [arguments]  # the end event is authoritative
        out = self._tool_start(call_id, name)
        for fragment in fragments:
            if fragment:
                out += self._text("input_json_delta", "partial_json", fragment)
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
        held, self._held = b"".join(self._held), []
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
        return (
            out
            + sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
            + sse_event("message_stop", {"type": "message_stop"})
        )

    def error(self, error: ApiError) -> bytes:
        """End the stream with an `error` event (after HTTP 200 the status cannot change)."""
        if self._done:
            return b""
        self._done = True
        out, self._held = b"".join(self._held), []
        return out + error_event(error)


def build_message(
    events: Iterable[OutputEvent] | TurnAccumulator,
    *,
    model: str,
    signer: Signer,
    message_id: str | None = None,
    stop_sequence: str | None = None,
    omit_thinking: bool = False,
) -> dict[str, Any]:
    """The non-streaming `/v1/messages` response for a finished turn. Raises ApiError if it failed."""
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
    return {
        "id": message_id or new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
        "usage": _usage_json(finish.usage),
    }
