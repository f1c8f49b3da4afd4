"""DeepSeek V3 / V3-0324 / V3.1 / V3.1-Terminus: `<think>` reasoning, fullwidth special-token calls.

V3.1 writes the name, then the raw JSON arguments::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
    <｜tool▁calls▁end｜>

(without the line break). V3, V3-0324 and R1-0528 write a type, the name on its own line and the
JSON in a code fence::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>

Both are accepted: after `function<｜tool▁sep｜>` a name follows in the V3 form, a JSON object in the
V3.1 form (a tool that is itself called `function`). Each call ends at its own `<｜tool▁call▁end｜>`
(Dynamo#3599), never by guessing where the JSON ends (vLLM#48342); begin and end in one chunk is
an ordinary case here (vLLM#48020). V3.1 is hybrid: the thinking template ends the prompt with
`<think>`, so pass `starts_in_reasoning` for it; the default is the non-thinking (tool) mode.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import IntEnum

from agentserve.conversation import OutputEvent
from agentserve.families.base import Family
from agentserve.families.grammar import (
    CallCount,
    GrammarTool,
    Markers,
    ToolGrammar,
    name_then_arguments,
    repeat,
)
from agentserve.families.tokens import DEEPSEEK
from agentserve.parsing.delimited import WHITESPACE, DelimitedArgs
from agentserve.parsing.markerblock import SpecialTokenCalls
from agentserve.parsing.scanner import MarkerSet
from agentserve.parsing.stream import BlockContext, ParserOptions, StreamParser, Syntax, ToolBlock

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
SEP = "<｜tool▁sep｜>"
CALL_END = "<｜tool▁call▁end｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
END_OF_SENTENCE = "<｜end▁of▁sentence｜>"

_MARKERS = MarkerSet([CALLS_BEGIN, CALL_BEGIN, SEP, CALL_END, CALLS_END, END_OF_SENTENCE])
_V3_TYPE = "function"
_NAME_END = re.compile(r"[\n`{]")
NAMES = r"[^\n`{]+"  # what a call's name may hold: its end is the first of `_NAME_END`


class _Head(IntEnum):
    """Steps of the head: up to the separator, then V3 or V3.1 after `function<sep>`, the V3 name line."""

    TYPE_OR_NAME = 0
    KIND = 1
    NAME_LINE = 2


class _Fence(IntEnum):
    """The optional code fence before V3's JSON: before it, its backticks, its language tag, after it,
    and past it (the arguments proper)."""

    BEFORE = 0
    TICKS = 1
    LANG = 2
    AFTER = 3
    PAST = 4


class DeepSeekToolCalls(SpecialTokenCalls):
    """One `<｜tool▁calls▁begin｜>` … `<｜tool▁calls▁end｜>` block of calls (V3 and V3.1 forms)."""

    __slots__ = ("_fence", "_step")
    markers = _MARKERS
    call_begin = CALL_BEGIN
    call_end = CALL_END
    openers = frozenset([CALLS_BEGIN])
    closers = frozenset([CALLS_END, END_OF_SENTENCE])
    preamble = True  # V3's optional code fence before the JSON

    def __init__(self, ctx: BlockContext) -> None:
        # The closing fence (and its newline) is held like trailing whitespace and dropped at the end.
        super().__init__(ctx, DelimitedArgs(ctx.calls, WHITESPACE + "`"))
        self._step = _Head.TYPE_OR_NAME
        self._fence = _Fence.PAST

    # -- text ----------------------------------------------------------------------------------------

    def _head_text(self, buf: str, i: int, end: int, out: list[OutputEvent]) -> int:
        step = self._step
        if step is _Head.TYPE_OR_NAME:
            piece = buf[i:end]
            self._head.append(piece)
            self._raw.append(piece)
            return end
        if step is _Head.NAME_LINE:
            m = _NAME_END.search(buf, i, end)
            stop = end if m is None else m.start()
            piece = buf[i:stop]
            self._head.append(piece)
            self._raw.append(piece)
            if m is not None:
                name = "".join(self._head).strip()
                if not name:
                    return self._give_up(stop)
                self._start(name, out)
            return stop
        # KIND: after `function<sep>`, a name line (V3) or the arguments of `function` (V3.1)
        j = self._keep_whitespace(buf, i, end)
        if j == end:
            return end
        if buf[j] in "{`":  # V3.1 form: a tool named `function`
            self._start(_V3_TYPE, out)
        else:
            self._head = []
            self._step = _Head.NAME_LINE
        return j

    def _preamble_text(self, buf: str, i: int, end: int, out: list[OutputEvent]) -> int:
        """Skip the code fence before the JSON (its backticks, language tag and whitespace)."""
        phase = self._fence
        while i < end:
            c = buf[i]
            if c in WHITESPACE:
                if phase is not _Fence.BEFORE:
                    phase = _Fence.AFTER
            elif c == "`" and phase <= _Fence.TICKS:
                phase = _Fence.TICKS
            elif phase in (_Fence.TICKS, _Fence.LANG) and c.isalnum():
                phase = _Fence.LANG
            else:
                phase = _Fence.PAST
                break
            i += 1
        self._fence = phase
        self._in_preamble = phase is not _Fence.PAST
        return i

    # -- markers -------------------------------------------------------------------------------------

    def _head_marker(self, marker: str, start: int, end: int, out: list[OutputEvent]) -> int:
        head = "".join(self._head).strip()
        step = self._step
        if step is _Head.TYPE_OR_NAME and marker == SEP:
            self._raw.append(marker)
            if head == _V3_TYPE:
                self._step = _Head.KIND
            elif head:
                self._start(head, out)
            else:
                return self._give_up(start)
            return end
        if marker == CALL_END and step is not _Head.KIND:  # no arguments at all: a zero-argument call
            if not head:
                return self._give_up(start)
            self._start(head, out)
            self._end_call(out)
            return end
        return self._give_up(start)

    def _literal(self, marker: str, out: list[OutputEvent]) -> None:
        self._fence = _Fence.PAST  # a marker ends the fence: what follows is argument text
        self._in_preamble = False
        self._args.write(marker, out)

    def _begin_call(self, marker: str) -> None:
        super()._begin_call(marker)
        self._step = _Head.TYPE_OR_NAME

    def _start(self, name: str, out: list[OutputEvent], call_id: str | None = None) -> None:
        super()._start(name, out, call_id)
        self._fence = _Fence.BEFORE


def tool_calls_block(ctx: BlockContext) -> ToolBlock:
    return DeepSeekToolCalls(ctx)


SYNTAX = Syntax(
    tool_blocks={CALLS_BEGIN: tool_calls_block},
    swallow=(END_OF_SENTENCE,),
    drop_open_in_reasoning=True,
)


def make_parser(options: ParserOptions) -> StreamParser:
    return StreamParser(SYNTAX, options)


def calls_section(count: CallCount, m: Markers, bodies: str, *, space_before_end: bool = False) -> str:
    """`calls`: the tool-calls section of `count` calls, each `<｜tool▁call▁begin｜>` + one of
    `bodies` + `<｜tool▁call▁end｜>` (V3.1 and R1's V3 form, whose fenced body may leave whitespace
    before the end: `space_before_end`)."""
    space = " WS?" if space_before_end else ""
    return "\n".join(
        (
            f"calls: {m.tok(CALLS_BEGIN)} {repeat('call', 'WS?', count)} WS? {m.tok(CALLS_END)}",
            f"call: {m.tok(CALL_BEGIN)} call_body{space} {m.tok(CALL_END)}",
            f"call_body: {bodies}",
        )
    )


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: the V3.1 form, `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`."""
    return calls_section(count, m, name_then_arguments(tools, m.tok(SEP)))


GRAMMAR = ToolGrammar(
    grammar_calls,
    think=("<think>", "</think>"),
    markers=(CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP),
    tool_names=NAMES,
)

FAMILY = Family(
    name="deepseek-v3.1",
    description="DeepSeek V3 / V3-0324 / V3.1 / V3.1-Terminus: <think> reasoning, <｜tool▁calls▁begin｜>",
    make_parser=make_parser,
    aliases=(
        "deepseek_v31",
        "deepseek_v3_1",
        "deepseekv31",
        "deepseek_v3",
        "deepseekv3",
        "deepseek-v3.1-terminus",
    ),
    # V3.2 writes DSML, another format: not this family.
    model_patterns=(r"deepseek-v3(?!\.[2-9])",),
    stop_tokens=("<｜end▁of▁sentence｜>",),
    special_tokens=DEEPSEEK,
    grammar=GRAMMAR,
)
