"""Anthropic `context_management.edits`: history edits applied before the prompt is rendered.

As platform.claude.com documents context editing (beta `context-management-2025-06-27`; field names
from anthropic-sdk-python `types/beta/beta_clear_tool_uses_20250919_edit_param.py`,
`beta_clear_thinking_20251015_edit_param.py`, `beta_context_management_response.py`):

- `clear_tool_uses_20250919`: once the prompt passes `trigger` (default 100,000 input tokens; or a
  number of tool uses), the oldest tool results are replaced by a placeholder, keeping the `keep`
  most recent tool uses (default 3) and every use of `exclude_tools`; `clear_tool_inputs` also
  empties the calls' inputs (all, or of the listed tools); `clear_at_least` applies the edit only if
  it clears at least that many input tokens.
- `clear_thinking_20251015`: thinking blocks are kept for the `keep` most recent assistant turns
  (`{type: thinking_turns, value: N}`, default 1) or `"all"`.

The client keeps its full history; the response reports `context_management.applied_edits` with
`cleared_input_tokens` and `cleared_tool_uses` / `cleared_thinking_turns`. Pure functions: the
frontend passes the token counter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from agentserve.api._check import at, expect_dict, expect_list, one_of, opt_int, req_str, wrong_type
from agentserve.api.errors import InvalidRequestError
from agentserve.conversation import Conversation, Message, Part, Reasoning, Text, ToolCall, ToolResult

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
DEFAULT_TRIGGER_TOKENS = 100_000
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING_TURNS = 1
# What a cleared result reads as, so the model knows the output existed and was removed.
CLEARED_RESULT = "[tool result cleared to save context]"


@dataclass(frozen=True, slots=True)
class ClearToolUses:
    trigger: Literal["input_tokens", "tool_uses"] = "input_tokens"
    trigger_value: int = DEFAULT_TRIGGER_TOKENS
    keep: int = DEFAULT_KEEP_TOOL_USES
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    clear_inputs: bool | frozenset[str] = False


@dataclass(frozen=True, slots=True)
class ClearThinking:
    keep: int | None = DEFAULT_KEEP_THINKING_TURNS  # None: all


Edit = ClearToolUses | ClearThinking


@dataclass(frozen=True, slots=True)
class ContextManagement:
    edits: tuple[Edit, ...] = ()


@dataclass(frozen=True, slots=True)
class AppliedEdit:
    type: str
    cleared_input_tokens: int
    cleared: int  # tool uses or thinking turns

    def to_json(self) -> dict[str, Any]:
        key = "cleared_tool_uses" if self.type == CLEAR_TOOL_USES else "cleared_thinking_turns"
        return {"type": self.type, "cleared_input_tokens": self.cleared_input_tokens, key: self.cleared}


def applied_json(edits: tuple[AppliedEdit, ...]) -> dict[str, Any]:
    return {"applied_edits": [e.to_json() for e in edits]}


# -- decoding -------------------------------------------------------------------------------------


def _counted(value: Any, path: str, kinds: tuple[str, ...]) -> tuple[str, int]:
    spec = expect_dict(value, path)
    kind = one_of(req_str(spec, "type", path), kinds, at(path, "type"))
    amount = opt_int(spec, "value", path, minimum=0)
    if amount is None:
        raise InvalidRequestError("field required", param=at(path, "value"))
    return kind, amount


def _names(value: Any, path: str) -> frozenset[str]:
    out = []
    for i, name in enumerate(expect_list(value, path)):
        if type(name) is not str:
            raise wrong_type(at(path, i), "a string", name)
        out.append(name)
    return frozenset(out)


def _clear_tool_uses(edit: dict[str, Any], path: str) -> ClearToolUses:
    out = ClearToolUses()
    if edit.get("trigger") is not None:
        kind, amount = _counted(edit["trigger"], at(path, "trigger"), ("input_tokens", "tool_uses"))
        out = replace(out, trigger=kind, trigger_value=amount)  # type: ignore[arg-type]
    if edit.get("keep") is not None:
        out = replace(out, keep=_counted(edit["keep"], at(path, "keep"), ("tool_uses",))[1])
    if edit.get("clear_at_least") is not None:
        amount = _counted(edit["clear_at_least"], at(path, "clear_at_least"), ("input_tokens",))[1]
        out = replace(out, clear_at_least=amount)
    if edit.get("exclude_tools") is not None:
        out = replace(out, exclude_tools=_names(edit["exclude_tools"], at(path, "exclude_tools")))
    inputs = edit.get("clear_tool_inputs")
    if type(inputs) is bool:
        out = replace(out, clear_inputs=inputs)
    elif inputs is not None:
        out = replace(out, clear_inputs=_names(inputs, at(path, "clear_tool_inputs")))
    return out


def _clear_thinking(edit: dict[str, Any], path: str) -> ClearThinking:
    keep = edit.get("keep")
    if keep is None:
        return ClearThinking()
    if keep == "all":
        return ClearThinking(None)
    kpath = at(path, "keep")
    spec = expect_dict(keep, kpath)
    if req_str(spec, "type", kpath) == "all":
        return ClearThinking(None)
    return ClearThinking(_counted(spec, kpath, ("thinking_turns",))[1])


def parse_context_management(value: Mapping[str, Any] | None, path: str) -> ContextManagement | None:
    """The edits of a request's `context_management` (None: none asked). An edit type that is not
    implemented is a 400 naming it."""
    if value is None:
        return None
    raw = value.get("edits")
    if raw is None:
        return ContextManagement()
    edits: list[Edit] = []
    for i, item in enumerate(expect_list(raw, at(path, "edits"))):
        epath = at(at(path, "edits"), i)
        edit = expect_dict(item, epath)
        kind = req_str(edit, "type", epath)
        if kind == CLEAR_TOOL_USES:
            edits.append(_clear_tool_uses(edit, epath))
        elif kind == CLEAR_THINKING:
            edits.append(_clear_thinking(edit, epath))
        else:
            raise InvalidRequestError(
                f"context edit {kind!r} is not supported: use {CLEAR_TOOL_USES} or {CLEAR_THINKING}",
                param=at(epath, "type"),
            )
    return ContextManagement(tuple(edits))


# -- applying -------------------------------------------------------------------------------------


def _tool_uses(conversation: Conversation) -> list[ToolCall]:
    return [p for m in conversation.messages for p in m.parts if isinstance(p, ToolCall)]


def _clear_tools(conversation: Conversation, edit: ClearToolUses) -> tuple[Conversation, int]:
    """The conversation with the oldest tool uses' results cleared; how many uses were cleared."""
    calls = [c for c in _tool_uses(conversation) if c.name not in edit.exclude_tools]
    oldest = calls[: max(0, len(calls) - edit.keep)]
    ids = {c.id for c in oldest}
    if not ids:
        return conversation, 0

    def clear_inputs(call: ToolCall) -> bool:
        if isinstance(edit.clear_inputs, bool):
            return edit.clear_inputs
        return call.name in edit.clear_inputs

    messages: list[Message] = []
    for message in conversation.messages:
        parts: list[Part] = []
        for part in message.parts:
            if isinstance(part, ToolResult) and part.call_id in ids:
                part = replace(part, content=(Text(CLEARED_RESULT),))
            elif isinstance(part, ToolCall) and part.id in ids and clear_inputs(part):
                part = replace(part, arguments="{}")
            parts.append(part)
        messages.append(Message(message.role, tuple(parts)))
    return replace(conversation, messages=tuple(messages)), len(ids)


