"""The streaming output parser: raw model text in, OutputEvents out (sans-IO, in the style of h11).

One `StreamParser` drives every family that writes reasoning as open/close tags (`<think>`,
`[THINK]`) and tool calls as some block syntax. The family supplies a `Syntax`: its reasoning tags,
the markers that open its tool blocks (each with a factory for the block's own state machine), and
the tokens that carry no content. The driver owns segment order, so reasoning_0 → tool_call_0 →
reasoning_1 → tool_call_1 → text comes out exactly in that order whatever the chunking.

Rules shared by all families:
- Only text that could still be the start of a marker is held back between chunks.
- A tool opener inside reasoning ends the reasoning segment (Qwen3.5, Kimi K2 and GLM open calls
  without closing their thought first) where the family says so.
- A block that turns out not to be a tool call gives its text back, and it is emitted exactly where
  it was, in the segment it was in: stray tags pass through as text.
- A `</think>` with no open reasoning before any output (templates that put `<think>` in the prompt)
  is dropped; after output (a closed thought, text or a call) it is literal text: a model that writes
  about the tag keeps it (DeepSeek-R1 answers that quote `</think>`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agentserve.conversation import OutputEvent, ToolSpec
from agentserve.parsing.scanner import marker_set
from agentserve.parsing.segments import SegmentWriter
from agentserve.parsing.toolcalls import IdFactory, ToolCalls, random_call_id


class ToolBlock(Protocol):
    """The state machine of one tool-call block, from just after its opener to just after its end.

    `feed(buf, i, out)` consumes from `buf[i:]` and returns the index it stopped at. A block that is
    not `done` may stop short only to wait for a partial marker: the driver holds the rest and feeds
    it again with the next chunk (so a block holds back no more than a marker's length). When `done`
    it may leave `fallback`: text that was not a tool call after all, emitted as ordinary output.
    """

    done: bool
    fallback: str

    def feed(self, buf: str, i: int, out: list[OutputEvent]) -> int: ...

    def close(self, out: list[OutputEvent]) -> None: ...


class OutputParser(Protocol):
    """What every family's parser is: `feed(text) -> events`, `close() -> events`, no I/O."""

    def feed(self, text: str) -> list[OutputEvent]: ...

    def close(self) -> list[OutputEvent]: ...


@dataclass(frozen=True, slots=True)
class BlockContext:
    calls: ToolCalls
    tools: Mapping[str, ToolSpec]
    opener: str  # the marker that opened the block ("" for a block opened by content shape)


BlockFactory = Callable[[BlockContext], ToolBlock]


@dataclass(frozen=True)
class Syntax:
    """What a family's output looks like, for the generic driver."""

    think_open: str | None = "<think>"
    think_close: str | None = "</think>"
    tool_blocks: Mapping[str, BlockFactory] = field(default_factory=dict)
    tools_end_reasoning: bool = True  # a tool opener inside reasoning ends it and starts the call
    swallow: Sequence[str] = ()  # end-of-turn and other tokens that carry no content
    # Closing markup a block may leave behind (opener → closer: Nemotron `</TOOLCALL>` after a block
    # that gave up, Mistral's optional `[/TOOL_CALLS]`): dropped once after that block's opener,
    # text anywhere else (a stray closing marker is the model's text).
    tails: Mapping[str, str] = field(default_factory=dict)
    # A block opened by the shape of the content rather than a marker (Llama 3 JSON, pythonic):
    # when the first non-space character of the content is one of `start_chars`.
    start_block: BlockFactory | None = None
    start_chars: str = ""
    # The opener may be both in the prompt and in the output (templates differ between versions): a
    # `think_open` before any reasoning text of an open segment carries nothing and is dropped.
    drop_open_in_reasoning: bool = False


@dataclass(frozen=True, slots=True)
class ParserOptions:
    starts_in_reasoning: bool = False  # the prompt ended inside an open reasoning block
    tools: Sequence[ToolSpec] = ()  # declared tools: schemas type the values of XML-style syntaxes
    id_factory: IdFactory = random_call_id
    # False where no call can be asked for (no tools, tool_choice none): content shaped like a call
    # (Llama 3 JSON's `{"name": …, "parameters": …}`) is then the answer itself, a JSON answer.
    calls_by_shape: bool = True


class HeldTextParser(ABC):
    """What every streaming output parser keeps (`StreamParser`, harmony's): the call counter, the
    text and reasoning writers, and the text held back from the last chunk (a marker may be cut
    across chunks), put back in front of the next one by `feed`."""

    __slots__ = ("_calls", "_closed", "_held", "_text", "_thought")

    def __init__(self, options: ParserOptions) -> None:
        self._calls = ToolCalls(options.id_factory)
        self._text = SegmentWriter(reasoning=False)
        self._thought = SegmentWriter(reasoning=True)
        self._held = ""
        self._closed = False

    @property
    def tool_calls_started(self) -> int:
        return self._calls.count

    def feed(self, text: str) -> list[OutputEvent]:
        if self._closed:
            raise RuntimeError("feed() after close()")
        out: list[OutputEvent] = []
        if self._held:
            text = self._held + text
            self._held = ""
        if text:
            self._run(text, out)
        return out

    @abstractmethod
    def _run(self, buf: str, out: list[OutputEvent]) -> None:
        """Parse `buf` (held text included), setting `_held` to any tail that may be a cut marker."""


class StreamParser(HeldTextParser):
    __slots__ = (
        "_block",
        "_block_calls",
        "_block_from_reasoning",
        "_content_markers",
        "_content_seen",
        "_in_reasoning",
        "_output_started",
        "_pending_tail",
        "_reasoning_cut",
        "_reasoning_markers",
        "_start_block",
        "_syntax",
        "_tools",
    )

    def __init__(self, syntax: Syntax, options: ParserOptions | None = None) -> None:
        options = options or ParserOptions()
        super().__init__(options)
        self._syntax = syntax
        self._tools = {t.name: t for t in options.tools}
        openers = list(syntax.tool_blocks)
        think = [m for m in (syntax.think_open, syntax.think_close) if m]
        self._content_markers = marker_set([*think, *openers, *syntax.swallow, *syntax.tails.values()])
        in_reasoning = [m for m in (syntax.think_close,) if m]
        if syntax.tools_end_reasoning:
            in_reasoning += openers
        in_reasoning += syntax.swallow
        if syntax.drop_open_in_reasoning and syntax.think_open:
            in_reasoning.append(syntax.think_open)
        self._reasoning_markers = marker_set(in_reasoning or ["\x00"])
        self._in_reasoning = options.starts_in_reasoning and syntax.think_close is not None
        self._block: ToolBlock | None = None
        self._block_calls = 0
        self._block_from_reasoning = False
        self._start_block = syntax.start_block if options.calls_by_shape else None
        self._content_seen = self._start_block is None
        self._output_started = False  # reasoning closed, text or a block seen: `</think>` is literal now
        self._reasoning_cut = False  # a call ended the thought: the model may still close it
        self._pending_tail: str | None = None  # the closing markup the last block may leave

    def close(self) -> list[OutputEvent]:
        """End of output: flush held text, report a call cut off mid-way, close open segments."""
        if self._closed:
            return []
        self._closed = True
        out: list[OutputEvent] = []
        while self._block is not None:
            block = self._block
            pos = len(out)
            block.close(out)
            self._after_block(block, pos, out)
            # A block that recovered from a broken call gives back the text after it: parse it again.
            rest = getattr(block, "reparse", "")
            if rest:
                rest, self._held = rest + self._held, ""
                self._run(rest, out)
        if self._held:
            self._segment().write(self._held, out)
            self._held = ""
        self._thought.end(out)
        self._text.end(out)
        return out

    # -- internals ---------------------------------------------------------------------------------

    def _segment(self) -> SegmentWriter:
        return self._thought if self._in_reasoning else self._text

    def _run(self, buf: str, out: list[OutputEvent]) -> None:
        i = 0
        n = len(buf)
        while i < n:
            block = self._block
            if block is not None:
                pos = len(out)
                i = block.feed(buf, i, out)
                self._after_block(block, pos, out)
                if not block.done and i < n:
                    self._held = buf[i:]
                    return
                continue
            if self._in_reasoning:
                markers = self._reasoning_markers
            else:
                if not self._content_seen:
                    i = self._maybe_start_block(buf, i)
                    if i < 0:  # only whitespace so far: keep it until the content shows its shape
                        return
                    if self._block is not None:
                        continue
                markers = self._content_markers
            if markers.quiet(buf, i):
                self._write(buf[i:], out)
                return
            m = markers.search(buf, i)
            if m is None:
                hold = markers.hold_from(buf, i)
                self._write(buf[i:hold], out)
                self._held = buf[hold:]
                return
            self._write(buf[i : m.start()], out)
            i = m.end()
            self._on_marker(m.group(), out)

    def _write(self, text: str, out: list[OutputEvent]) -> None:
        if text:
            if not self._in_reasoning and not text.isspace():
                self._content_seen = True
                self._output_started = True
                self._reasoning_cut = False
            self._segment().write(text, out)

    def _maybe_start_block(self, buf: str, i: int) -> int:
        """Before any content: open the start block if the content begins with one of its characters.

        Reasoning is not content: the check waits for the first text after it (`_write` and
        `_open_block` mark the content seen), so `<think>…</think>[f()]` still opens the block.
        """
        n = len(buf)
        j = i
        while j < n and buf[j] in " \t\r\n":
            j += 1
        if j == n:
            self._held = buf[i:]
            return -1
        factory = self._start_block
        if factory is not None and buf[j] in self._syntax.start_chars:
            self._open_block(factory, "")
            return j
        return i

    def _on_marker(self, marker: str, out: list[OutputEvent]) -> None:
        syntax = self._syntax
        if marker == syntax.think_open:
            if not self._in_reasoning:
                self._text.end(out)
                self._in_reasoning = True
            elif self._thought.started:  # only with drop_open_in_reasoning: a literal tag mid-thought
                self._thought.write(marker, out)
            # else: the opener repeated at the start of an open segment carries nothing
        elif marker == syntax.think_close:
            if self._in_reasoning:
                self._thought.end(out)
                self._in_reasoning = False
                self._output_started = True
            elif self._reasoning_cut:
                self._reasoning_cut = False  # the close of a thought a call already ended (K2, GLM)
            elif self._output_started:
                self._write(marker, out)  # after the thought: the model is writing the tag itself
            # else: an orphan close before any output (the opener was in the prompt): nothing
        elif marker in syntax.tool_blocks:
            self._open_block(syntax.tool_blocks[marker], marker)
        elif marker == self._pending_tail:
            self._pending_tail = None  # the closing markup of the last block
        elif marker not in syntax.swallow:
            self._write(marker, out)  # a closing marker with no block to close: text
        # else: a swallowed token

    def _open_block(self, factory: BlockFactory, opener: str) -> None:
        self._content_seen = True  # a tool block is content: the start block opens only before one
        self._output_started = True
        self._pending_tail = self._syntax.tails.get(opener)
        self._block = factory(BlockContext(self._calls, self._tools, opener))
        self._block_calls = self._calls.count
        self._block_from_reasoning = self._in_reasoning

    def _after_block(self, block: ToolBlock, pos: int, out: list[OutputEvent]) -> None:
        # The segment before a block ends only once the block proves to be a tool call: if it gives
        # its text back instead, that text continues the segment it interrupted.
        if self._block_calls >= 0 and self._calls.count > self._block_calls:
            ends: list[OutputEvent] = []
            if self._block_from_reasoning:
                self._thought.end(ends)
                self._in_reasoning = False
                self._reasoning_cut = True
            self._text.end(ends)
            if ends:
                out[pos:pos] = ends
            self._block_calls = -1  # committed: segments already ended
        if block.done:
            self._block = None
            if block.fallback:
                self._write(block.fallback, out)
