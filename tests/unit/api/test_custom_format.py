"""Custom tools' grammar formats on Chat and Responses: the schema the constraint enforces on the
input, and the 400 naming the definition when a grammar cannot be enforced."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agentserve.api.chat import decode_chat
from agentserve.api.errors import InvalidRequestError
from agentserve.api.responses import decode_responses
from agentserve.api.signing import Signer

SIGNER = Signer(b"c" * 32)
LARK = 'start: word (" " word)*\nword: /[a-z]+/\n'


def chat(fmt: dict[str, Any]) -> Any:
    tool = {"type": "custom", "custom": {"name": "t", "format": fmt}}
    return decode_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [tool]})


def responses(fmt: dict[str, Any]) -> Any:
    tool = {"type": "custom", "name": "t", "format": fmt}
    return decode_responses({"model": "m", "input": "x", "tools": [tool]}, signer=SIGNER)


def pattern(request: Any) -> str:
    (tool,) = request.conversation.tools
    assert tool.enforce is not None and tool.enforce["required"] == ["input"]
    return str(tool.enforce["properties"]["input"]["pattern"])


def test_both_apis_enforce_lark_and_regex_formats() -> None:
    for request in (
        chat({"type": "grammar", "grammar": {"syntax": "lark", "definition": LARK}}),
        responses({"type": "grammar", "syntax": "lark", "definition": LARK}),
    ):
        flat = pattern(request)
        assert re.fullmatch(flat, "hello big world") and not re.fullmatch(flat, "hello  world")
    assert pattern(chat({"type": "grammar", "grammar": {"syntax": "regex", "definition": "[0-9]+"}})) == (
        "^(?:[0-9]+)$"
    )
    (tool,) = chat({"type": "text"}).conversation.tools
    assert tool.enforce is None


@pytest.mark.parametrize(
    ("definition", "message"),
    [("start: (", "Invalid Lark grammar"), ('start: a\na: "x" a | "y"\n', "cannot be enforced")],
)
def test_grammars_that_cannot_be_enforced_are_400s_naming_the_definition(
    definition: str, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message) as caught:
        chat({"type": "grammar", "grammar": {"syntax": "lark", "definition": definition}})
    assert caught.value.param == "tools[0].custom.format.grammar.definition"
    with pytest.raises(InvalidRequestError, match=message) as caught:
        responses({"type": "grammar", "syntax": "lark", "definition": definition})
    assert caught.value.param == "tools[0].format.definition"
    with pytest.raises(InvalidRequestError) as caught:
        chat({"type": "grammar", "grammar": {"syntax": "ebnf", "definition": "x"}})
    assert caught.value.param == "tools[0].custom.format.grammar.syntax"