def _clear_thinking_turns(conversation: Conversation, keep: int | None) -> tuple[Conversation, int]:
    if keep is None:
        return conversation, 0
    thinking = [
        i for i, m in enumerate(conversation.messages) if any(isinstance(p, Reasoning) for p in m.parts)
    ]
    cleared = set(thinking[: max(0, len(thinking) - keep)])
    if not cleared:
        return conversation, 0
    messages = tuple(
        Message(m.role, tuple(p for p in m.parts if not isinstance(p, Reasoning))) if i in cleared else m
        for i, m in enumerate(conversation.messages)
    )
    return replace(conversation, messages=messages), len(cleared)


def apply_edits(
    conversation: Conversation, management: ContextManagement, count: Callable[[Conversation], int]
) -> tuple[Conversation, tuple[AppliedEdit, ...]]:
    """Apply the edits in order to the history; `count` is the prompt's token count of a
    conversation (called only when an edit needs it: Claude Code's `keep: all` costs nothing). An
    edit that clears nothing (or less than `clear_at_least`) is not applied."""
    applied: list[AppliedEdit] = []
    known: int | None = None

    def tokens() -> int:
        nonlocal known
        if known is None:
            known = count(conversation)
        return known

    for edit in management.edits:
        if isinstance(edit, ClearThinking):
            edited, cleared = _clear_thinking_turns(conversation, edit.keep)
            kind = CLEAR_THINKING
        else:
            if edit.trigger == "tool_uses":
                reached = len(_tool_uses(conversation)) > edit.trigger_value
            else:
                reached = tokens() > edit.trigger_value
            if not reached:
                continue
            edited, cleared = _clear_tools(conversation, edit)
            kind = CLEAR_TOOL_USES
        if cleared == 0:
            continue
        before, after = tokens(), count(edited)
        if isinstance(edit, ClearToolUses) and before - after < edit.clear_at_least:
            continue  # not worth breaking the cache for
        applied.append(AppliedEdit(kind, max(0, before - after), cleared))
        conversation, known = edited, after
    return conversation, tuple(applied)
