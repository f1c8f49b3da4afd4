"""A family whose output parser is chosen by name: `--reasoning-parser` / `--tool-call-parser`.

Dynamo and vLLM let a deployment pick the reasoning parser and the tool-call parser separately
(a fine-tune that keeps Qwen3's `<think>` but emits Hermes calls, a model served under a name the
registry does not recognise). Here both names are family names or aliases (`hermes`, `harmony`,
`deepseek_r1`, `qwen3_coder`, …). The served family keeps its template, catalog facts and replay
rules; only its output parser changes:

- one name given, or both naming the same family: that family's parser;
- two different families: one `StreamParser` whose think markers come from the reasoning family and
  whose tool blocks come from the tool-call family (both must be marker syntaxes; harmony, whose
  reasoning is a channel of the same grammar as its calls, cannot be split and is refused).
"""

from __future__ import annotations

import dataclasses
import sys

from agentserve.families import Family, UnknownFamilyError, get_family
from agentserve.families.grammar import ToolGrammar
from agentserve.parsing.stream import ParserOptions, StreamParser, Syntax


class ParserChoiceError(ValueError):
    """The parser names cannot be served (unknown, or not combinable)."""


def _syntax(family: Family) -> Syntax | None:
    module = sys.modules.get(getattr(family.make_parser, "__module__", ""))
    syntax = getattr(module, "SYNTAX", None)
    return syntax if isinstance(syntax, Syntax) else None


def _lookup(flag: str, name: str) -> Family:
    try:
        return get_family(name)
    except UnknownFamilyError as exc:
        raise ParserChoiceError(f"{flag}: {exc}") from None


def combined_syntax(reasoning: Syntax, tools: Syntax) -> Syntax:
    """The tool family's syntax with the reasoning family's think markers."""
    return dataclasses.replace(
        tools,
        think_open=reasoning.think_open,
        think_close=reasoning.think_close,
        swallow=tuple(dict.fromkeys((*tools.swallow, *reasoning.swallow))),
        drop_open_in_reasoning=reasoning.drop_open_in_reasoning,
    )


def with_parsers(base: Family, reasoning_parser: str | None, tool_call_parser: str | None) -> Family:
    """`base` with the output parser the two names select (unchanged when neither is set)."""
    if not reasoning_parser and not tool_call_parser:
        return base
    reasoning = _lookup("reasoning parser", reasoning_parser) if reasoning_parser else base
    tools = _lookup("tool-call parser", tool_call_parser) if tool_call_parser else base
    if reasoning is tools:
        if reasoning is base:
            return base
        return dataclasses.replace(
            base,
            make_parser=tools.make_parser,
            starts_in_reasoning=tools.starts_in_reasoning,
            grammar=tools.grammar,  # constraints are written in the syntax the parser reads
        )
    r_syntax, t_syntax = _syntax(reasoning), _syntax(tools)
    for family, syntax in ((reasoning, r_syntax), (tools, t_syntax)):
        if syntax is None:
            raise ParserChoiceError(
                f"reasoning parser {reasoning.name!r} and tool-call parser {tools.name!r} cannot be "
                f"combined: {family.name}'s output grammar carries reasoning and calls together; "
                f"set both to {family.name!r}"
            )
    assert r_syntax is not None and t_syntax is not None
    syntax = combined_syntax(r_syntax, t_syntax)

    def make_parser(options: ParserOptions) -> StreamParser:
        return StreamParser(syntax, options)

    return dataclasses.replace(
        base,
        make_parser=make_parser,
        starts_in_reasoning=reasoning.starts_in_reasoning,
        grammar=combined_grammar(reasoning.grammar, tools.grammar),
    )


def combined_grammar(reasoning: ToolGrammar | None, tools: ToolGrammar | None) -> ToolGrammar | None:
    """The tool family's call grammar with the reasoning family's think markers (None, so constrained
    requests are refused, where either lays out its whole output itself or has no grammar)."""
    if reasoning is None or tools is None or reasoning.layout is not None or tools.layout is not None:
        return None
    return dataclasses.replace(tools, think=reasoning.think)
