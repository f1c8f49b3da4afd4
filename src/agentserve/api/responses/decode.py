"""Responses requests: `/v1/responses` bodies into Conversation + options."""

from __future__ import annotations

import json
from typing import Any

from agentserve.api import contract
from agentserve.api._check import (
    MAX_DEPTH,
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
    req_dict,
    req_name,
    req_str,
    str_list,
    wrong_type,
)
from agentserve.api._common import parse_data_url
from agentserve.api.client_tools import RESPONSES_CLIENT_TOOLS, responses_client_tool
from agentserve.api.custom_format import CUSTOM_INPUT, SYNTAXES, custom_input_schema
from agentserve.api.errors import InvalidRequestError
from agentserve.api.identity import BodyIdentity
from agentserve.api.nvext import is_valid_id, parse_nvext
from agentserve.api.options import GenerationOptions, ReasoningOptions, ResponseFormat, ToolChoice
from agentserve.api.request import ResponsesRequest, ResponsesTool
from agentserve.api.responses.common import ResponseStore, custom_tool_parameters
from agentserve.api.signing import Signer
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

_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_SUMMARIES = ("auto", "concise", "detailed", "none")
_VERBOSITY = ("low", "medium", "high")
# The fields this decoder knows, and those it accepts without effect: the contract table's rows.
_KNOWN_FIELDS = contract.top_level("responses")
_IGNORED_FIELDS = contract.ignored_top_level("responses")
# Items produced by hosted tools on OpenAI's side: nothing our model can replay.
_HOSTED_ITEMS = frozenset(
    {
        "web_search_call", "file_search_call", "computer_call", "computer_call_output",
        "code_interpreter_call", "image_generation_call", "mcp_call", "mcp_list_tools",
        "mcp_approval_request", "mcp_approval_response", "compaction", "tool_search_call",
        "tool_search_output",
    }
)  # fmt: skip
# A client tool's call item: (tool name, the item's field holding the arguments).
_CLIENT_CALLS = {
    "local_shell_call": ("local_shell", "action"),
    "shell_call": ("shell", "action"),
    "apply_patch_call": ("apply_patch", "operation"),
}
_CLIENT_OUTPUTS = frozenset({"local_shell_call_output", "shell_call_output", "apply_patch_call_output"})
_INCLUDE_LOGPROBS = "message.output_text.logprobs"


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
        self.item_calls: dict[str, str] = {}  # a client call item's `id` -> its call_id

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

    def client_call(self, item: dict[str, Any], path: str, kind: str) -> None:
        """A `local_shell_call` / `shell_call` / `apply_patch_call` in history: the tool's call, its
        action (or operation) as the arguments the model wrote."""
        call_id = req_str(item, "call_id", path, nonempty=True)
        if call_id in self.call_names:
            raise InvalidRequestError(f"duplicate call_id {call_id!r}", param=at(path, "call_id"))
        name, field = _CLIENT_CALLS[kind]
        value = check_depth(expect_dict(item.get(field), at(path, field)), at(path, field))
        if kind == "local_shell_call":  # `type: exec` is the item's, not the model's
            value = {k: v for k, v in value.items() if k != "type"}
        item_id = opt_str(item, "id", path)
        if item_id:
            self.item_calls[item_id] = call_id
        self.call_names[call_id] = name
        self.assistant_part(ToolCall(call_id, name, json.dumps(value, ensure_ascii=False)))

    def client_output(self, item: dict[str, Any], path: str, kind: str) -> None:
        """A client tool's answer, as text the model reads; a failed patch is a tool error."""
        self.flush()
        # OpenAI's `local_shell_call_output` names its call by `id` (the call's item id or call id).
        key = "call_id" if kind != "local_shell_call_output" or "call_id" in item else "id"
        call_id = req_str(item, key, path)
        call_id = self.item_calls.get(call_id, call_id)
        name = self.call_names.get(call_id)
        if name is None:
            raise InvalidRequestError(
                f"no tool call found for output with call_id {call_id!r}", param=at(path, key)
            )
        is_error = False
        if kind == "shell_call_output":
            text = _shell_output(expect_list(item.get("output"), at(path, "output")), at(path, "output"))
        elif kind == "apply_patch_call_output":
            status = opt_str(item, "status", path)
            if status is not None:
                one_of(status, ("completed", "failed"), at(path, "status"))
            is_error = status == "failed"
            text = opt_str(item, "output", path) or (status or "")
        else:
            text = req_str(item, "output", path)
        content = (Text(text),) if text else ()
        self.messages.append(Message("tool", (ToolResult(call_id, content, is_error, name),)))

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
                tools = check_depth(item.get("tools"), at(path, "tools"), max_depth=MAX_DEPTH + 2)
                self.add_tools(tools, at(path, "tools"))
            elif kind in _CLIENT_CALLS:
                self.client_call(item, path, kind)
            elif kind in _CLIENT_OUTPUTS:
                self.client_output(item, path, kind)
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
            if kind in RESPONSES_CLIENT_TOOLS:
                # OpenAI's client-executed tools: shown with their schema, named by their type.
                if kind in self.tool_kinds:
                    raise InvalidRequestError(f"tool names must be unique: {kind!r}", param=at(tpath, "type"))
                self.tools.append(responses_client_tool(kind))
                self.tool_kinds[kind] = ResponsesTool(kind, namespace)  # type: ignore[arg-type]
                continue
            if kind not in ("function", "custom"):
                self.ignored.append(tpath)  # hosted tools run on OpenAI's side, not here
                continue
            name = req_name(tool, "name", tpath)
            if name in self.tool_kinds:
                raise InvalidRequestError(f"tool names must be unique: {name!r}", param=at(tpath, "name"))
            description = opt_str(tool, "description", tpath) or ""
            strict = False
            enforce = None
            if kind == "function":
                parameters = object_schema(opt_dict(tool, "parameters", tpath), at(tpath, "parameters"))
                parameters = parameters or {"type": "object", "properties": {}}
                # Enforced when the request says `strict: true` (an absent flag is not enforced).
                strict = opt_bool(tool, "strict", tpath) is True
                if strict:  # OpenAI's strict-mode rules
                    check_strict_function(opt_dict(tool, "parameters", tpath), name, at(tpath, "parameters"))
            else:
                parameters = custom_tool_parameters()
                enforce = _custom_format(opt_dict(tool, "format", tpath), at(tpath, "format"))
            self.tools.append(ToolSpec(name, description, parameters, strict, enforce))
            self.tool_kinds[name] = ResponsesTool(kind, namespace)  # type: ignore[arg-type]


