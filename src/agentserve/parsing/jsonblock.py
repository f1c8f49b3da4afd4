"""Tool blocks whose calls are JSON objects: one object, an array of them, or `;`-separated objects,
optionally closed by an end marker. Hermes (`<tool_call>{…}</tool_call>`), Nemotron
(`<TOOLCALL>[…]</TOOLCALL>`), Mistral (`[TOOL_CALLS] […]`) and Llama 3 JSON all use it.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentserve.conversation import OutputEvent
from agentserve.parsing.jsonstream import JsonCallObject
from agentserve.parsing.stream import BlockContext

_PRE, _OBJECT, _BETWEEN, _POST, _SKIP = range(5)
_WS = " \t\r\n"


class JsonCallsBlock:
    __slots__ = (
        "_args_keys",
        "_array",
        "_close",
        "_ctx",
        "_fed",
        "_name_first",
        "_name_keys",
        "_object",
        "_raw",
        "_separator",
        "_skipped",
        "_state",
        "done",
        "fallback",
        "reparse",
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
        self._fed: list[str] = []  # text fed to the current object (to recover from a broken one)
        self._skipped: list[str] = []  # text after a malformed call, while looking for its end marker
        self.done = False
        self.fallback = ""
        self.reparse = ""  # text after a broken call's end marker, for the driver to parse again

    def feed(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        n = len(buf)
        while i < n and not self.done:
            state = self._state
            if state == _OBJECT:
                obj = self._object
                assert obj is not None
                start = i
                i = obj.feed(buf, i, out)
                if self._close:
                    self._fed.append(buf[start:i])
                if obj.committed:
                    self._raw = None
                if obj.failed:
                    if obj.committed and self._close:
                        self._state = _SKIP  # the rest of the broken call is its text, not output
                        continue
                    return self._give_up(obj.raw, i)
                if obj.done:
                    self._state = _BETWEEN if self._array else _POST
                continue
            if state == _SKIP:
                return self._skip(buf, i)
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

    def _skip(self, buf: str, i: int) -> int:
        """After a malformed call: what runs to its end marker belongs to the broken call (no stray
        `</tool_call>` leaks as text). If the next call's opener or the end of output comes first, the
        model never closed the call: what followed it is text again."""
        close, opener = self._close, self._ctx.opener
        end = buf.find(close, i)
        nxt = buf.find(opener, i) if opener else -1
        if nxt >= 0 and (end < 0 or nxt < end):
            self.done = True
            self.fallback = "".join(self._skipped) + buf[i:nxt]
            return nxt
        if end >= 0:
            self.done = True
            self._skipped = []
            return end + len(close)
        n = len(buf)
        stop = n
        for j in range(max(i, n - max(len(close), len(opener)) + 1), n):
            if close.startswith(buf[j:]) or (opener and opener.startswith(buf[j:])):
                stop = j  # maybe a marker split across chunks: the driver holds it
                break
        self._skipped.append(buf[i:stop])
        return stop

    def _start_object(self) -> None:
        self._object = JsonCallObject(
            self._ctx.calls, self._name_keys, self._args_keys, name_first=self._name_first
        )
        self._state = _OBJECT
        self._fed = []

    def _give_up(self, consumed: str, i: int) -> int:
        """Not (or no longer) a call: uncommitted text goes back as output; the rest continues as output."""
        self.done = True
        self.fallback = "".join(self._raw) + consumed if self._raw is not None else consumed
        return i

    def _recover(self, out: list[OutputEvent]) -> bool:
        """The output ended inside a call whose JSON never closed. If the block's end marker came
        after it, the JSON was broken, not cut off: report the call `malformed` up to that marker and
        hand what follows back to the driver, so the calls after it survive (an unterminated string or
        object would otherwise swallow them)."""
        if not self._close or not self._ctx.calls.open:
            return False
        fed = "".join(self._fed)
        close, opener = self._close, self._ctx.opener
        split = -1
        at = fed.find(close)
        while at >= 0:  # prefer an end marker that the next call's opener follows
            if split < 0:
                split = at
            if opener and fed[at + len(close) :].lstrip().startswith(opener):
                split = at
                break
            at = fed.find(close, at + 1)
        if split < 0:
            return False
        self._ctx.calls.fail(
            "malformed", out, "tool call JSON is not closed before its end marker", fed[:split]
        )
        self.reparse = fed[split + len(close) :]
        return True

    def close(self, out: list[OutputEvent]) -> None:
        if self.done:
            return
        self.done = True
        if self._state == _SKIP:
            self.fallback = "".join(self._skipped)
            return
        obj = self._object
        pending = ""
        if self._state == _OBJECT and obj is not None and obj.committed and self._recover(out):
            return
        if self._state == _OBJECT and obj is not None:
            obj.eof(out)
            if not obj.committed:
                pending = obj.raw
        if self._raw is not None:
            self.fallback = "".join(self._raw) + pending
        else:
            self.fallback = pending
