"""Kimi K2 (Instruct, K2-0905, K2-Thinking, K2.5): `<think>` reasoning, special-token tool sections.

Raw output::

    <think>Check the weather.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>

(without the line break inside the call). The call id is the model's own `functions.NAME:IDX`: Kimi's
template re-renders it verbatim in history, so it is kept as the call's id. The name is the id up to
`:` without the `functions.` prefix; MCP names keep their `-` and `.` (Dynamo PR #8532). Some outputs
spell the section markers in the singular (`<|tool_call_section_begin|>`). K2-Thinking may open the
section before `</think>`: the section then ends the reasoning (vLLM PR #32216, SGLang PR #18199).
"""

from __future__ import annotations

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
from agentserve.parsing.delimited import DelimitedArgs
from agentserve.parsing.markerblock import SpecialTokenCalls
from agentserve.parsing.scanner import MarkerSet
from agentserve.parsing.stream import BlockContext, ParserOptions, StreamParser, Syntax, ToolBlock

SECTION_BEGIN = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
SECTION_END = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
CALL_BEGIN = "<|tool_call_begin|>"
ARGS_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
END_OF_TURN = "<|im_end|>"

_MARKERS = MarkerSet([*SECTION_BEGIN, *SECTION_END, CALL_BEGIN, ARGS_BEGIN, CALL_END, END_OF_TURN])


def call_name(call_id: str) -> str:
    """`functions.mcp.git-log:3` -> `mcp.git-log`."""
    return call_id.split(":", 1)[0].strip().removeprefix("functions.")


class KimiToolSection(SpecialTokenCalls):
    """One `<|tool_calls_section_begin|>` … `<|tool_calls_section_end|>` block of calls; the head is
    the call id, up to `<|tool_call_argument_begin|>`."""

    __slots__ = ()
    markers = _MARKERS
    call_begin = CALL_BEGIN
    call_end = CALL_END
    openers = frozenset(SECTION_BEGIN)
    closers = frozenset([*SECTION_END, END_OF_TURN])

    def __init__(self, ctx: BlockContext) -> None:
        super().__init__(ctx, DelimitedArgs(ctx.calls))

    def _head_text(self, buf: str, i: int, end: int, out: list[OutputEvent]) -> int:
        piece = buf[i:end]
        self._head.append(piece)
        self._raw.append(piece)
        return end

    def _head_marker(self, marker: str, start: int, end: int, out: list[OutputEvent]) -> int:
        if marker not in (ARGS_BEGIN, CALL_END):
            return self._give_up(start)
        call_id = "".join(self._head).strip()
        name = call_name(call_id)
        if not name:
            return self._give_up(start)
        self._start(name, out, call_id=call_id)
        if marker == CALL_END:  # no argument marker at all: a zero-argument call
            self._end_call(out)
        return end


def _section(ctx: BlockContext) -> ToolBlock:
    return KimiToolSection(ctx)


SYNTAX = Syntax(
    tool_blocks=dict.fromkeys(SECTION_BEGIN, _section),
    swallow=(END_OF_TURN,),
    drop_open_in_reasoning=True,
)


def make_parser(options: ParserOptions) -> StreamParser:
    return StreamParser(SYNTAX, options)


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: a tool-calls section of `functions.NAME:IDX` + JSON arguments."""
    arg = m.tok("<|tool_call_argument_begin|>")
    bodies = alternatives([f"{lit(f'functions.{t.name}:')} IDX {arg} {json_rule(t.schema)}" for t in tools])
    return "\n".join(
        (
            f"calls: {m.tok(SECTION_BEGIN[0])} {repeat('call', 'WS?', count)} WS? {m.tok(SECTION_END[0])}",
            f"call: {m.tok('<|tool_call_begin|>')} call_body {m.tok('<|tool_call_end|>')}",
            f"call_body: {bodies}",
            "IDX: /[0-9]+/",
        )
    )


GRAMMAR = ToolGrammar(
    grammar_calls,
    think=("<think>", "</think>"),
    markers=(
        *SECTION_BEGIN,
        *SECTION_END,
        "<|tool_call_begin|>",
        "<|tool_call_end|>",
        "<|tool_call_argument_begin|>",
    ),
    tool_names=r"[^:\s](?:[^:]*[^:\s])?",  # `functions.NAME:IDX`, read back up to its `:` and stripped
)

FAMILY = Family(
    name="kimi-k2",
    description="Kimi K2 / K2-Thinking / K2.5: <think> reasoning, <|tool_calls_section_begin|> calls",
    make_parser=make_parser,
    aliases=("kimi_k2", "kimi-k2.5", "kimi-k25", "kimi-k2-thinking"),
    model_patterns=(r"kimi-k2",),
    stop_tokens=("<|im_end|>",),
    special_tokens=(
        "<|im_system|>",
        "<|im_user|>",
        "<|im_assistant|>",
        "<|im_middle|>",
        "<|im_end|>",
        *SECTION_BEGIN,
        *SECTION_END,
        CALL_BEGIN,
        CALL_END,
        ARGS_BEGIN,
        "<think>",
        "</think>",
    ),
    grammar=GRAMMAR,
)
