"""Llama-3.1/3.3-Nemotron Nano/Super/Ultra (v1, v1.5) and Nemotron-Nano-v2: `<think>` reasoning,
`<TOOLCALL>[…]</TOOLCALL>` JSON calls.

Raw output (thinking on: system prompt `detailed thinking on`, or `/think` on v1.5)::

    <think>
    The user wants the weather.
    </think>

    <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL><|eot_id|>

With thinking off the output has no think block (or an empty one) and is plain text and calls.
`<TOOLCALL>` and `</TOOLCALL>` are never shown as text, even when what they wrap is not a call
(Dynamo's `strip_markup_on_recovery`): the wrapped text is kept, the markup is dropped.
Nemotron 3 (hybrid Mamba-MoE) writes Qwen3-Coder XML calls and is not this family.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentserve.families.base import Family
from agentserve.families.grammar import (
    CallCount,
    GrammarTool,
    Markers,
    ToolGrammar,
    name_arguments_calls,
    repeat,
)
from agentserve.families.tokens import LLAMA3
from agentserve.parsing.jsonblock import JsonCallsBlock
from agentserve.parsing.stream import BlockContext, ParserOptions, StreamParser, Syntax, ToolBlock

OPEN, CLOSE = "<TOOLCALL>", "</TOOLCALL>"
END_OF_TURN = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


def _toolcall(ctx: BlockContext) -> ToolBlock:
    # An empty opener: text that turns out not to be a call is given back without the markup.
    return JsonCallsBlock(BlockContext(ctx.calls, ctx.tools, ""), CLOSE)


# A `</TOOLCALL>` left over after a block gave up carries no content; a stray one is text.
SYNTAX = Syntax(tool_blocks={OPEN: _toolcall}, swallow=END_OF_TURN, tails={OPEN: CLOSE})


def make_parser(options: ParserOptions) -> StreamParser:
    return StreamParser(SYNTAX, options)


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: `<TOOLCALL>[{"name": …, "arguments": …}, …]</TOOLCALL>`."""
    calls = name_arguments_calls(tools)
    items = repeat("call", 'WS? "," WS?', count)
    return "\n".join(
        (
            f'calls: {m.tok(OPEN)} WS? "[" WS? {items} WS? "]" WS? {m.tok(CLOSE)}',
            f"call: {calls}",
        )
    )


GRAMMAR = ToolGrammar(grammar_calls, think=("<think>", "</think>"), markers=(OPEN, CLOSE))

FAMILY = Family(
    name="nemotron",
    description="Llama-Nemotron Nano/Super/Ultra v1/v1.5: <think> reasoning (on/off), <TOOLCALL> JSON calls",
    make_parser=make_parser,
    aliases=("nemotron_deci", "nemotron-json", "llama-nemotron", "llama_nemotron_json", "nemotron_json"),
    # Not Nemotron-3 (`Nemotron-3-Nano`, `Nemotron-3-Super`): those write Qwen3-Coder XML calls.
    model_patterns=(
        r"llama-?3[._]\d+-nemotron-(nano|super|ultra)",
        r"nemotron-(nano|super|ultra)-(\d+b-)?v\d",
    ),
    stop_tokens=("<|eot_id|>",),
    special_tokens=(
        *LLAMA3,
        "<TOOLCALL>",
        "</TOOLCALL>",
        "<AVAILABLE_TOOLS>",
        "</AVAILABLE_TOOLS>",
        "<TOOL_RESPONSE>",
        "</TOOL_RESPONSE>",
        "<think>",
        "</think>",
    ),
    grammar=GRAMMAR,
)
