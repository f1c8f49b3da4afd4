"""Anthropic Messages requests: `/v1/messages` and `count_tokens` bodies into Conversation + options."""

from __future__ import annotations

import json
import re
from typing import Any

from agentserve.api import contract
from agentserve.api._check import (
    at,
    check_depth,
    expect_dict,
    expect_list,
    missing,
    object_schema,
    one_of,
    opt_bool,
    opt_dict,
    opt_int,
    opt_number,
    opt_str,
    req_name,
    req_str,
    str_list,
    wrong_type,
)
from agentserve.api.anthropic.context import parse_context_management
from agentserve.api.client_tools import ANTHROPIC_CLIENT_TOOL, anthropic_client_tool
from agentserve.api.errors import InvalidRequestError
from agentserve.api.identity import BodyIdentity, session_from_user_id
from agentserve.api.ids import canonical_call_id, is_safe_id
from agentserve.api.memory import CallMemory, restore_history
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
from agentserve.conversation import (
    Conversation,
    Image,
    Message,
    Part,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
)

# The fields this decoder knows, and those it accepts without effect: the contract table's rows.
_KNOWN_FIELDS = contract.top_level("anthropic")
_IGNORED_FIELDS = contract.ignored_top_level("anthropic")
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
MIN_THINKING_BUDGET = 1024  # Anthropic: budget_tokens must be ≥ 1024 (and < max_tokens)
# Anthropic's server tools are versioned tags (`web_search_20250305`, `bash_20250124`, …).
_SERVER_TOOL = re.compile(r"^[a-z][a-z0-9_]*_\d{8}$|^mcp_toolset$")


def _not_a_tool(kind: str) -> str:
    return (
        f"tool type {kind!r} is not an Anthropic tool: send {{name, description, input_schema}} "
        "(type 'custom' or none), or a versioned server tool"
    )


def _dumps_input(value: Any) -> str:
    # The separators models write ({"a": 1}); ensure_ascii off keeps their raw unicode.
    return json.dumps(value, ensure_ascii=False)


class _Decoder:
    """One request's decoding state: tool ids seen so far (to pair results) and ignored fields."""

    def __init__(self, signer: Signer | None) -> None:
        self.signer = signer
        self.call_names: dict[str, str] = {}
        self.ignored: list[str] = []
        self.server_tools: set[str] = set()  # names of server tools (ignored, but tool_choice may name one)

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
        if source.get("type") != "text":
            raise InvalidRequestError(
                "only plain-text document sources are supported", param=at(at(path, "source"), "type")
            )
        opt_str(source, "media_type", at(path, "source"))
        _no_citations(block, path)
        body = req_str(source, "data", at(path, "source"))
        return Text(_headed(body, opt_str(block, "title", path), opt_str(block, "context", path)))

    def search_result(self, block: dict[str, Any], path: str) -> Text:
        _no_citations(block, path)
        texts = [
            self.text_block(expect_dict(inner, at(at(path, "content"), k)), at(at(path, "content"), k)).text
            for k, inner in enumerate(expect_list(block.get("content"), at(path, "content")))
        ]
        title = req_str(block, "title", path)
        source = req_str(block, "source", path)
        return Text(_headed("\n\n".join(texts), title, source))

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
                out.append(self.search_result(block, bpath))
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
        check_depth(value, at(path, "input"))
        self.call_names[call_id] = name
        return ToolCall(call_id, name, _dumps_input(value))

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
            elif kind == "search_result":
                pending.append(self.search_result(block, bpath))
            elif kind in _SERVER_BLOCKS:
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
                if not _SERVER_TOOL.match(kind):
                    # Anthropic answers a tag it does not know (an OpenAI `function` tool) with a 400.
                    raise InvalidRequestError(_not_a_tool(kind), param=at(tpath, "type"))
                if "name" not in tool and ANTHROPIC_CLIENT_TOOL.match(kind):
                    raise missing(at(tpath, "name"))  # the client tool's fixed name (`bash`, …)
                name = req_str(tool, "name", tpath, nonempty=True) if "name" in tool else kind
                for key in ("max_characters", "display_width_px", "display_height_px", "display_number"):
                    opt_int(tool, key, tpath, minimum=0)
                strict = bool(opt_bool(tool, "strict", tpath))
                client = anthropic_client_tool(kind, tool, name, strict)
                if client is None:
                    # A server tool (web_search_…) runs on Anthropic's side: it cannot run here.
                    self.ignored.append(tpath)
                    self.server_tools.add(name)
                    continue
                if name in seen:
                    raise InvalidRequestError(f"tool names must be unique: {name!r}", param=at(tpath, "name"))
                seen.add(name)
                specs.append(client)  # a client tool (bash_…, text_editor_…): shown with its schema
                continue
            if "function" in tool and "input_schema" not in tool:
                raise InvalidRequestError(_not_a_tool("function"), param=tpath)
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
            schema = check_depth(expect_dict(schema, at(tpath, "input_schema")), at(tpath, "input_schema"))
            # An object's schema: Anthropic requires `type: object`; one without `type` (seen in
            # the wild) is accepted, any other type refused.
            object_schema(schema, at(tpath, "input_schema"))
            strict = bool(opt_bool(tool, "strict", tpath))
            specs.append(ToolSpec(name, opt_str(tool, "description", tpath) or "", schema, strict))
        return tuple(specs)


