"""DeepSeek-R1 (and R1-0528, R1 distills): reasoning from the first token until `</think>`.

Raw output::

    reasoning…
    </think>

    answer<｜end▁of▁sentence｜>

The prompt ends with `<｜Assistant｜>` and, in updated templates, `<think>\\n`: so the output may or
may not repeat the opener, and a leading `<think>` is dropped. R1-0528 calls tools in the DeepSeek V3
form (`function<｜tool▁sep｜>NAME` + fenced JSON), parsed by the DeepSeek V3 block; a call block
inside the reasoning ends the reasoning, so the call is never lost in the thought.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from agentserve.families.base import Family
from agentserve.families.deepseek_v31 import GRAMMAR as V31_GRAMMAR

# The output syntax is V3.1's (the same block reads both call forms): its parser, SYNTAX included.
from agentserve.families.deepseek_v31 import SEP, calls_section, make_parser
from agentserve.families.grammar import (
    CallCount,
    GrammarTool,
    Markers,
    alternatives,
    json_rule,
    lit,
)
from agentserve.families.tokens import DEEPSEEK


def grammar_calls(tools: Sequence[GrammarTool], count: CallCount, m: Markers) -> str:
    """`calls`: the V3 form, `function<｜tool▁sep｜>NAME` + the JSON arguments in a ```json fence."""
    bodies = alternatives(
        [
            f'"function" {m.tok(SEP)} {lit(t.name)} WS? "```json" WS? {json_rule(t.schema)} WS? "```"'
            for t in tools
        ]
    )
    return calls_section(count, m, bodies, space_before_end=True)


# V3.1's grammar (markers, reasoning) with the V3 form of a call.
GRAMMAR = replace(V31_GRAMMAR, calls=grammar_calls)


FAMILY = Family(
    name="deepseek-r1",
    description="DeepSeek-R1 / R1-0528 / R1 distills: reasoning until </think>, V3-style tool calls",
    make_parser=make_parser,
    aliases=("deepseek_r1", "deepseekr1", "deepseek-r1-0528"),
    model_patterns=(r"deepseek-r1",),
    starts_in_reasoning=True,
    stop_tokens=("<｜end▁of▁sentence｜>",),
    special_tokens=DEEPSEEK,
    grammar=GRAMMAR,
)