_APPLIED_TOOL_TYPES = frozenset({"function", "custom", *RESPONSES_CLIENT_TOOLS})


def applied_tools(tools: Any) -> list[Any]:
    """The `tools` the Response echoes: those offered to the model (functions, custom and client
    tools, namespaces of them). Hosted tools (web_search, file_search, …) are not offered, so they
    are not echoed as if they were; a namespace left with no tool is dropped."""
    out: list[Any] = []
    for tool in tools if isinstance(tools, list) else ():
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace":
            inner = applied_tools(tool.get("tools") or [])
            if inner:
                out.append({**tool, "tools": inner})
        elif kind in _APPLIED_TOOL_TYPES:
            out.append(tool)
    return out


def _shell_output(items: list[Any], path: str) -> str:
    """A shell call's per-command results as one text: stdout, stderr and how it ended."""
    parts: list[str] = []
    for i, raw in enumerate(items):
        ipath = at(path, i)
        result = expect_dict(raw, ipath)
        lines = [opt_str(result, "stdout", ipath) or "", opt_str(result, "stderr", ipath) or ""]
        outcome = opt_dict(result, "outcome", ipath)
        if outcome is not None:
            opath = at(ipath, "outcome")
            if opt_str(outcome, "type", opath) == "timeout":
                lines.append("(timed out)")
            else:
                code = opt_int(outcome, "exit_code", opath)
                if code is not None:
                    lines.append(f"(exit code {code})")
        parts.append("\n".join(line for line in lines if line))
    return "\n\n".join(parts)


def _custom_format(value: dict[str, Any] | None, path: str) -> dict[str, Any] | None:
    """A custom tool's `format`: `text` (free input), or a `grammar` (`regex` or `lark`) the
    constraint enforces on the input (`api/custom_format.py`)."""
    if value is None:
        return None
    kind = one_of(req_str(value, "type", path), ("text", "grammar"), at(path, "type"))
    if kind == "text":
        return None
    syntax = one_of(req_str(value, "syntax", path), SYNTAXES, at(path, "syntax"))
    return custom_input_schema(syntax, req_str(value, "definition", path), at(path, "definition"))


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
        mode = opt_str(choice, "mode", "tool_choice")
        mode = "auto" if mode is None else mode
        one_of(mode, ("auto", "required"), "tool_choice.mode")
        names: list[str] = []
        raw_tools = choice.get("tools")
        for i, raw in enumerate(expect_list(raw_tools, "tool_choice.tools") if raw_tools is not None else ()):
            tool = expect_dict(raw, at("tool_choice.tools", i))
            name = opt_str(tool, "name", at("tool_choice.tools", i))
            if name is None and tool.get("type") in RESPONSES_CLIENT_TOOLS:
                name = tool["type"]  # a client tool is named by its type
            if name is not None:
                names.append(name)
        return ToolChoice(mode, allowed=tuple(names) if raw_tools is not None else None)  # type: ignore[arg-type]
    if kind in RESPONSES_CLIENT_TOOLS:
        return ToolChoice("named", kind)  # {type: local_shell|shell|apply_patch}: that client tool
    # A hosted tool (web_search, …) runs on OpenAI's side: a forced call of it cannot be honoured.
    raise InvalidRequestError(
        f"Tool choice {kind!r} is a hosted tool that cannot run on this server.", param="tool_choice"
    )


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
                # both required by OpenAI
                check_depth(req_dict(raw, "schema", "text.format"), "text.format.schema"),
                req_str(raw, "name", "text.format", nonempty=True),
                opt_bool(raw, "strict", "text.format"),
            )
            if fmt.strict:
                check_strict_format(fmt.schema, fmt.name, "text.format.schema")
        elif kind == "json_object":
            fmt = ResponseFormat("json_object")
    return verbosity, fmt


