"""Llama 3.1 / 3.2 / 3.3 JSON tool calls.

Raw output::

    {"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>

or the same after `<|python_tag|>`; several calls are `;`-separated. The key is `parameters`
(`arguments` is accepted too). There is no end marker: a call ends with its object.

Bare JSON is a call only at the very start of the content and only when its first key is `name`:
any other content that starts with `{` (JSON-mode answers) comes out as text, unchanged, and is
released at its first key rather than held to its end. Built-in tool calls in Python syntax after
`<|python_tag|>` (`brave_search.call(query="…")`) are not JSON and come out as text.
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

PYTHON_TAG = "<|python_tag|>"
END_OF_TURN = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


def _tagged(ctx: BlockContext) -> ToolBlock:
    return JsonCallsBlock(ctx, separator=";")


def _bare(ctx: BlockContext) -> ToolBlock:
    return JsonCallsBlock(ctx, separator=";", name_first=True)


SYNTAX = Syntax(
    think_open=None,
    think_close=None,
    tool_blocks={PYTHON_TAG: _tagged},
    swallow=END_OF_TURN,
    start_block=_bare,
    start_chars="{",
)


def make_parser(options: ParserOptions) -> StreamParser:
    return StreamParser(SYNTAX, options)


SEMICOLON = 'WS? ";" WS?'


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: `{"name": …, "parameters": …}` objects, `;`-separated, opening the content."""
    calls = name_arguments_calls(tools, "parameters")
    return "\n".join(
        (
            f"calls: {m.tok('<|python_tag|>')}? {repeat('call', SEMICOLON, count)}",
            f"call: {calls}",
        )
    )


GRAMMAR = ToolGrammar(grammar_calls, markers=("<|python_tag|>",), calls_first=True, text_not_first="{")

FAMILY = Family(
    name="llama3-json",
    description="Llama 3.1/3.2/3.3: JSON calls, bare or after <|python_tag|>, ';'-separated",
    make_parser=make_parser,
    aliases=("llama3_json", "llama3", "llama-3.1", "llama-3"),
    model_patterns=(r"llama-?3[._][123](?!\d)",),
    stop_tokens=("<|eom_id|>", "<|eot_id|>"),
    special_tokens=LLAMA3,
    grammar=GRAMMAR,
)
