"""The request → grammar source: a pure function of the decoded options, the tools and the family.

    start: reasoning? body
    reasoning: <think> thought </think>            free, or at most `budget_tokens` tokens
    body:  auto  → text? calls?                     (calls: ≤ 1 without parallel calls)
           none  → text                             (no call marker can appear)
           required / any / named → WS? calls       (≥ 1 call, no text first; named: that tool only)
           JSON output → WS? %json{schema}          (with tools under auto: or a call)

The grammar applies after the reasoning block: thinking stays free (vLLM's and SGLang's default,
`enable_in_reasoning=False`) except for its length when a budget is set. Calls are written in the
family's own syntax (`families.grammar.ToolGrammar`); a call's arguments follow its tool's schema when
the tool is strict or the call is forced, else any JSON object.

Nothing here compiles: `constraints.engine` validates and compiles the source with llguidance.
Requests that need no constraint (auto tools without strict or parallel limits, no output format, no
budget) get None and cost nothing downstream.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentserve.api.options import GenerationOptions
from agentserve.constraints.spec import Constraint
from agentserve.conversation import ToolSpec
from agentserve.families.grammar import (
    ANY_OBJECT,
    CallCount,
    GrammarTool,
    GrammarUnsupported,
    Markers,
    Shape,
    ToolGrammar,
    json_rule,
    text_without,
)

ParamKind = Literal["tools", "tool_name", "tool_choice", "response_format", "thinking"]
ANY_JSON_OBJECT: Mapping[str, Any] = {"type": "object"}


class ConstraintError(ValueError):
    """A request whose constraint cannot be built or enforced: the API's 400, naming the field
    (`kind`, and `index` for a tool)."""

    def __init__(self, message: str, kind: ParamKind, index: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.index = index


@dataclass(frozen=True, slots=True)
class Plan:
    """What the body of the output may hold, decided from the options alone."""

    tools: tuple[GrammarTool, ...]  # the tools a call may name, schemas as enforced
    count: CallCount | None  # None: no calls at all
    text: bool  # free text may open the body
    json_schema: Mapping[str, Any] | None  # the answer must be this JSON value (or a call, if any)
    budget: int | None


def calls_askable(options: GenerationOptions, tools: Sequence[ToolSpec]) -> bool:
    """Whether the request may be answered with calls (tools offered, tool_choice not none): only
    then is content shaped like a call (Llama 3 JSON, pythonic) read as one, by the parser
    (`ParserOptions.calls_by_shape`) and the grammar alike."""
    return bool(tools) and options.tool_choice.mode != "none"


def needs_constraint(options: GenerationOptions, tools: Sequence[ToolSpec]) -> bool:
    """Whether the request asks for anything a grammar must enforce (cheap: no allocation)."""
    fmt = options.response_format
    if fmt is not None and fmt.type != "text":
        return True
    if options.reasoning.mode == "enabled" and options.reasoning.budget_tokens is not None:
        return True
    if not tools:
        return options.tool_choice.mode == "required"
    choice = options.tool_choice
    return (
        choice.mode != "auto"
        or choice.allowed is not None
        or not options.parallel_tool_calls
        or any(t.strict or t.enforce is not None for t in tools)
    )


def _enforced(tool: ToolSpec, forced: bool) -> Mapping[str, Any]:
    """The schema a call of `tool` must match: its own format (a custom tool's regex) always, its
    parameters when strict or forced, else any object."""
    if tool.enforce is not None:
        return tool.enforce
    return (tool.parameters or ANY_OBJECT) if (tool.strict or forced) else ANY_OBJECT


def plan(options: GenerationOptions, tools: Sequence[ToolSpec]) -> Plan:
    """The body's shape; raises ConstraintError for a choice the tools cannot satisfy."""
    choice = options.tool_choice
    fmt = options.response_format
    schema: Mapping[str, Any] | None = None
    if fmt is not None and fmt.type == "json_schema":
        schema = fmt.schema if fmt.schema is not None else ANY_JSON_OBJECT
    elif fmt is not None and fmt.type == "json_object":
        schema = ANY_JSON_OBJECT
    reasoning = options.reasoning
    budget = reasoning.budget_tokens if reasoning.mode == "enabled" else None
    offered = list(tools)
    if choice.allowed is not None:
        allowed = set(choice.allowed)
        offered = [t for t in offered if t.name in allowed]
    if choice.mode == "none" or not tools:
        if choice.mode in ("required", "named"):
            raise ConstraintError("tool_choice requires tools, but no tools were given", "tool_choice")
        return Plan((), None, schema is None, schema, budget)
    forced = choice.mode in ("required", "named")
    if choice.mode == "named":
        offered = [t for t in offered if t.name == choice.name]
        if not offered:
            raise ConstraintError(f"tool_choice names {choice.name!r}, which is not in tools", "tool_choice")
    if not offered:
        if forced:
            raise ConstraintError("tool_choice allows no tool that is in tools", "tool_choice")
        return Plan((), None, schema is None, schema, budget)
    grammar_tools = tuple(GrammarTool(t.name, _enforced(t, forced)) for t in offered)
    most = None if options.parallel_tool_calls else 1
    count = CallCount(1 if forced else 0, most)
    return Plan(grammar_tools, count, not forced and schema is None, None if forced else schema, budget)


def build(
    options: GenerationOptions,
    tools: Sequence[ToolSpec],
    grammar: ToolGrammar | None,
    markers: Markers,
    *,
    family: str,
    starts_in_reasoning: bool = False,
) -> Constraint | None:
    """The request's constraint, or None when it needs none."""
    if not needs_constraint(options, tools):
        return None
    body = plan(options, tools)
    if grammar is None:
        raise ConstraintError(
            f"constrained decoding (tool_choice, parallel_tool_calls, strict tools, a JSON output "
            f"format or a thinking budget) is not supported for the {family} family yet",
            "tool_choice",
        )
    if grammar.tool_names is not None:
        for tool in body.tools:
            if re.fullmatch(grammar.tool_names, tool.name) is None:
                index = next((i for i, t in enumerate(tools) if t.name == tool.name), None)
                message = f"tool name {tool.name!r} cannot be written in the {family} family's call syntax"
                raise ConstraintError(message, "tool_name", index)
    thinking = options.reasoning.enabled
    try:
        text = source(
            body, grammar, markers, starts_in_reasoning, thinking, shape_calls=calls_askable(options, tools)
        )
    except GrammarUnsupported as exc:
        index = next((i for i, t in enumerate(tools) if t.name == exc.tool), None)
        raise ConstraintError(f"Invalid schema for function {exc.tool!r}: {exc}", "tools", index) from None
    only = body.json_schema if json_only(body, grammar, starts_in_reasoning, thinking) else None
    return Constraint(text, only)


def source(
    body: Plan,
    grammar: ToolGrammar,
    markers: Markers,
    starts_in_reasoning: bool,
    thinking: bool | None,
    *,
    shape_calls: bool = True,
) -> str:
    """The Lark source of a planned body in the family's syntax. `shape_calls`: the parser reads
    content shaped like a call (`ToolGrammar.text_not_first`) as a call, so text cannot open so."""
    if grammar.layout is not None:
        shape = Shape(body.tools, body.count, body.text, body.json_schema, body.budget, starts_in_reasoning)
        return grammar.layout(shape, markers)
    rules: list[str] = []
    think = grammar.think
    start = "body"
    if think is not None and (starts_in_reasoning or thinking is not False):
        open_, close = think
        limit = f"[max_tokens={body.budget}]" if body.budget is not None else ""
        rules.append(f"thought{limit}: THOUGHT")
        rules.append(f"THOUGHT: {text_without([close], nonempty=False)}")
        if starts_in_reasoning:
            rules.append(f"reasoning: thought {markers.tok(close)}")
            start = "reasoning body"
        else:
            rules.append(f"reasoning: {markers.tok(open_)} thought {markers.tok(close)}")
            start = "reasoning? body"
    elif body.budget is not None and think is None and thinking is not False:
        raise ConstraintError("this model family has no thinking block to budget", "thinking")
    alternatives: list[str] = []
    if body.json_schema is not None:
        rules.append(f"answer: WS? {json_rule(body.json_schema)}")
        alternatives.append("answer")
    if body.count is not None:
        if grammar.calls is None:
            raise ConstraintError("this model family has no tool-call grammar", "tool_choice")
        rules.append(grammar.calls(body.tools, body.count, markers))
        if body.text and not grammar.calls_first:
            alternatives.append("TEXT? calls" if body.count.least == 0 else "TEXT calls")
        if body.text and body.count.least == 0:
            alternatives.append("TEXT")
        alternatives.append("WS? calls")
    elif body.text:
        alternatives.append("TEXT?")
    if body.text:
        not_first = grammar.text_not_first if shape_calls else ""
        rules.append(f"TEXT: {text_without(grammar.markers, not_first=not_first)}")
    if body.count is not None and body.count.least == 0 and not body.text and body.json_schema is None:
        alternatives.append("WS?")
    rules.append("WS: /[ \\t\\r\\n]+/")
    head = [f"start: {start}", "body: " + " | ".join(dict.fromkeys(alternatives))]
    return "\n".join(head + rules) + "\n"


def json_only(
    body: Plan, grammar: ToolGrammar | None, starts_in_reasoning: bool, thinking: bool | None
) -> bool:
    """The output is exactly one JSON value (no reasoning block, no calls, no text)."""
    thinks = starts_in_reasoning or thinking is not False
    reasons = grammar is not None and (grammar.think is not None or grammar.layout is not None) and thinks
    return body.json_schema is not None and body.count is None and not body.text and not reasons