def decode_responses(
    body: Any, *, signer: Signer, store: ResponseStore | None = None, scope: str = ""
) -> ResponsesRequest:
    """Decode a `POST /v1/responses` body (already parsed JSON). Raises only ApiError.
    `previous_response_id` is looked up under `scope` (the caller's API key) only."""
    b = expect_dict(body, "body")
    d = _Decoder(signer)
    model = req_name(b, "model", "")
    instructions = opt_str(b, "instructions", "")
    if instructions:
        d.system.append(Text(instructions))
    previous = opt_str(b, "previous_response_id", "")
    if previous is not None:
        history = store.get(previous, scope) if store is not None else None
        if history is None:
            raise InvalidRequestError(
                f"Previous response with id {previous!r} not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        d.system += store.system(previous, scope) if store is not None else ()
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
    d.add_tools(check_depth(b.get("tools"), "tools", max_depth=MAX_DEPTH + 2), "tools")

    reasoning = opt_dict(b, "reasoning", "") or {}
    effort = opt_str(reasoning, "effort", "reasoning")
    if effort is not None:
        one_of(effort, _EFFORTS, "reasoning.effort")
    summary = opt_str(reasoning, "summary", "reasoning")
    if summary is None:
        summary = opt_str(reasoning, "generate_summary", "reasoning")
    if summary is not None:
        one_of(summary, _SUMMARIES, "reasoning.summary")
    verbosity, fmt = _text(b.get("text"))
    include = str_list(b["include"], "include") if b.get("include") is not None else ()
    # Log-probabilities of the output text: asked for by the include value, or by `top_logprobs`
    # (alternatives per token; what OpenAI returns in `output_text.logprobs` with either).
    top_logprobs = opt_int(b, "top_logprobs", "", minimum=0, maximum=20)
    logprobs = top_logprobs if top_logprobs is not None else (0 if _INCLUDE_LOGPROBS in include else None)
    cache_key = opt_str(b, "prompt_cache_key", "")
    if cache_key is not None and len(cache_key) > 1024:
        raise InvalidRequestError("must be at most 1024 characters", param="prompt_cache_key")
    store_flag = opt_bool(b, "store", "")
    parallel = opt_bool(b, "parallel_tool_calls", "")
    truncation = opt_str(b, "truncation", "")
    if truncation is not None:
        one_of(truncation, ("auto", "disabled"), "truncation")
    metadata = openai_metadata(opt_dict(b, "metadata", ""), "metadata")
    nvext = parse_nvext(b.get("nvext"))
    if b.get("background"):
        raise InvalidRequestError("background responses are not supported", param="background")
    for key in ("conversation", "prompt"):
        if b.get(key) is not None:
            raise InvalidRequestError(f"{key} is not supported", param=key)
    for key in b:
        if (key not in _KNOWN_FIELDS or key in _IGNORED_FIELDS) and b[key] is not None:
            d.ignored.append(key)

    tool_choice = _tool_choice(b.get("tool_choice"))
    if tool_choice.mode == "required" and not d.tools:
        raise InvalidRequestError(
            "Tool choice 'required' must be specified with 'tools' parameter.", param="tool_choice"
        )
    for name in tool_choice.allowed or ():
        if name not in d.tool_kinds:
            raise InvalidRequestError(
                f"Tool choice {name!r} not found in 'tools' parameter.", param="tool_choice"
            )
    if tool_choice.mode == "named" and tool_choice.name not in d.tool_kinds:
        raise InvalidRequestError(
            f"Tool choice {tool_choice.name!r} not found in 'tools' parameter.", param="tool_choice"
        )
    if tool_choice.mode == "named" and tool_choice.name is not None:
        said, kind = b["tool_choice"]["type"], d.tool_kinds[tool_choice.name].kind
        if said in ("function", "custom") and kind in ("function", "custom") and said != kind:
            raise InvalidRequestError(
                f"Tool choice {said!r} names {tool_choice.name!r}, which is a {kind} tool.",
                param="tool_choice",
            )
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
        logprobs=logprobs,
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
        "tools": applied_tools(b.get("tools") or []),
        "top_logprobs": top_logprobs,
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
        truncation="auto" if truncation == "auto" else "disabled",
    )