def _headed(body: str, title: str | None, context: str | None) -> str:
    """A document's or search result's text under its title and context lines (as given)."""
    head = "\n".join(line for line in (title, context) if line)
    return f"{head}\n\n{body}" if head else body


def _no_citations(block: dict[str, Any], path: str) -> None:
    """`citations: {enabled: true}` asks for citation blocks in the answer, which we cannot produce."""
    citations = opt_dict(block, "citations", path)
    if citations is not None and opt_bool(citations, "enabled", at(path, "citations")):
        raise InvalidRequestError(
            "citations are not supported: the model cannot produce citation blocks here",
            param=at(at(path, "citations"), "enabled"),
        )


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
        if budget < MIN_THINKING_BUDGET:
            raise InvalidRequestError(
                f"must be greater than or equal to {MIN_THINKING_BUDGET}", param=at(path, "budget_tokens")
            )
        if max_tokens is not None and max_tokens > 0 and budget >= max_tokens:
            raise InvalidRequestError("must be less than max_tokens", param=at(path, "budget_tokens"))
        return "enabled", budget, None
    if kind == "adaptive":
        # Any display is accepted: only "omitted" changes what we send. Claude Code 2.1.330 sends
        # "updates" (beta thinking-display-updates-2026-08-18) and retries without it after a 400.
        display = opt_str(thinking, "display", path)
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
        fmt = ResponseFormat("json_schema", check_depth(schema, at(fpath, "schema")))
    return effort, fmt


def _decode(
    body: Any, *, count_tokens: bool, memory: CallMemory | None, memory_scope: str, signer: Signer | None
) -> AnthropicRequest:
    b = expect_dict(body, "body")
    d = _Decoder(signer)
    model = req_name(b, "model", "")
    max_tokens = opt_int(b, "max_tokens", "", minimum=0)
    if max_tokens is None and not count_tokens:
        raise missing("max_tokens")
    system = d.system_text(b.get("system"), "system")
    messages = d.messages(b.get("messages"), "messages")
    tools = d.tools(b.get("tools"), "tools")
    tool_choice, parallel = _tool_choice(b.get("tool_choice"), "tool_choice")
    offered = d.server_tools.union(t.name for t in tools)
    if tool_choice.mode == "named" and tool_choice.name not in offered:
        raise InvalidRequestError(
            f"tool_choice names tool {tool_choice.name!r}, which is not in tools",
            param="tool_choice.name",
        )
    if tool_choice.mode == "named" and tool_choice.name in d.server_tools:
        # A server tool (web_search_…) cannot run here: forcing a call of it cannot be honoured.
        raise InvalidRequestError(
            f"tool_choice names {tool_choice.name!r}, a server tool that cannot run on this server",
            param="tool_choice.name",
        )
    mode, budget, display = _thinking(b.get("thinking"), "thinking", max_tokens)
    if mode in ("enabled", "adaptive") and tool_choice.mode in ("required", "named"):
        # Anthropic: a forced tool call prefills the turn, which thinking cannot precede.
        raise InvalidRequestError(
            "Thinking may not be enabled when tool_choice forces tool use.", param="tool_choice"
        )
    effort, fmt = _output_config(b.get("output_config"), "output_config")
    if max_tokens == 0:
        # A cache pre-warm: the real API refuses it with streaming, thinking or structured output.
        for key, clash in (
            ("stream", b.get("stream") is True),
            ("thinking", mode in ("enabled", "adaptive")),
        ):
            if clash:
                raise InvalidRequestError(
                    f"max_tokens 0 (a cache pre-warm) cannot be used with {key}", param="max_tokens"
                )
        if fmt is not None:
            raise InvalidRequestError(
                "max_tokens 0 (a cache pre-warm) cannot be used with output_config.format", param="max_tokens"
            )
    stop = str_list(b["stop_sequences"], "stop_sequences") if b.get("stop_sequences") is not None else ()

    user_id = None
    metadata = opt_dict(b, "metadata", "")
    if metadata is not None:
        user_id = opt_str(metadata, "user_id", "metadata")
        if user_id is not None and len(user_id) > 4096:
            raise InvalidRequestError("must be at most 4096 characters", param="metadata.user_id")
    context_management = parse_context_management(
        check_depth(opt_dict(b, "context_management", ""), "context_management"), "context_management"
    )
    opt_dict(b, "cache_control", "")  # accepted, ignored: our prefix cache needs no breakpoints
    nvext = parse_nvext(b.get("nvext"))

    for key in b:
        if key in _IGNORED_FIELDS or (key not in _KNOWN_FIELDS and b[key] is not None):
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
    restored = 0
    if memory is not None:  # the frontend restores once it knows the conversation (`restore_history`)
        messages, restored = restore_history(messages, memory, memory_scope, whole_turns=False)
    return AnthropicRequest(
        api="anthropic",
        conversation=Conversation(system, messages, tools),
        options=options,
        identity=BodyIdentity(session, "metadata.user_id" if session else None),
        nvext=nvext,
        ignored=tuple(d.ignored) + nvext.ignored,
        restored=restored,
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
