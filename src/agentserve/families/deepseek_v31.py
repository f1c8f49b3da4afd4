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

from agentserve.conversation import OutputEvent
from agentserve.families.base import Family
from agentserve.families.grammar import (
    CallCount,
    GrammarTool,
    Markers,
    ToolGrammar,
    alternatives,
    json_rule,
    lit,
    repeat,
)
from agentserve.parsing.delimited import WHITESPACE, DelimitedArgs
from agentserve.parsing.markerblock import MarkerBlock
from agentserve.parsing.scanner import MarkerSet
from agentserve.parsing.stream import BlockContext, ParserOptions, StreamParser, Syntax, ToolBlock

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
SEP = "<｜tool▁sep｜>"
CALL_END = "<｜tool▁call▁end｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
END_OF_SENTENCE = "<｜end▁of▁sentence｜>"

_MARKERS = MarkerSet([CALLS_BEGIN, CALL_BEGIN, SEP, CALL_END, CALLS_END, END_OF_SENTENCE])
_CLOSES_BLOCK = frozenset([CALLS_END, END_OF_SENTENCE])
_V3_TYPE = "function"
_NAME_END = re.compile(r"[\n`{]")
# States: between calls, the head before the separator, V3-or-V3.1 after `function<sep>`, the V3
# name line, the optional code fence before the JSON, the arguments.
_BETWEEN, _HEAD, _KIND, _NAME, _FENCE, _ARGS = range(6)
# Phases of the optional fence: before it, in its backticks, in its language tag, after it.
_F_BEFORE, _F_TICKS, _F_LANG, _F_AFTER = range(4)


class DeepSeekToolCalls(MarkerBlock):
    """One `<｜tool▁calls▁begin｜>` … `<｜tool▁calls▁end｜>` block of calls (V3 and V3.1 forms)."""

    __slots__ = ("_args", "_calls", "_fence", "_head", "_raw", "_state", "done", "fallback")
    markers = _MARKERS

    def __init__(self, ctx: BlockContext) -> None:
        self._calls = ctx.calls
        # The closing fence (and its newline) is held like trailing whitespace and dropped at the end.
        self._args = DelimitedArgs(ctx.calls, WHITESPACE + "`")
        self._state = _BETWEEN
        self._head: list[str] = []
        self._fence = _F_BEFORE
        # Text given back as output if what follows turns out not to be a call (reset per started call).
        self._raw: list[str] = [ctx.opener]
        self.done = False
        self.fallback = ""

    # -- text between markers ----------------------------------------------------------------------

    def _text(self, buf: str, i: int, end: int, out: list[OutputEvent]) -> int:
        """Consume text of the current state from `buf[i:end]`; return where it stopped."""
        state = self._state
        if state == _ARGS:
            self._args.write(buf[i:end], out)
            return end
        if state == _FENCE:
            return self._skip_fence(buf, i, end)
        if state == _HEAD:
            piece = buf[i:end]
            self._head.append(piece)
            self._raw.append(piece)
            return end
        if state == _NAME:
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
        j = i
        while j < end and buf[j] in WHITESPACE:
            j += 1
        if j > i:
            self._raw.append(buf[i:j])
        if j == end:
            return end
        if state == _KIND:
            if buf[j] in "{`":  # V3.1 form: a tool named `function`
                self._start(_V3_TYPE, out)
            else:
                self._head = []
                self._state = _NAME
            return j
        # Text between calls: after the calls it is ordinary output; before any, so is the opener.
        return self._give_up(j)

    def _skip_fence(self, buf: str, i: int, end: int) -> int:
        phase = self._fence
        while i < end:
            c = buf[i]
            if c in WHITESPACE:
                if phase != _F_BEFORE:
                    phase = _F_AFTER
            elif c == "`" and phase <= _F_TICKS:
                phase = _F_TICKS
            elif phase in (_F_TICKS, _F_LANG) and c.isalnum():
                phase = _F_LANG
            else:
                self._state = _ARGS
                break
            i += 1
        self._fence = phase
        return i

    # -- markers -----------------------------------------------------------------------------------

    def _marker(self, marker: str, start: int, end: int, out: list[OutputEvent]) -> int:
        state = self._state
        if state in (_ARGS, _FENCE):
            if marker == CALL_END:
                self._end_call(out)
                self._state = _BETWEEN
            elif marker == CALL_BEGIN:  # the model skipped the end token: the next call closes this one
                self._end_call(out)
                self._begin_call(marker)
            elif marker in _CLOSES_BLOCK:
                self._end_call(out)
                self.done = True
            else:  # a separator or block opener inside the arguments is literal (and breaks the JSON)
                self._state = _ARGS
                self._args.write(marker, out)
            return end
        if state == _BETWEEN:
            if marker == CALL_BEGIN:
                self._begin_call(marker)
            elif marker in _CLOSES_BLOCK:
                self.done = True  # an empty block carries nothing
            elif marker == CALLS_BEGIN:
                self._raw.append(marker)  # repeated opener
            else:
                return self._give_up(start)
            return end
        head = "".join(self._head).strip()
        if state == _HEAD and marker == SEP:
            self._raw.append(marker)
            if head == _V3_TYPE:
                self._state = _KIND
            elif head:
                self._start(head, out)
            else:
                return self._give_up(start)
            return end
        if marker == CALL_END and state != _KIND:  # no arguments at all: a zero-argument call
            name = head
            if not name:
                return self._give_up(start)
            self._start(name, out)
            self._end_call(out)
            self._state = _BETWEEN
            return end
        return self._give_up(start)

    def _begin_call(self, marker: str) -> None:
        self._raw.append(marker)
        self._head = []
        self._state = _HEAD

    def _start(self, name: str, out: list[OutputEvent]) -> None:
        self._calls.start(name, out)
        self._raw = []
        self._args.reset()
        self._fence = _F_BEFORE
        self._state = _FENCE

    def _end_call(self, out: list[OutputEvent]) -> None:
        self._calls.end(out)
        self._raw = []

    def _give_up(self, i: int) -> int:
        self.done = True
        self.fallback = "".join(self._raw)
        return i

    def close(self, out: list[OutputEvent]) -> None:
        if self.done:
            return
        self.done = True
        if self._state in (_ARGS, _FENCE):
            self._calls.finish(out)  # complete arguments without <｜tool▁call▁end｜> are a call
        else:
            self.fallback = "".join(self._raw)


def tool_calls_block(ctx: BlockContext) -> ToolBlock:
    return DeepSeekToolCalls(ctx)


SYNTAX = Syntax(
    tool_blocks={CALLS_BEGIN: tool_calls_block},
    swallow=(END_OF_SENTENCE,),
    drop_open_in_reasoning=True,
)


def make_parser(options: ParserOptions) -> StreamParser:
    return StreamParser(SYNTAX, options)


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: the V3.1 form, `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`."""
    bodies = alternatives([f"{lit(t.name)} {m.tok(SEP)} {json_rule(t.schema)}" for t in tools])
    return "\n".join(
        (
            f"calls: {m.tok(CALLS_BEGIN)} {repeat('call', 'WS?', count)} WS? {m.tok(CALLS_END)}",
            f"call: {m.tok(CALL_BEGIN)} call_body {m.tok(CALL_END)}",
            f"call_body: {bodies}",
        )
    )


GRAMMAR = ToolGrammar(
    grammar_calls,
    think=("<think>", "</think>"),
    markers=(CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP),
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
    grammar=GRAMMAR,
)
