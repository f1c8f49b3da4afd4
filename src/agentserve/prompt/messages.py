"""Conversation → the `messages` and `tools` a Hugging Face chat template reads.

What real templates need, done once here:
- one leading system message (the system parts, plus system messages before the first other message);
  later system messages stay system where the family's markup allows it (Claude Code sends one as
  the second message), else they become user text;
- tool results as `tool` messages (`tool_call_id`, `name`, text content) in conversation order, each
  template writing them in its family's role; a user message's text after its tool results (Claude
  Code's `<system-reminder>`) follows as a user message;
- consecutive messages of the same role merged (assistant parts concatenate; texts join);
- assistant turns split into runs with reasoning placed by the replay mode (see `replay`);
- tool-call arguments as `ToolArguments` (a dict that renders back as the model's JSON text);
- tool-call ids in the family's native form where its templates need one (Kimi `functions.NAME:IDX`,
  Mistral 9 alphanumerics), applied to the calls and to the results that answer them.

Images are refused with `UnsupportedContentError` (the frontend answers 400): no family here is served
with a vision encoder, and dropping an image silently would answer a question the user did not ask.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

import xxhash

from agentserve.conversation import (
    Conversation,
    Image,
    Message,
    Part,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from agentserve.prompt.markup import FamilyMarkup, ToolCallIds
from agentserve.prompt.replay import PART_SEPARATOR, ReplayMode, assistant_runs, kept_reasoning
from agentserve.prompt.template import PromptError, ToolArguments

MESSAGE_SEPARATOR = "\n\n"  # between the texts of merged consecutive messages
# A failed tool call's result (Anthropic `is_error`, a failed Responses patch): no family template has
# a field for it, so the text says it; `is_error` is also passed for model templates that read one.
TOOL_ERROR_MARKER = "[tool error] "

TemplateMessage = dict[str, Any]


class UnsupportedContentError(PromptError):
    """The request carries content the model cannot take (images to a text-only model)."""


def template_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def template_messages(
    conversation: Conversation,
    markup: FamilyMarkup,
    mode: ReplayMode,
    reasoning_keys: Sequence[str] = ("reasoning_content",),
    keep_chat_reasoning: bool = False,
) -> list[TemplateMessage]:
    messages = _merge_assistants(conversation.messages)
    keep = kept_reasoning(messages, keep_chat_reasoning)
    ids = _native_ids(messages, markup.tool_call_ids)
    names = {c.id: c.name for m in messages for c in m.tool_calls}

    system = [p.text for p in conversation.system]
    first = 0
    while first < len(messages) and messages[first].role == "system":
        system.extend(_texts(messages[first].parts))
        first += 1
    out: list[TemplateMessage] = []
    if any(system):
        out.append({"role": "system", "content": PART_SEPARATOR.join(t for t in system if t)})
    leading = len(out)  # never merge later text into the system prompt

    def add_text(role: str, texts: list[str]) -> None:
        text = PART_SEPARATOR.join(texts)
        if len(out) > leading and out[-1]["role"] == role:
            out[-1]["content"] += MESSAGE_SEPARATOR + text
        else:
            out.append({"role": role, "content": text})

    for index in range(first, len(messages)):
        message = messages[index]
        if message.role == "assistant":
            out += _assistant(message, markup, mode if keep[index] else "drop", ids, reasoning_keys)
            continue
        role = "system" if message.role == "system" and markup.system_anywhere else "user"
        pending: list[str] = []
        for part in message.parts:
            if isinstance(part, ToolResult):
                if pending:
                    add_text(role, pending)
                    pending = []
                out.append(_tool_result(part, ids, names))
            else:
                pending += _texts((part,))
        if pending:
            add_text(role, pending)
    return out


def _texts(parts: Sequence[Part]) -> list[str]:
    texts: list[str] = []
    for part in parts:
        if isinstance(part, Image):
            raise UnsupportedContentError("this model takes text only; the request contains an image")
        if isinstance(part, Text):
            texts.append(part.text)
    return texts


def _merge_assistants(messages: Sequence[Message]) -> list[Message]:
    """Consecutive assistant messages are one turn: concatenate their parts."""
    merged: list[Message] = []
    for m in messages:
        if merged and m.role == "assistant" and merged[-1].role == "assistant":
            merged[-1] = Message("assistant", (*merged[-1].parts, *m.parts))
        else:
            merged.append(m)
    return merged


def _assistant(
    message: Message,
    markup: FamilyMarkup,
    mode: ReplayMode,
    ids: dict[str, str],
    reasoning_keys: Sequence[str],
) -> list[TemplateMessage]:
    if any(isinstance(p, Image) for p in message.parts):
        raise UnsupportedContentError("assistant messages cannot carry images for this model")
    out: list[TemplateMessage] = []
    for run in assistant_runs(message.parts):
        content = run.text
        entry: TemplateMessage = {"role": "assistant", "content": content}
        if run.reasoning is not None and mode == "native":
            for key in reasoning_keys:
                entry[key] = run.reasoning
        elif run.reasoning is not None and mode == "inject":
            entry["content"] = markup.think_block(run.reasoning) + content
        if run.calls:
            entry["tool_calls"] = [_tool_call(c, ids) for c in run.calls]
        if entry["content"] or len(entry) > 2:
            out.append(entry)
    return out or [{"role": "assistant", "content": ""}]


def _tool_call(call: ToolCall, ids: dict[str, str]) -> dict[str, Any]:
    raw = call.arguments if call.arguments.strip() else "{}"
    return {
        "id": ids.get(call.id, call.id),
        "type": "function",
        "function": {"name": call.name, "arguments": ToolArguments(call.arguments_dict(), raw)},
    }


def _tool_result(result: ToolResult, ids: dict[str, str], names: dict[str, str]) -> TemplateMessage:
    texts: list[str] = []
    for part in result.content:
        if isinstance(part, Image):
            raise UnsupportedContentError("this model takes text only; a tool result contains an image")
        texts.append(part.text)
    content = PART_SEPARATOR.join(texts)
    message: TemplateMessage = {
        "role": "tool",
        "tool_call_id": ids.get(result.call_id, result.call_id),
        "name": result.name or names.get(result.call_id, ""),
        "content": TOOL_ERROR_MARKER + content if result.is_error else content,
    }
    if result.is_error:
        message["is_error"] = True
    return message


# -- native tool-call ids ---------------------------------------------------------------------------

_KIMI_ID = re.compile(r"functions\.[^:\s]+:\d+")
_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_BASE62 = string.digits + string.ascii_letters


def _native_ids(messages: Sequence[Message], style: ToolCallIds) -> dict[str, str]:
    """Map each tool-call id that is not in the family's native form to one that is (deterministic,
    so the same history always renders the same ids)."""
    if style == "keep":
        return {}
    mapping: dict[str, str] = {}
    ordinal = 0
    for m in messages:
        for call in m.tool_calls:
            if style == "kimi" and not _KIMI_ID.fullmatch(call.id):
                # Kimi's index is a running count of calls across the conversation.
                mapping[call.id] = f"functions.{call.name}:{ordinal}"
            elif style == "mistral" and not _MISTRAL_ID.fullmatch(call.id):
                mapping[call.id] = _mistral_id(call.id)
            ordinal += 1
    return mapping


def _mistral_id(call_id: str) -> str:
    n = xxhash.xxh3_64_intdigest(call_id.encode())
    digits = []
    for _ in range(9):
        n, r = divmod(n, 62)
        digits.append(_BASE62[r])
    return "".join(digits)
