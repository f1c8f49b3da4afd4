"""A custom tool's grammar format (Responses `format`, Chat `custom.format.grammar`) as the schema
the constraint enforces on the tool's one `input` string (pure but for llguidance's cached verdict).

`regex` is the pattern as written; `lark` is checked by llguidance, then flattened into the regex its
start rule denotes (`constraints/lark_regex.py`): the input is a string argument in every family's
call syntax, which a pattern constrains. A regex or grammar llguidance cannot compile, or a Lark grammar that
is not regular (recursive rules, `%ignore`, special tokens), is a 400 naming the definition.
"""

from __future__ import annotations

from typing import Any

from agentserve.api.errors import InvalidRequestError
from agentserve.constraints.engine import lark_error, schema_error
from agentserve.constraints.lark_regex import LarkRegexError, lark_to_regex

CUSTOM_INPUT = "input"  # the one argument of a freeform tool offered as a function
SYNTAXES = ("lark", "regex")


def custom_input_schema(syntax: str, definition: str, param: str) -> dict[str, Any]:
    """The arguments schema enforcing `definition` on the input. Raises InvalidRequestError."""
    if syntax == "lark":
        error = lark_error(definition)
        if error is not None:
            raise InvalidRequestError(f"Invalid Lark grammar for the custom tool: {error}", param=param)
        try:
            definition = lark_to_regex(definition)
        except LarkRegexError as exc:
            raise InvalidRequestError(f"This Lark grammar cannot be enforced: {exc}", param=param) from None
    # The whole input matches (a JSON Schema `pattern` alone matches anywhere in the string).
    schema = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "pattern": f"^(?:{definition})$"}},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }
    if syntax == "regex":  # refused here, naming the definition (not later, as the tool's schema)
        error = schema_error(schema)
        if error is not None:
            raise InvalidRequestError(f"Invalid regex for the custom tool: {error}", param=param)
    return schema
