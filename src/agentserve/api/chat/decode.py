"""Chat Completions requests: `/v1/chat/completions` bodies into Conversation + options."""

from __future__ import annotations

import json
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
    openai_metadata,
    opt_bool,
    opt_dict,
    opt_int,
    opt_number,
    opt_str,
    req_name,
    req_str,
    wrong_type,
)
from agentserve.api._common import parse_data_url
from agentserve.api.custom_format import CUSTOM_INPUT, SYNTAXES, custom_input_schema
from agentserve.api.errors import InvalidRequestError
from agentserve.api.memory import CallMemory, restore_history
from agentserve.api.nvext import parse_nvext
from agentserve.api.options import (
    GenerationOptions,
    ReasoningOptions,
    ResponseFormat,
    ThinkingMode,
    ToolChoice,
)
from agentserve.api.request import DecodedRequest
from agentserve.api.responses.common import custom_tool_parameters
from agentserve.api.strict import check_strict_format, check_strict_function
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

MAX_STOP = 4  # OpenAI's limit; more is its 400
MAX_TOOLS = 128  # OpenAI's limit on Chat tools
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
# The fields this decoder knows, and those it accepts without effect: the contract table's rows.
_KNOWN_FIELDS = contract.top_level("chat")
_IGNORED_FIELDS = contract.ignored_top_level("chat")


