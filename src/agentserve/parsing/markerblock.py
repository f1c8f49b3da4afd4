"""Tool blocks driven by a family's special tokens (Kimi K2's section, DeepSeek's tool-call block).

Inside such a block the model writes special tokens (single tokens, never part of argument text)
and text between them. `MarkerBlock.feed` is the one loop: find the next marker (or the start of a
possible one, held back), hand the text before it to `_text`, then the marker to `_marker`.
`SpecialTokenCalls` is the state machine such blocks share (between calls, head, arguments); the
family's subclass is only its head.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import IntEnum
from typing import ClassVar

from agentserve.conversation import OutputEvent
from agentserve.parsing.delimited import WHITESPACE, DelimitedArgs
from agentserve.parsing.scanner import MarkerSet
from agentserve.parsing.stream import BlockContext


class MarkerBlock(ABC):
    __slots__ = ()

    markers: ClassVar[MarkerSet]
    done: bool
    fallback: str

    def feed(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        n = len(buf)
        markers = self.markers
        while i < n and not self.done:
            m = markers.search(buf, i)
            end = m.start() if m is not None else markers.hold_from(buf, i)
            while i < end and not self.done:
                i = self._text(buf, i, end, out)
            if self.done or m is None:
                return i  # done, or a partial marker the driver holds until more text arrives
            i = self._marker(m.group(), m.start(), m.end(), out)
        return i

    @abstractmethod
    def _text(self, buf: str, i: int, end: int, out: list[OutputEvent]) -> int:
        """Consume text of the current state from `buf[i:end]`; return where it stopped."""

    @abstractmethod
    def _marker(self, marker: str, start: int, end: int, out: list[OutputEvent]) -> int:
        """Act on `marker` found at `buf[start:end]`; return where to continue."""


class CallState(IntEnum):
    """Where a block of special-token calls stands. A family's finer steps inside the head (DeepSeek
    V3's type, name line and code fence) are its own."""

    BETWEEN = 0  # before, between or after calls: only markers and whitespace belong here
    HEAD = 1  # after the call's opening marker: its name or id, up to the arguments
    ARGS = 2  # the arguments, streamed up to the call's end marker


BETWEEN, HEAD, ARGS = CallState.BETWEEN, CallState.HEAD, CallState.ARGS


class SpecialTokenCalls(MarkerBlock):
    """A block of calls, each between `call_begin` and `call_end`, the arguments up to the end marker
    (`DelimitedArgs`), the block closed by one of `closers` (Kimi K2's section, DeepSeek's tool-call
    block). The base keeps what every such block does between calls and inside arguments, and what is
    given back when the text turns out not to be a call; a family writes only its head: `_head_text`
    and `_head_marker`."""

    __slots__ = ("_args", "_calls", "_head", "_in_preamble", "_raw", "_state", "done", "fallback")
    call_begin: ClassVar[str]
    call_end: ClassVar[str]
    openers: ClassVar[frozenset[str]]  # the block's own opener, repeated: kept as text
    closers: ClassVar[frozenset[str]]  # end the block (and the call in it)
    # The family skips text between a call's head and its arguments (`_preamble_text`); without one
    # (the default) argument text goes straight to the arguments' writer.
    preamble: ClassVar[bool] = False

    def __init__(self, ctx: BlockContext, args: DelimitedArgs) -> None:
        self._calls = ctx.calls
        self._args = args
        self._state = BETWEEN
        self._in_preamble = False  # in ARGS, before the arguments proper (`preamble` families)
        self._head: list[str] = []
        # Text given back as output if what follows turns out not to be a call (reset per started call).
        self._raw: list[str] = [ctx.opener]
        self.done = False
        self.fallback = ""

    @abstractmethod
    def _head_text(self, buf: str, i: int, end: int, out: list[OutputEvent]) -> int:
        """Consume head text from `buf[i:end]` (state HEAD); return where it stopped."""

    @abstractmethod
    def _head_marker(self, marker: str, start: int, end: int, out: list[OutputEvent]) -> int:
        """Act on a marker met in the head; return where to continue."""

    def _preamble_text(self, buf: str, i: int, end: int, out: list[OutputEvent]) -> int:
        """Consume text before the arguments proper from `buf[i:end]` (state ARGS while
        `_in_preamble`), clearing `_in_preamble` where the arguments begin; return where it stopped."""
        self._in_preamble = False
        return i

    def _text(self, buf: str, i: int, end: int, out: list[OutputEvent]) -> int:
        state = self._state
        if state is ARGS:  # nearly every chunk of a call: straight to the arguments
            if self._in_preamble:
                return self._preamble_text(buf, i, end, out)
            self._args.write(buf[i:end], out)
            return end
        if state is HEAD:
            return self._head_text(buf, i, end, out)
        j = self._keep_whitespace(buf, i, end)
        if j == end:
            return end
        # Not a call: after the calls the rest is ordinary output; before any, so is the opener.
        return self._give_up(j)

    def _keep_whitespace(self, buf: str, i: int, end: int) -> int:
        """Past the whitespace from `i`, which is kept with the text given back if no call follows."""
        j = i
        while j < end and buf[j] in WHITESPACE:
            j += 1
        if j > i:
            self._raw.append(buf[i:j])
        return j

    def _marker(self, marker: str, start: int, end: int, out: list[OutputEvent]) -> int:
        state = self._state
        if state is ARGS:
            if marker == self.call_end:
                self._end_call(out)
            elif marker == self.call_begin:  # the model skipped the end token: the next call closes this one
                self._end_call(out)
                self._begin_call(marker)
            elif marker in self.closers:
                self._end_call(out)
                self.done = True
            else:  # another marker inside the arguments is literal (and breaks the JSON)
                self._literal(marker, out)
            return end
        if state is HEAD:
            return self._head_marker(marker, start, end, out)
        if marker == self.call_begin:
            self._begin_call(marker)
        elif marker in self.closers:
            self.done = True  # an empty block carries nothing
        elif marker in self.openers:
            self._raw.append(marker)  # repeated opener
        else:
            return self._give_up(start)
        return end

    def _literal(self, marker: str, out: list[OutputEvent]) -> None:
        self._args.write(marker, out)

    def _begin_call(self, marker: str) -> None:
        self._raw.append(marker)
        self._head = []
        self._state = HEAD

    def _start(self, name: str, out: list[OutputEvent], call_id: str | None = None) -> None:
        """The head is complete: the call starts, its arguments follow."""
        self._calls.start(name, out, call_id=call_id)
        self._raw = []
        self._args.reset()
        self._state = ARGS
        self._in_preamble = self.preamble

    def _end_call(self, out: list[OutputEvent]) -> None:
        self._calls.end(out)
        self._raw = []
        self._state = BETWEEN

    def _give_up(self, i: int) -> int:
        self.done = True
        self.fallback = "".join(self._raw)
        return i

    def close(self, out: list[OutputEvent]) -> None:
        if self.done:
            return
        self.done = True
        if self._state is ARGS:
            self._calls.finish(out)  # complete arguments without the end marker are a call
        else:
            self.fallback = "".join(self._raw)
