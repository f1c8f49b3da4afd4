"""`constraints.lark_texts`: the fixed texts of a grammar, read past what only looks like them."""

from __future__ import annotations

import pytest
from test_constraints import EOS, TOKENIZER

from agentserve.api.options import GenerationOptions, ToolChoice
from agentserve.constraints.build import build
from agentserve.constraints.engine import engine_for
from agentserve.constraints.lark_texts import LarkTexts, lark_texts
from agentserve.conversation import ToolSpec
from agentserve.families import FAMILIES, get_family
from agentserve.families.grammar import Markers

ENGINE = engine_for(TOKENIZER.to_json())


def test_literals_stops_and_lazy_closers_are_read_in_order() -> None:
    grammar = "\n".join(
        [
            'start: "<p>" body  // a "commented" quote',
            'body: v2 "B" | v1 "A" | "B"',
            'v1[stop="</parameter>"]: /(.|\\n)*/',
            "pvalue[lazy]: /(.|\\n)*<\\/parameter>/",
            "other[lazy]: /(.|\\n)*a+b/",  # a regex, not a text, after the any-text
            'x: "a\\"b" | "</function>"',
        ]
    )
    assert lark_texts(grammar) == LarkTexts(
        literals=("<p>", "B", "A", 'a"b', "</function>"),
        stops=("</parameter>",),
        lazy_closers=("</parameter>",),
    )


@pytest.mark.parametrize(
    "trap",
    [
        '%json{"description":"ends in a space ","x":{"const":"</fake>"}}',  # a JSON string's close
        '%json{"a":"( | ","b":"{\\"}"}',  # braces and quotes inside JSON strings
        '/"quoted"[a-z]+/',  # quotes inside a regex
        '"bad \\w escape"',  # not a JSON escape: left out, never raised
        '# "a comment"',
    ],
)
def test_what_only_looks_like_a_literal_is_no_literal(trap: str) -> None:
    grammar = f'start: "<a>" rest end\nrest: {trap}\nend: "</b>"\n'
    assert lark_texts(grammar).literals == ("<a>", "</b>")


@pytest.mark.parametrize("name", [f.name for f in FAMILIES if f.grammar is not None])
def test_descriptions_and_patterns_that_hold_quotes_leave_every_familys_literals_alone(name: str) -> None:
    """A tool whose descriptions end in a space or `(` and whose pattern holds quotes (what made a
    scan by regex read text out of the `%json` schema, or raise on its escapes)."""
    family = get_family(name)
    assert family.grammar is not None
    schema = {
        "type": "object",
        "description": "Run it ",
        "properties": {
            "command": {"type": "string", "description": 'The shell command to run ( "quoted" | '},
            "mode": {"type": "string", "enum": ["fast ", "slow("]},
        },
        "required": ["command"],
    }
    markers = Markers(ENGINE.specials(family.grammar.marker_strings))
    options = GenerationOptions("m", tool_choice=ToolChoice("required"))
    constraint = build(
        options, (ToolSpec("Bash", "", schema, strict=True),), family.grammar, markers, family=name
    )
    assert constraint is not None
    texts = lark_texts(constraint.grammar)
    assert not any("shell command" in t or "Run it" in t for t in texts.literals), texts.literals
    steered = ENGINE.steer(
        ENGINE.matcher(constraint.grammar, EOS), constraint.grammar, TOKENIZER.encode("ok"), eos=EOS,
        max_tokens=200, rng=0, stop_ids=EOS, at_start=True,
    )  # fmt: skip
    assert steered.complete
    assert ENGINE.matcher(constraint.grammar, EOS).try_consume_tokens(steered.token_ids) == len(
        steered.token_ids
    )
