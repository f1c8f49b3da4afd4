"""Pythonic tool calls (Llama 4, Llama 3.2 small models prompted for it, Olmo 3, others).

Raw output::

    [get_weather(city="Paris"), get_time(tz="CET")]

at the start of the content; Llama 4 may wrap it in `<|python_start|>…<|python_end|>`, and Olmo 3
writes one call per line inside `<function_calls>…</function_calls>`. Arguments are Python
literals (Olmo 3 also writes `true`/`false`/`null`). Content that starts with `[` but is not a
list of calls (`[1, 2]`, a Markdown link) comes out as text. Olmo 3 Think reasons in `<think>`.
"""

from __future__ import annotations

from agentserve.families.base import Family
from agentserve.parsing.pycalls import PythonCallsBlock
from agentserve.parsing.stream import BlockContext, ParserOptions, StreamParser, Syntax, ToolBlock

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
FUNCTION_CALLS, FUNCTION_CALLS_END = "<function_calls>", "</function_calls>"
END_OF_TURN = ("<|eot|>", "<|eom|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|im_end|>")


def _bare(ctx: BlockContext) -> ToolBlock:
    return PythonCallsBlock(ctx)


def _python_start(ctx: BlockContext) -> ToolBlock:
    return PythonCallsBlock(ctx, bracketed=None, close=PYTHON_END)


def _function_calls(ctx: BlockContext) -> ToolBlock:
    return PythonCallsBlock(ctx, bracketed=None, close=FUNCTION_CALLS_END)


SYNTAX = Syntax(
    tool_blocks={PYTHON_START: _python_start, FUNCTION_CALLS: _function_calls},
    swallow=(PYTHON_END, *END_OF_TURN),
    start_block=_bare,
    start_chars="[",
)


def make_parser(options: ParserOptions) -> StreamParser:
    return StreamParser(SYNTAX, options)


FAMILY = Family(
    name="pythonic",
    description="Llama 4 / Olmo 3 / others: [f(a=1), g(b='x')] Python-literal calls",
    make_parser=make_parser,
    aliases=("llama4_pythonic", "llama-4", "llama4", "olmo-3", "olmo3"),
    model_patterns=(r"llama-?4", r"olmo-?3"),
    stop_tokens=("<|eot_id|>", "<|eom_id|>", "<|eot|>", "<|eom|>"),
)
