"""A plain JSON form of a Conversation, for the CLIs and fixtures (not an HTTP API).

    {"system": "text" | ["text", …],
     "tools": [{"name", "description", "parameters"}],
     "messages": [{"role": "system|user|assistant|tool", "content": "text" | [part, …],
                   "reasoning_content" | "reasoning": "text"  (assistant shorthand: reasoning first)}]}

Parts: `{"type": "text", "text"}`, `{"type": "reasoning", "text", "signature"?}`,
`{"type": "tool_call", "id", "name", "arguments": {…} | "json text"}`,
`{"type": "tool_result", "call_id", "content": "text" | [part, …], "is_error"?, "name"?}`,
`{"type": "image", "media_type"?, "data"?, "url"?}`. Arguments given as an object are serialised the
way `json.dumps` does by default, the form models are trained to write.
"""

from __future__ import annotations

import json
from typing import Any, cast, get_args

from agentserve.conversation import (
    Conversation,
    Image,
    Message,
    Part,
    Reasoning,
    Role,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from agentserve.prompt.template import PromptError


class RequestFormatError(PromptError):
    pass


def conversation_from_json(data: Any) -> Conversation:
    if not isinstance(data, dict):
        raise RequestFormatError("a conversation must be a JSON object")
    system = data.get("system") or []
    if isinstance(system, str):
        system = [system]
    tools = [_tool(t) for t in data.get("tools") or []]
    messages = [_message(m) for m in data.get("messages") or []]
    return Conversation(tuple(Text(_str(s, "system")) for s in system), tuple(messages), tuple(tools))


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise RequestFormatError(f"{what} must be a string")
    return value


def _tool(t: Any) -> ToolSpec:
    if not isinstance(t, dict) or "name" not in t:
        raise RequestFormatError("each tool needs a name")
    params = t.get("parameters", t.get("input_schema", {}))
    return ToolSpec(_str(t["name"], "tool name"), str(t.get("description", "")), dict(params or {}))


def _message(m: Any) -> Message:
    if not isinstance(m, dict) or m.get("role") not in get_args(Role):
        raise RequestFormatError("each message needs a role: system, user, assistant or tool")
    content = m.get("content") or []
    parts: list[Part] = [Text(content)] if isinstance(content, str) else [_part(p) for p in content]
    reasoning = m.get("reasoning_content", m.get("reasoning"))
    if reasoning:
        parts.insert(0, Reasoning(_str(reasoning, "reasoning")))
    return Message(cast(Role, m["role"]), tuple(parts))


def _part(p: Any) -> Part:
    if not isinstance(p, dict):
        raise RequestFormatError("each content part must be an object")
    kind = p.get("type")
    if kind == "text":
        return Text(_str(p.get("text"), "text"))
    if kind == "reasoning":
        return Reasoning(_str(p.get("text"), "reasoning text"), p.get("signature"))
    if kind == "tool_call":
        args = p.get("arguments", {})
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return ToolCall(_str(p.get("id"), "tool_call id"), _str(p.get("name"), "tool_call name"), text)
    if kind == "tool_result":
        content = p.get("content", "")
        items = [Text(content)] if isinstance(content, str) else [_part(c) for c in content]
        for item in items:
            if not isinstance(item, Text | Image):
                raise RequestFormatError("tool_result content holds text and images only")
        return ToolResult(
            _str(p.get("call_id"), "tool_result call_id"),
            tuple(cast(list[Text | Image], items)),
            bool(p.get("is_error", False)),
            str(p.get("name", "")),
        )
    if kind == "image":
        return Image(str(p.get("media_type", "")), str(p.get("data", "")), str(p.get("url", "")))
    raise RequestFormatError(f"unknown content part type {kind!r}")


def conversation_to_json(conversation: Conversation) -> dict[str, Any]:
    return {
        "system": [t.text for t in conversation.system],
        "tools": [
            {"name": t.name, "description": t.description, "parameters": t.parameters}
            for t in conversation.tools
        ],
        "messages": [
            {"role": m.role, "content": [_part_to_json(p) for p in m.parts]} for m in conversation.messages
        ],
    }


def _part_to_json(p: Part) -> dict[str, Any]:
    match p:
        case Text(text):
            return {"type": "text", "text": text}
        case Reasoning(text, signature):
            out: dict[str, Any] = {"type": "reasoning", "text": text}
            if signature is not None:
                out["signature"] = signature
            return out
        case ToolCall(call_id, name, arguments):
            return {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}
        case ToolResult(call_id, content, is_error, name):
            return {
                "type": "tool_result",
                "call_id": call_id,
                "content": [_part_to_json(c) for c in content],
                "is_error": is_error,
                "name": name,
            }
        case Image(media_type, data, url):
            return {"type": "image", "media_type": media_type, "data": data, "url": url}
    raise TypeError(f"not a Part: {p!r}")
