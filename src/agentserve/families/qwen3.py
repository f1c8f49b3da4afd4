"""Qwen3 (hybrid and 2507): `<think>` reasoning, Hermes-style JSON tool calls.

Raw output::

    <think>
    reasoning
    </think>

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call><|im_end|>

A `<tool_call>` inside reasoning ends it (Qwen3.5 opens calls without closing its thought).
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
from agentserve.families.tokens import CHATML
from agentserve.parsing.jsonblock import JsonCallsBlock
from agentserve.parsing.stream import BlockContext, ParserOptions, StreamParser, Syntax, ToolBlock

END_OF_TURN = ("<|im_end|>", "<|endoftext|>")


def _hermes_call(ctx: BlockContext) -> ToolBlock:
    return JsonCallsBlock(ctx, "</tool_call>")


SYNTAX = Syntax(tool_blocks={"<tool_call>": _hermes_call}, swallow=END_OF_TURN)


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: Hermes blocks, `<tool_call>` + `{"name": …, "arguments": …}` + `</tool_call>`."""
    calls = name_arguments_calls(tools)
    return "\n".join(
        (
            f"calls: {repeat('call', 'WS?', count)}",
            f"call: {m.tok('<tool_call>')} WS? call_json WS? {m.tok('</tool_call>')}",
            f"call_json: {calls}",
        )
    )


GRAMMAR = ToolGrammar(grammar_calls, think=("<think>", "</think>"), markers=("<tool_call>", "</tool_call>"))


def make_parser(options: ParserOptions) -> StreamParser:
    return StreamParser(SYNTAX, options)


FAMILY = Family(
    name="qwen3",
    description="Qwen3 / Qwen3-2507 / QwQ / Hermes: <think> reasoning, <tool_call> JSON calls",
    make_parser=make_parser,
    aliases=("hermes", "qwen25", "qwen", "qwq"),
    model_patterns=(r"qwen3(?!-?coder|\.5|-?next)", r"qwq", r"hermes", r"qwen2\.5"),
    stop_tokens=("<|im_end|>",),
    special_tokens=CHATML,
    grammar=GRAMMAR,
)
