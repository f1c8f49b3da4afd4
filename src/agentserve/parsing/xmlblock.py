"""The skeleton shared by tool blocks whose calls are XML-style tags (Qwen3-Coder, GLM, MiniMax).

A family's block is a small state machine over its own tags; this base gives it the parts that are
the same everywhere:

- Two ways to wait for more text. Outside a call (before the first name, between calls) the block
  stops short and the driver holds the rest, so text that turns out not to be a call is scanned
  again by the driver for its own markers. Inside a call everything up to the call's end belongs to
  the call, so the block keeps the possible start of a marker as its own `_tail`: a call cut off
  there is reported with all of its raw text, and nothing of it leaks out as text.
- `_find`: the next of a set of tags, never re-reading what was consumed (a `MarkerSet`). Every
  tag starts with `<`, so text without one (most of a long value) skips the marker scan entirely.
- `_stream_value`: a parameter value streamed into the `ArgsWriter` up to the first tag that ends
  it, optionally without one leading and one trailing newline (formatting the template wrote).
- Malformed calls: `_malformed` switches to skipping up to the call's end, where the call is
  reported with its raw text and parsing goes on with the next call.
- The raw text of the open call is collected in `_raw` and handed to `ToolCalls.raw` only when the
  call is reported (one list append per chunk on the hot path).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import ClassVar, Literal

from agentserve.conversation import OutputEvent
from agentserve.parsing.scanner import MarkerSet
from agentserve.parsing.stream import BlockContext
from agentserve.parsing.xmlargs import ArgsWriter, tool_properties, tool_required

# Function and tool names: word characters plus the separators MCP and namespaced tools use.
VALID_NAME = re.compile(r"[\w.:/-]+")
NAME_LIMIT = 256  # longer "names" and keys are not tags but text that happens to follow an opener
_WS = re.compile(r"[ \t\r\n]*")


def tags(*names: str) -> MarkerSet:
    """A MarkerSet of XML-style tags (each starts with `<`, which `_find` relies on)."""
    if not all(name.startswith("<") for name in names):
        raise ValueError(f"not tags: {names}")
    return MarkerSet(names)


def skip_ws(buf: str, i: int) -> int:
    m = _WS.match(buf, i)
    return m.end() if m is not None else i


def _closing(tail: str) -> bool:
    """What a block held at the end is whitespace or the start of a closing tag."""
    return not tail.strip() or tail.lstrip().startswith("</")


def is_partial(buf: str, j: int, markers: tuple[str, ...]) -> bool:
    """buf[j:] is a proper prefix of one of `markers` (it may still become it)."""
    rest = len(buf) - j
    return any(rest < len(m) and m.startswith(buf[j:]) for m in markers)


class XmlCallBlock(ABC):
    """Base of the XML-style tool blocks; a subclass implements `_run` and `_close_uncommitted`."""

    STRIP_NEWLINES: ClassVar[bool] = False

    __slots__ = (
        "_args",
        "_ctx",
        "_fresh",
        "_in_value",
        "_malformed",
        "_pending",
        "_raw",
        "_required",
        "_tail",
        "done",
        "fallback",
    )

    def __init__(self, ctx: BlockContext) -> None:
        self._ctx = ctx
        self._args = ArgsWriter(ctx.calls, {})
        self._tail = ""
        self._fresh = False  # no character of the current value seen yet
        self._in_value = False  # inside a value (`_stream_value` is the subclass's current state)
        self._malformed = ""  # why the open call is malformed (skipping to its end)
        # Text consumed outside a call, given back as output if the block turns out not to be one.
        self._pending: list[str] = [ctx.opener]
        self._raw: list[str] = []  # model text of the open call
        self._required: set[str] = set()  # required parameters of the open call not written yet
        self.done = False
        self.fallback = ""

    def feed(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        tail = self._tail
        if not tail:
            if self._in_value and not self._fresh and buf.find("<", i) < 0:
                return self._value_text(buf, i, out)  # the hot path: a chunk of a long value
            return self._run(buf, i, out)
        self._tail = ""
        j = self._run(tail + buf[i:], 0, out)
        # A tail never holds a complete tag, so whatever ends with it ends in the new text.
        assert j >= len(tail)
        return i + j - len(tail)

    @abstractmethod
    def _run(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        """The family's tag grammar over `buf[i:]`; returns where it stopped (see `feed`)."""

    def close(self, out: list[OutputEvent]) -> None:
        if self.done:
            return
        self.done = True
        calls = self._ctx.calls
        if calls.open:
            complete = self._between_arguments() and not self._required and _closing(self._tail)
            if not self._malformed and complete:
                # Every parameter is closed and the schema's required ones are there: only the call's
                # end tag is missing (engines strip it). A cut between parameters is not a call.
                self._finish_call(out)
            else:
                self._raw.append(self._tail)
                self._fail("malformed" if self._malformed else "truncated", out)
        else:
            self._close_uncommitted(out)
        self._tail = ""

    def _between_arguments(self) -> bool:
        """The open call is between parameters (none is half-written): its arguments are complete."""
        return False

    def _close_uncommitted(self, out: list[OutputEvent]) -> None:
        """End of output outside a call: what was consumed is plain text."""
        self.fallback = "".join(self._pending)

    # -- helpers for subclasses ------------------------------------------------------------------

    def _give_up(self, i: int) -> int:
        """Not a call (any more): the text consumed outside calls goes back as output."""
        self.done = True
        self.fallback = "".join(self._pending)
        self._pending = []
        return i

    def _start_call(self, name: str, raw: str, out: list[OutputEvent]) -> None:
        calls = self._ctx.calls
        calls.start(name, out)
        self._raw = [raw]
        self._args = ArgsWriter(calls, tool_properties(self._ctx.tools, name))
        self._required = set(tool_required(self._ctx.tools, name))
        self._malformed = ""
        self._pending = []

    def _finish_call(self, out: list[OutputEvent]) -> None:
        if self._malformed:
            self._fail("malformed", out)
        else:
            self._args.finish(out)
        self._raw = []

    def _fail(self, reason: Literal["truncated", "malformed"], out: list[OutputEvent]) -> None:
        calls = self._ctx.calls
        calls.raw("".join(self._raw))
        message = self._malformed if reason == "malformed" else "output ended inside the tool call"
        calls.fail(reason, out, message)

    def _find(
        self, buf: str, i: int, markers: MarkerSet, keep_newline: bool = False
    ) -> tuple[int, re.Match[str] | None]:
        """(start, match) of the next marker in buf[i:]; else (cut, None) where buf[cut:] became the
        tail (a possible marker start, and with `keep_newline` a newline right before it)."""
        if buf.find("<", i) < 0:  # no tag can start in buf[i:]
            cut = len(buf)
        else:
            m = markers.search(buf, i)
            if m is not None:
                return m.start(), m
            cut = markers.hold_from(buf, i)
        if keep_newline and cut > i and buf[cut - 1] == "\n":
            cut -= 1
        self._tail = buf[cut:]
        return cut, None

    def _skip_to(self, buf: str, i: int, markers: MarkerSet) -> tuple[int, str]:
        """Consume (as raw call text) up to and including the next marker: (index after it, marker),
        or (len(buf), "") when none is complete yet."""
        cut, m = self._find(buf, i, markers)
        if m is None:
            self._raw.append(buf[i:cut])
            return len(buf), ""
        self._raw.append(buf[i : m.end()])
        return m.end(), m.group()

    def _begin_value(self, key: str, out: list[OutputEvent]) -> None:
        self._required.discard(key)
        self._args.begin(key, out)
        self._fresh = True
        self._in_value = True

    def _value_text(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        """buf[i:] is value text with no tag in it (the value goes on)."""
        n = len(buf)
        if self.STRIP_NEWLINES and buf[n - 1] == "\n":
            n -= 1  # maybe the formatting newline before the close tag: decided by the next chunk
            self._tail = "\n"
        text = buf[i:n]
        self._raw.append(text)
        self._args.text(text, out)
        return len(buf)

    def _stream_value(self, buf: str, i: int, ends: MarkerSet, out: list[OutputEvent]) -> tuple[int, str]:
        """Stream the value up to the first of `ends`: (index after it, the marker), or (len(buf), "")
        when the value goes on."""
        strip = self.STRIP_NEWLINES
        if self._fresh:
            if i == len(buf):
                return i, ""
            self._fresh = False
            if strip and buf[i] == "\n":
                self._raw.append("\n")
                i += 1
        cut, m = self._find(buf, i, ends, keep_newline=strip)
        text = buf[i:cut]
        if m is None:
            self._raw.append(text)
            self._args.text(text, out)
            return len(buf), ""
        self._raw.append(buf[i : m.end()])
        self._in_value = False
        if strip and text.endswith("\n"):
            text = text[:-1]
        self._args.text(text, out)
        self._args.end(out)
        return m.end(), m.group()

    def _set_malformed(self, message: str) -> None:
        self._malformed = message
