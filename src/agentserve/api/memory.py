"""A bounded server-side memory of recent assistant turns, keyed by their tool-call ids.

Chat Completions clients often drop `reasoning_content` from history and re-serialise tool arguments
(pi and OpenClaw send `{"command":"echo hello"}` for the model's `{"command": "echo hello"}`; OpenClaw
even strips `_` from call ids). Anthropic clients send `input` as an object. Either way the next
prompt would differ from what the model produced and the KV cache would be lost from that point.
When a history message still describes the same turn (same calls, equal arguments, same text), the
decoder swaps in the turn exactly as the model produced it.

Keys are the call ids with everything but letters and digits removed (so rewritten ids still match),
under a caller-chosen `scope`. The frontend's scope is the API key's digest *and* the conversation
(`call_scope`: the session id from a header or the body, else the conversation's derived key), so
one client never gets another's turn, and two conversations of one client never get each other's:
native ids repeat across conversations (Kimi's `functions.NAME:IDX`), and a Chat client that drops
reasoning would otherwise get back the reasoning of whichever conversation made the same visible
call last. That is why restoring is a pass over the decoded history (`restore_history`), run once
the request's identity is known, not part of decoding. Not thread-safe: one per event loop.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any

from agentserve.conversation import Message, Reasoning, Text, ToolCall, ToolResult

_NOT_ALNUM = re.compile(r"[^0-9A-Za-z]+")


def call_scope(api_scope: str, session: str | None) -> str:
    """The memory scope of a request: its API key's digest and its conversation's identity.
    ("#" cannot occur in a key digest, so two (scope, session) pairs never collide.)"""
    return api_scope if session is None else api_scope + "#" + session


def _key(scope: str, call_id: str) -> str:
    return scope + "\0" + _NOT_ALNUM.sub("", call_id)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_JSON


_NOT_JSON = object()


def same_arguments(remembered: str, value: Any) -> bool:
    """`value` (a parsed object, or JSON text) means the same arguments as `remembered`."""
    if isinstance(value, str):
        if value == remembered:
            return True
        value = _loads(value)
    return value is not _NOT_JSON and _loads(remembered) == value


# Turns kept per call id. Our ids are random, but native ones repeat across conversations (Kimi's
# `functions.NAME:IDX`): two concurrent conversations must not evict each other's turns.
_PER_ID = 4


class CallMemory:
    __slots__ = ("_max", "_turns")

    def __init__(self, max_turns: int = 4096) -> None:
        self._max = max_turns
        self._turns: OrderedDict[str, tuple[Message, ...]] = OrderedDict()  # newest first

    def __len__(self) -> int:
        return len(self._turns)

    def remember(self, message: Message, scope: str = "") -> None:
        """Keep an assistant turn that made calls (turns without calls cannot be found again)."""
        for call in message.tool_calls:
            key = _key(scope, call.id)
            older = self._turns.pop(key, ())
            self._turns[key] = (message, *(t for t in older if t != message))[:_PER_ID]
        while len(self._turns) > self._max:
            self._turns.popitem(last=False)

    def _candidates(self, call_id: str, scope: str) -> tuple[Message, ...]:
        if not self._turns:
            return ()
        key = _key(scope, call_id)
        turns = self._turns.get(key, ())
        if turns:
            self._turns.move_to_end(key)
        return turns

    def turn(self, call_id: str, scope: str = "") -> Message | None:
        """The newest turn remembered under this call id."""
        turns = self._candidates(call_id, scope)
        return turns[0] if turns else None

    def call(self, call_id: str, scope: str = "") -> ToolCall | None:
        message = self.turn(call_id, scope)
        return _call_in(message, _key(scope, call_id), scope) if message is not None else None

    def restore_arguments(self, call_id: str, name: str, value: Any, scope: str = "") -> str | None:
        """The exact arguments text the model wrote for this call, if `value` still means it."""
        wanted = _key(scope, call_id)
        for message in self._candidates(call_id, scope):
            call = _call_in(message, wanted, scope)
            if call is not None and call.name == name and same_arguments(call.arguments, value):
                return call.arguments
        return None

    def restore_turn(self, sent: Message, sent_reasoning: str | None, scope: str = "") -> Message | None:
        """The remembered turn that `sent` (a flattened echo of it) describes, or None.

        `sent` carries the client's calls and text; `sent_reasoning` is its flat reasoning field
        (None or "" when dropped), which must otherwise hold the remembered segments in order,
        joined by whitespace of any kind (`same_reasoning`). All-or-nothing: an edited turn is the
        client's to keep.
        """
        calls = sent.tool_calls
        if not calls:
            return None
        for turn in self._candidates(calls[0].id, scope):
            if _same_turn(turn, sent, sent_reasoning, scope):
                return turn
        return None


def _call_in(message: Message, wanted: str, scope: str) -> ToolCall | None:
    for call in message.tool_calls:
        if _key(scope, call.id) == wanted:
            return call
    return None


def _same_turn(turn: Message, sent: Message, sent_reasoning: str | None, scope: str) -> bool:
    """`sent` (a client's flattened echo) describes `turn`: the same calls, text and reasoning."""
    calls = sent.tool_calls
    mine = turn.tool_calls
    if len(mine) != len(calls):
        return False
    for a, b in zip(mine, calls, strict=True):
        if _key(scope, a.id) != _key(scope, b.id) or a.name != b.name:
            return False
        if not same_arguments(a.arguments, b.arguments):
            return False
    if "".join(p.text for p in turn.parts if isinstance(p, Text)).strip() != sent.text.strip():
        return False
    return not sent_reasoning or same_reasoning(
        [p.text for p in turn.parts if isinstance(p, Reasoning)], sent_reasoning
    )


def same_reasoning(segments: list[str], flat: str) -> bool:
    """`flat` is `segments` in order, each trimmed, joined by whitespace-only separators.

    Clients join interleaved segments their own way (our encoder writes "\n\n", pi echoes that,
    OpenClaw writes "\n\n\n", others trim), so only the segments' text has to match.
    """
    pos = _skip_space(flat, 0)
    for segment in segments:
        text = segment.strip()
        if not text:
            continue
        if not flat.startswith(text, pos):
            return False
        pos = _skip_space(flat, pos + len(text))
    return pos == len(flat)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def restore_history(
    messages: tuple[Message, ...], memory: CallMemory, scope: str, *, whole_turns: bool
) -> tuple[tuple[Message, ...], int]:
    """`messages` with every assistant turn the memory recognises put back as the model produced it,
    and how many calls were restored.

    `whole_turns` (Chat Completions: reasoning dropped or flattened, ids rewritten): a turn is
    swapped whole (`restore_turn`) and later tool results follow its ids. Otherwise (Anthropic: the
    turn's blocks are all there, `input` re-serialised): each call gets its exact arguments text.
    """
    out: list[Message] = []
    id_map: dict[str, str] = {}  # client's call id -> ours, for restored turns
    restored = 0
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            if whole_turns:
                flat = "".join(p.text for p in message.parts if isinstance(p, Reasoning))
                turn = memory.restore_turn(message, flat or None, scope)
                if turn is not None:
                    for sent, mine in zip(message.tool_calls, turn.tool_calls, strict=True):
                        id_map[sent.id] = mine.id
                    restored += len(turn.tool_calls)
                    message = turn
            else:
                parts = list(message.parts)
                for i, part in enumerate(parts):
                    if isinstance(part, ToolCall):
                        exact = memory.restore_arguments(part.id, part.name, part.arguments, scope)
                        if exact is not None:
                            restored += 1
                            if exact != part.arguments:
                                parts[i] = ToolCall(part.id, part.name, exact)
                message = Message(message.role, tuple(parts)) if parts != list(message.parts) else message
        elif id_map and message.role == "tool":
            message = Message(
                message.role,
                tuple(
                    ToolResult(id_map.get(p.call_id, p.call_id), p.content, p.is_error, p.name)
                    if isinstance(p, ToolResult)
                    else p
                    for p in message.parts
                ),
            )
        out.append(message)
    return tuple(out), restored
