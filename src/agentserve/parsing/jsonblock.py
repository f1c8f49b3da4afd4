"""Tool blocks whose calls are JSON objects: one object, an array of them, or `;`-separated objects,
optionally closed by an end marker. Hermes (`<tool_call>{…}</tool_call>`), Nemotron
(`<TOOLCALL>[…]</TOOLCALL>`), Mistral (`[TOOL_CALLS] […]`) and Llama 3 JSON all use it.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentserve.conversation import OutputEvent
from agentserve.parsing.jsonstream import JsonCallObject
from agentserve.parsing.stream import BlockContext

_PRE, _OBJECT, _BETWEEN, _POST = range(4)
_WS = " \t\r\n"


class JsonCallsBlock:
    __slots__ = (
        "_args_keys",
        "_array",
        "_close",
        "_ctx",
        "_name_first",
        "_name_keys",
        "_object",
        "_raw",
        "_separator",
        "_state",
        "done",
        "fallback",
    )

    def __init__(
        self,
        ctx: BlockContext,
        close: str = "",
        *,
        separator: str = "",
        name_keys: Sequence[str] = ("name",),
        args_keys: Sequence[str] = ("arguments", "parameters"),
        name_first: bool = False,
    ) -> None:
        self._ctx = ctx
        self._name_first = name_first
        self._close = close
        self._separator = separator
        self._name_keys = name_keys
        self._args_keys = args_keys
        self._state = _PRE
        self._array = False
        self._object: JsonCallObject | None = None
        # Text given back if the block turns out not to be a tool call; None once a call started.
        self._raw: list[str] | None = [ctx.opener]
        self.done = False
        self.fallback = ""

    def feed(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        n = len(buf)
        while i < n and not self.done:
            state = self._state
            if state == _OBJECT:
                obj = self._object
                assert obj is not None
                i = obj.feed(buf, i, out)
                if obj.committed:
                    self._raw = None
                if obj.failed:
                    return self._give_up(obj.raw, i)
                if obj.done:
                    self._state = _BETWEEN if self._array else _POST
                continue
            c = buf[i]
            if c in _WS:
                if self._raw is not None:
                    self._raw.append(c)
                i += 1
                continue
            if state == _PRE:
                if c == "[" and not self._array:
                    self._array = True
                    self._keep(c)
                    i += 1
                else:
                    self._start_object()
            elif state == _BETWEEN:
                if c == ",":
                    self._keep(c)
                    self._start_object()
                    i += 1
                elif c == "]":
                    self._keep(c)
                    self._state = _POST
                    i += 1
                else:
                    return self._give_up("", i)
            else:  # _POST: a separator, the end marker, or the end of the block
                if self._separator and c == self._separator:
                    self._keep(c)
                    self._start_object()
                    i += 1
                    continue
                close = self._close
                if close and buf.startswith(close, i):
                    self.done = True
                    return i + len(close)
                if close and close.startswith(buf[i:]):
                    return i  # maybe the end marker, split across chunks: wait for more
                self.done = True  # no end marker: what follows is ordinary output
                return i
        return i

    def _keep(self, text: str) -> None:
        if self._raw is not None:
            self._raw.append(text)

    def _start_object(self) -> None:
        self._object = JsonCallObject(
            self._ctx.calls, self._name_keys, self._args_keys, name_first=self._name_first
        )
        self._state = _OBJECT

    def _give_up(self, consumed: str, i: int) -> int:
        """Not (or no longer) a call: uncommitted text goes back as output; the rest continues as output."""
        self.done = True
        self.fallback = "".join(self._raw) + consumed if self._raw is not None else consumed
        return i

    def close(self, out: list[OutputEvent]) -> None:
        if self.done:
            return
        self.done = True
        obj = self._object
        pending = ""
        if self._state == _OBJECT and obj is not None:
            obj.eof(out)
            if not obj.committed:
                pending = obj.raw
        if self._raw is not None:
            self.fallback = "".join(self._raw) + pending
        else:
            self.fallback = pending
