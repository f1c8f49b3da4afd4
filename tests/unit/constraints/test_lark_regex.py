"""Lark grammars flattened into regexes (constraints/lark_regex.py): the same language as
llguidance's reading of the grammar, on generated strings; what cannot be flattened is refused."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentserve.constraints.engine import engine_for, lark_error
from agentserve.constraints.lark_regex import LarkRegexError, lark_to_regex

BYTES = engine_for(None)  # a byte tokenizer: one token per byte

EDIT = r"""
// a small edit script: a header, one or more changes, a footer
start: "BEGIN" LF change+ "END" LF?
change: add | drop | "~ " name LF
add: "+ " name (" = " value)? LF
drop: "- " name LF
name: /[a-z_][a-z0-9_]*/
value: NUMBER | "'" /[^'\n]*/ "'" | "true"i
%import common.LF
%import common.NUMBER
"""
LIST = '?start: item ("," item)*\nitem: "a".."c" | DIGIT~1..2\n%import common (DIGIT)\n'
GRAMMARS = (EDIT, LIST)


def llguidance_accepts(grammar: str, text: str) -> bool:
    matcher = BYTES.matcher(grammar)
    data = list(text.encode())
    return matcher.try_consume_tokens(data) == len(data) and matcher.is_accepting()


SAMPLES = st.lists(
    st.sampled_from(
        [
            "BEGIN\n",
            "END\n",
            "END",
            "+ x",
            "+ ab_1 = 42\n",
            "- y\n",
            "~ z\n",
            " = 'hi'\n",
            "TRUE",
            "\n",
            "a",
            "b",
            ",",
            "7",
            "42",
            "d",
            "x",
            " ",
            "'",
        ]
    ),
    max_size=8,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=SAMPLES)
def test_the_regex_accepts_what_llguidance_accepts(text: str) -> None:
    for grammar in GRAMMARS:
        assert lark_error(grammar) is None
        flat = lark_to_regex(grammar)
        assert (re.fullmatch(flat, text) is not None) == llguidance_accepts(grammar, text), (grammar, text)


def test_known_members() -> None:
    flat = lark_to_regex(EDIT)
    assert re.fullmatch(flat, "BEGIN\n+ x = 'a b'\n- y\n~ z\nEND\n")
    assert re.fullmatch(flat, "BEGIN\n+ x = TRUE\nEND")
    assert not re.fullmatch(flat, "BEGIN\nEND\n")  # change+ needs one
    assert re.fullmatch(lark_to_regex(LIST), "a,12,c") and not re.fullmatch(lark_to_regex(LIST), "a,123")


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        ('start: x\nx: "(" x ")" | "o"\n', "recursive"),
        ('start: "a"\n%ignore " "\n', "%ignore"),
        ("start: <|im_end|>\n", "special token"),
        ('start: %json{"type": "string"}\n', "cannot be inlined"),
        ('x: "a"\n', "no `start` rule"),
        ("start: y\n", "'y' is not defined"),
        ("start: FOO\n%import common.FOO\n", "unknown common terminal"),
        ("start: /a/l\n", "flags"),
    ],
)
def test_what_cannot_be_flattened_is_refused(grammar: str, message: str) -> None:
    with pytest.raises(LarkRegexError, match=re.escape(message)):
        lark_to_regex(grammar)


def test_llguidance_names_what_it_cannot_compile() -> None:
    assert lark_error("start: (") is not None
    assert lark_error(EDIT) is None