class _Decoder:
    def __init__(self) -> None:
        self.call_names: dict[str, str] = {}
        self.legacy_calls: list[tuple[str, str]] = []  # (id, name) of unanswered legacy function calls
        self.ignored: list[str] = []
        self.custom_tools: set[str] = set()  # custom (freeform) tools: calls come back as `type: custom`

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
        if kind == "custom":
            call_id = req_str(call, "id", path, nonempty=True)
            cpath = at(path, "custom")
            custom = expect_dict(call.get("custom"), cpath)
            text = req_str(custom, "input", cpath)
            wrapped = json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)
            return ToolCall(call_id, req_str(custom, "name", cpath, nonempty=True), wrapped)
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
        alternative = opt_str(m, "reasoning", path)  # checked even when reasoning_content is set
        if reasoning is None:
            reasoning = alternative
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
        for call in message.tool_calls:
            self.call_names[call.id] = call.name
        return message

    def tool(self, m: dict[str, Any], path: str) -> Message:
        call_id = req_str(m, "tool_call_id", path)
        name = self.call_names.get(call_id)
        if name is None:
            raise InvalidRequestError(
                f"tool message answers {call_id!r}, which no preceding assistant tool_calls contain",
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
            name = req_name(function, "name", path)
            if name in seen:
                raise InvalidRequestError(f"tool names must be unique: {name!r}", param=at(path, "name"))
            seen.add(name)
            parameters = check_depth(opt_dict(function, "parameters", path), at(path, "parameters"))
            object_schema(parameters, at(path, "parameters"))
            strict = bool(opt_bool(function, "strict", path))
            if strict:  # OpenAI's strict-mode rules, before anything is built from the schema
                check_strict_function(parameters, name, at(path, "parameters"))
            specs.append(
                ToolSpec(name, opt_str(function, "description", path) or "", parameters or {}, strict)
            )

        tools = b.get("tools")
        if tools is not None:
            if len(expect_list(tools, "tools")) > MAX_TOOLS:
                raise InvalidRequestError(f"at most {MAX_TOOLS} tools are allowed", param="tools")
            for i, raw in enumerate(expect_list(tools, "tools")):
                path = at("tools", i)
                tool = expect_dict(raw, path)
                kind = tool.get("type", "function")
                if kind == "custom":
                    self.custom(
                        expect_dict(tool.get("custom"), at(path, "custom")), at(path, "custom"), seen, specs
                    )
                    continue
                if kind != "function":
                    if type(kind) is not str:
                        raise wrong_type(at(path, "type"), "a string", kind)
                    # A hosted tool type cannot run here and is no Chat tool: refused, not dropped.
                    raise InvalidRequestError(
                        f"tool type {kind!r} is not supported: send 'function' or 'custom' tools",
                        param=at(path, "type"),
                    )
                add(expect_dict(tool.get("function"), at(path, "function")), at(path, "function"))
        functions = b.get("functions")  # legacy tools
        if functions is not None:
            for i, raw in enumerate(expect_list(functions, "functions")):
                add(expect_dict(raw, at("functions", i)), at("functions", i))
        return tuple(specs)

    def custom(self, tool: dict[str, Any], path: str, seen: set[str], specs: list[ToolSpec]) -> None:
        """A custom tool: the model writes one freeform `input` string (shown as a function of it)."""
        name = req_name(tool, "name", path)
        if name in seen:
            raise InvalidRequestError(f"tool names must be unique: {name!r}", param=at(path, "name"))
        seen.add(name)
        enforce = _custom_format(opt_dict(tool, "format", path), at(path, "format"))
        description = opt_str(tool, "description", path) or ""
        specs.append(ToolSpec(name, description, custom_tool_parameters(), enforce=enforce))
        self.custom_tools.add(name)


def _custom_format(value: dict[str, Any] | None, path: str) -> dict[str, Any] | None:
    """A custom tool's `format`: `{type: text}` (free input), or `{type: grammar, grammar: {syntax,
    definition}}` enforced on the input (`api/custom_format.py`)."""
    if value is None:
        return None
    kind = one_of(req_str(value, "type", path), ("text", "grammar"), at(path, "type"))
    if kind == "text":
        return None
    gpath = at(path, "grammar")
    grammar = expect_dict(value.get("grammar"), gpath)
    syntax = one_of(req_str(grammar, "syntax", gpath), SYNTAXES, at(gpath, "syntax"))
    return custom_input_schema(syntax, req_str(grammar, "definition", gpath), at(gpath, "definition"))


def _logprobs(b: dict[str, Any]) -> tuple[int | None, tuple[tuple[int, float], ...]]:
    """`logprobs` / `top_logprobs` → alternatives per token (None: no log-probabilities), and
    `logit_bias` as (token id, bias) pairs, checked as OpenAI checks them."""
    wanted = bool(opt_bool(b, "logprobs", ""))
    top = opt_int(b, "top_logprobs", "", minimum=0, maximum=20)
    if top is not None and not wanted:
        raise InvalidRequestError("top_logprobs requires logprobs to be true", param="top_logprobs")
    bias = opt_dict(b, "logit_bias", "") or {}
    if len(bias) > 300:
        raise InvalidRequestError("logit_bias may hold at most 300 tokens", param="logit_bias")
    pairs: list[tuple[int, float]] = []
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise InvalidRequestError(f"Invalid key in 'logit_bias': {key}.", param="logit_bias")
        if type(value) not in (int, float) or not -100 <= value <= 100:
            raise InvalidRequestError(
                f"Invalid value for 'logit_bias' token {key}: a number in -100..100.", param="logit_bias"
            )
        pairs.append((int(key), float(value)))
    return (top or 0) if wanted else None, tuple(pairs)


def _tool_choice(b: dict[str, Any]) -> ToolChoice:
    legacy = _choice(b.get("function_call"), "function_call", legacy=True)  # checked even when unused
    choice = _choice(b.get("tool_choice"), "tool_choice", legacy=False)
    return choice or legacy or ToolChoice()


def _choice(value: Any, path: str, *, legacy: bool) -> ToolChoice | None:
    if value is None:
        return None
    if type(value) is str:
        mode = one_of(value, ("auto", "none", "required"), path)
        return ToolChoice(mode)  # type: ignore[arg-type]
    choice = expect_dict(value, path)
    if legacy:  # function_call: {"name": ...}
        return ToolChoice("named", req_str(choice, "name", path, nonempty=True))
    kind = one_of(req_str(choice, "type", path), ("function", "custom", "allowed_tools"), at(path, "type"))
    if kind == "allowed_tools":
        # {"type": "allowed_tools", "allowed_tools": {"mode": "auto"|"required", "tools": [...]}}
        spec = expect_dict(choice.get("allowed_tools"), at(path, "allowed_tools"))
        spath = at(path, "allowed_tools")
        mode = one_of(req_str(spec, "mode", spath), ("auto", "required"), at(spath, "mode"))
        names: list[str] = []
        for i, raw in enumerate(expect_list(spec.get("tools"), at(spath, "tools"))):
            tpath = at(at(spath, "tools"), i)
            tool = expect_dict(raw, tpath)
            tkind = one_of(req_str(tool, "type", tpath), ("function", "custom"), at(tpath, "type"))
            names.append(req_str(expect_dict(tool.get(tkind), at(tpath, tkind)), "name", at(tpath, tkind)))
        return ToolChoice(mode, allowed=tuple(names))  # type: ignore[arg-type]
    named = expect_dict(choice.get(kind), at(path, kind))
    return ToolChoice("named", req_str(named, "name", at(path, kind), nonempty=True))


def _chosen_kinds(value: Any) -> list[tuple[str, str]]:
    """The (name, kind) each tool a decoded `tool_choice` names says it is: `function` or
    `custom` (a forced tool, or the allowed ones)."""
    if not isinstance(value, dict):
        return []
    kind = value.get("type")
    if kind in ("function", "custom"):
        return [(value[kind]["name"], kind)]
    if kind == "allowed_tools":
        return [(t[t["type"]]["name"], t["type"]) for t in value["allowed_tools"]["tools"]]
    return []


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
        fmt = ResponseFormat(
            "json_schema",
            check_depth(
                opt_dict(spec, "schema", "response_format.json_schema"), "response_format.json_schema.schema"
            ),
            req_str(spec, "name", "response_format.json_schema", nonempty=True),  # required by OpenAI
            opt_bool(spec, "strict", "response_format.json_schema"),
        )
        if fmt.strict:
            check_strict_format(fmt.schema, fmt.name, "response_format")
        return fmt
    return ResponseFormat(kind)  # type: ignore[arg-type]


def _stop(b: dict[str, Any]) -> tuple[str, ...]:
    value = b.get("stop")
    if value is None:
        return ()
    if type(value) is str:
        return (value,)
    items = expect_list(value, "stop")
    if len(items) > MAX_STOP:
        raise InvalidRequestError(f"at most {MAX_STOP} stop sequences are allowed", param="stop")
    for i, item in enumerate(items):
        if type(item) is not str:
            raise wrong_type(at("stop", i), "a string", item)
    return tuple(items)


def decode_chat(body: Any, *, memory: CallMemory | None = None, memory_scope: str = "") -> DecodedRequest:
    """Decode a `POST /v1/chat/completions` body (already parsed JSON). Raises only ApiError.

    With `memory`, turns it recognises are restored under `memory_scope` (`restore_history`); the
    frontend restores after identifying the conversation instead (`ChatSurface.restore`)."""
    b = expect_dict(body, "body")
    d = _Decoder()
    model = req_name(b, "model", "")
    n = opt_int(b, "n", "")
    if n is not None and n != 1:
        raise InvalidRequestError("only n=1 is supported: send one request per choice", param="n")
    system, messages = d.messages(b.get("messages"))
    tools = d.tools(b)
    tool_choice = _tool_choice(b)
    if tool_choice.mode == "required" and not tools:
        raise InvalidRequestError(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            param="tool_choice",
        )
    for name in tool_choice.allowed or ():
        if all(t.name != name for t in tools):
            raise InvalidRequestError(
                f"Invalid value for 'tool_choice': allowed tool {name!r} is not in tools", param="tool_choice"
            )
    for name, kind in _chosen_kinds(b.get("tool_choice")):
        if any(t.name == name for t in tools) and (name in d.custom_tools) != (kind == "custom"):
            other = "function" if kind == "custom" else "custom tool"
            raise InvalidRequestError(
                f"Invalid value for 'tool_choice': {name!r} is a {other}, not a {kind} tool",
                param="tool_choice",
            )
    if tool_choice.mode == "named" and all(t.name != tool_choice.name for t in tools):
        # OpenAI answers 400: a forced call of a function the model was not given.
        param = "tool_choice" if b.get("tool_choice") is not None else "function_call"
        if not tools:
            raise InvalidRequestError(
                f"Invalid value for '{param}': '{param}' is only allowed when 'tools' are specified.",
                param=param,
            )
        raise InvalidRequestError(
            f"Invalid value for '{param}': function {tool_choice.name!r} is not in tools", param=param
        )
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
    kwargs = check_depth(opt_dict(b, "chat_template_kwargs", ""), "chat_template_kwargs") or {}
    mode: ThinkingMode = "default"
    thinking = kwargs.get("enable_thinking", kwargs.get("thinking"))
    if type(thinking) is bool:
        mode = "enabled" if thinking else "disabled"
    top_k = opt_int(b, "top_k", "", minimum=-1)
    seed = opt_int(b, "seed", "")
    nvext = parse_nvext(b.get("nvext"))
    logprobs, logit_bias = _logprobs(b)
    for key in b:
        if (key not in _KNOWN_FIELDS or key in _IGNORED_FIELDS) and b[key] is not None:
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
        tool_choice=tool_choice,
        parallel_tool_calls=opt_bool(b, "parallel_tool_calls", "") is not False,
        reasoning=ReasoningOptions(mode=mode, effort=effort),
        response_format=_response_format(b),
        include_usage=include_usage,
        template_kwargs=kwargs,
        logprobs=logprobs,
        logit_bias=logit_bias,
    )
    opt_str(b, "user", "")
    openai_metadata(opt_dict(b, "metadata", ""), "metadata")  # OpenAI's limits; not used otherwise
    restored = 0
    if memory is not None:
        messages, restored = restore_history(messages, memory, memory_scope, whole_turns=True)
    return DecodedRequest(
        api="chat",
        conversation=Conversation(system, messages, tools),
        options=options,
        nvext=nvext,
        ignored=tuple(d.ignored) + nvext.ignored,
        restored=restored,
        custom_tools=frozenset(d.custom_tools),
    )
