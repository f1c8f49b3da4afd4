"""Pythonic tool calls (Llama 4, Llama 3.2 small models prompted for it, Olmo 3, others).

Raw output::

    [get_weather(city="Paris"), get_time(tz="CET")]

at the start of the content; Llama 4 may wrap it in `<|python_start|>…<|python_end|>`, and Olmo 3
writes one call per line inside `<function_calls>…</function_calls>`. Arguments are Python
literals (Olmo 3 also writes `true`/`false`/`null`). Content that starts with `[` but is not a
list of calls (`[1, 2]`, a Markdown link) comes out as text. Olmo 3 Think reasons in `<think>`.
"""

from __future__ import annotations

import keyword
from collections.abc import Mapping, Sequence
from typing import Any

from agentserve.families.base import Family
from agentserve.families.grammar import (
    CallCount,
    GrammarTool,
    GrammarUnsupported,
    Markers,
    ToolGrammar,
    alternatives,
    is_any_object,
    json_rule,
    lit,
    parameters,
    repeat,
)
from agentserve.families.tokens import LLAMA3
from agentserve.parsing.pycalls import NAME_RUN, NAME_START, PythonCallsBlock
from agentserve.parsing.stream import BlockContext, ParserOptions, StreamParser, Syntax, ToolBlock
from agentserve.schema_refs import deref, standalone

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


ANY_VALUE: Mapping[str, Any] = {}
COMMA = 'WS? "," WS?'


def _arguments(i: int, tool: GrammarTool, rules: list[str]) -> str:
    """Rules for one call's keyword arguments, in schema order (optional ones may be left out; the
    commas follow whichever are present), returning the nonterminal that starts them."""
    if is_any_object(deref(tool.schema, tool.schema)):
        pair = f'ARG_NAME "=" {json_rule(ANY_VALUE)}'
        rules.append(f"args_{i}: ({pair} ({COMMA} {pair})*)?")
        return f"args_{i}"
    props, required = parameters(tool)
    for key, _ in props:
        _identifier(key, tool.name, "parameter")
    for k in range(len(props), -1, -1):
        for comma in (0, 1):
            name = f"args_{i}_{k}_{comma}"
            if k == len(props):
                rules.append(f'{name}: ""')
                continue
            key, sub = props[k]
            value = json_rule(standalone(sub, tool.schema))
            head = (f"{COMMA} " if comma else "") + f"{lit(key + '=')} {value}"
            present = f"{head} args_{i}_{k + 1}_1"
            skip = "" if key in required else f" | args_{i}_{k + 1}_{comma}"
            rules.append(f"{name}: {present}{skip}")
    return f"args_{i}_0_0"


def _identifier(name: str, tool: str, what: str) -> None:
    """Names a call writes bare must be Python identifiers (else the parser reads no call)."""
    if not name.isidentifier() or keyword.iskeyword(name) or not name.isascii():
        raise GrammarUnsupported(
            f"{what} {name!r} is not a Python identifier, which pythonic calls need", tool
        )


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: `[NAME(key=value, …), …]`, values as JSON literals (which the parser reads as Python
    literals: strings, numbers, lists, dicts, true/false/null)."""
    rules: list[str] = []
    calls = []
    for i, tool in enumerate(tools):
        start = _arguments(i, tool, rules)
        rules.append(f'call_{i}: {lit(tool.name + "(")} WS? {start} WS? ")"')
        calls.append(f"call_{i}")
    head = [
        f'calls: "[" WS? {repeat("call", COMMA, count)} WS? "]"',
        f"call: {alternatives(calls)}",
        f"ARG_NAME: /[A-Za-z_][A-Za-z0-9_]*/ & ~/({'|'.join(keyword.kwlist)})/",
    ]
    return "\n".join(head + rules)


GRAMMAR = ToolGrammar(
    grammar_calls,
    calls_first=True,
    text_not_first="[",
    tool_names=f"{NAME_START.pattern}(?:{NAME_RUN.pattern})?",
)


FAMILY = Family(
    name="pythonic",
    description="Llama 4 / Olmo 3 / others: [f(a=1), g(b='x')] Python-literal calls",
    make_parser=make_parser,
    aliases=("llama4_pythonic", "llama-4", "llama4", "olmo-3", "olmo3"),
    model_patterns=(r"llama-?4", r"olmo-?3"),
    stop_tokens=("<|eot_id|>", "<|eom_id|>", "<|eot|>", "<|eom|>"),
    special_tokens=LLAMA3,
    grammar=GRAMMAR,
)
