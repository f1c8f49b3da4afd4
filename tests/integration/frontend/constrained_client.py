"""One request per API through the official SDKs, as (text, [(tool name, arguments)]), streamed or
not (the constrained-decoding integration tests)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import anthropic
import openai
from stack import Served

# Strict-mode conformant (OpenAI refuses a strict schema without `additionalProperties: false`).
BASH_SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
    "additionalProperties": False,
}
READ_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
    "additionalProperties": False,
}
Specs = Sequence[tuple[str, dict[str, Any]]]
TOOLS: Specs = (("Bash", BASH_SCHEMA), ("Read", READ_SCHEMA))


def anthropic_turn(s: Served, stream: bool, prompt: str, **kw: Any) -> tuple[str, list[tuple[str, Any]]]:
    c = anthropic.Anthropic(base_url=s.url, api_key="k", max_retries=0)
    request: dict[str, Any] = {"model": "claude-x", "max_tokens": kw.pop("max_tokens", 600)}
    request["messages"] = [{"role": "user", "content": prompt}]
    request.update(kw)
    if stream:
        with c.messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = c.messages.create(**request)
    text = "".join(b.text for b in message.content if b.type == "text")
    calls = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    return text, calls


def chat_turn(s: Served, stream: bool, prompt: str, **kw: Any) -> tuple[str, list[tuple[str, Any]]]:
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
    messages = [{"role": "user", "content": prompt}]
    if not stream:
        message = c.chat.completions.create(model="m", messages=messages, **kw).choices[0].message  # type: ignore[arg-type]
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in message.tool_calls or []]  # type: ignore[union-attr]
        return message.content or "", calls
    text = ""
    parts: dict[int, list[str]] = {}
    for chunk in c.chat.completions.create(model="m", messages=messages, stream=True, **kw):  # type: ignore[arg-type]
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for t in delta.tool_calls or []:
            entry = parts.setdefault(t.index, ["", ""])
            if t.function is not None:
                entry[0] += t.function.name or ""
                entry[1] += t.function.arguments or ""
    return text, [(name, json.loads(args)) for name, args in parts.values()]


def responses_turn(s: Served, stream: bool, prompt: str, **kw: Any) -> tuple[str, list[tuple[str, Any]]]:
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
    if stream:
        with c.responses.stream(model="m", input=prompt, **kw) as events:
            response = events.get_final_response()
    else:
        response = c.responses.create(model="m", input=prompt, **kw)
    calls = [(o.name, json.loads(o.arguments)) for o in response.output if o.type == "function_call"]
    return response.output_text, calls


def chat_tools(
    strict: bool = False, tools: Sequence[tuple[str, dict[str, Any]]] = TOOLS
) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": n, "parameters": p, **({"strict": True} if strict else {})}}
        for n, p in tools
    ]


def responses_tools(
    strict: bool = False, tools: Sequence[tuple[str, dict[str, Any]]] = TOOLS
) -> list[dict[str, Any]]:
    return [{"type": "function", "name": n, "parameters": p, "strict": strict} for n, p in tools]


def anthropic_tools(
    strict: bool = False, tools: Sequence[tuple[str, dict[str, Any]]] = TOOLS
) -> list[dict[str, Any]]:
    return [{"name": n, "input_schema": p, **({"strict": True} if strict else {})} for n, p in tools]
