"""The sim's steering under every family's tool-call syntax, on generated schemas and scripts: the
output always passes the grammar, is the same with the remembered states as without them, and is
whole (the grammar accepts it) well within its budget."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_constraints import EOS, SCHEMAS, TOKENIZER

from agentserve.api.options import GenerationOptions, ResponseFormat, ToolChoice
from agentserve.constraints.build import ConstraintError, build
from agentserve.constraints.engine import Steered, engine_for
from agentserve.conversation import ToolSpec
from agentserve.families import FAMILIES, Family
from agentserve.families.grammar import Markers

ENGINE = engine_for(TOKENIZER.to_json())
WITH_CALLS = [f for f in FAMILIES if f.grammar is not None]
# Words that break each syntax: quotes, braces, escapes, XML closers, a pythonic call's parentheses
WORDS = ["the", "file", '"quoted"', "{", "}", "[1,", "2]", "a\\b", "line\n", "42", "é", "👋", "null", ","]
WORDS += ["</parameter>", "<", ">", "=", "(", ")"]
PROSE = st.lists(st.sampled_from(WORDS), max_size=120).map(" ".join)
BASH = {
    "type": "object",
    "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
    "required": ["command"],
}


def options(kind: str, schema: dict[str, Any]) -> GenerationOptions:
    if kind == "json":
        return GenerationOptions("m", response_format=ResponseFormat("json_schema", schema))
    if kind == "named":
        return GenerationOptions("m", tool_choice=ToolChoice("named", "Bash"))
    return GenerationOptions("m", tool_choice=ToolChoice("required"), parallel_tool_calls=kind != "one")


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    family=st.sampled_from(WITH_CALLS),
    schema=SCHEMAS,
    prose=PROSE,
    seed=st.integers(0, 5),
    kind=st.sampled_from(["required", "one", "named", "json"]),
)
def test_every_family_steers_generated_cases_to_whole_valid_answers(
    family: Family, schema: dict[str, Any], prose: str, seed: int, kind: str
) -> None:
    assert family.grammar is not None
    markers = Markers(ENGINE.specials(family.grammar.marker_strings))
    other = schema if schema.get("type") == "object" else {"type": "object", "properties": {"v": schema}}
    tools = (ToolSpec("Bash", "", BASH, strict=True), ToolSpec("Other", "", other, strict=True))
    try:
        constraint = build(options(kind, schema), tools, family.grammar, markers, family=family.name)
    except ConstraintError:  # a schema this syntax cannot enforce (an XML raw value's `maxLength`)
        return
    assert constraint is not None
    script = TOKENIZER.encode(prose)

    def steer(remembered: bool) -> Steered:
        matcher = ENGINE.matcher(constraint.grammar, EOS)
        return ENGINE.steer(
            matcher, constraint.grammar, script, eos=EOS, max_tokens=len(script) + 400, rng=seed,
            stop_ids=EOS, at_start=remembered,
        )  # fmt: skip

    fresh, remembered = steer(False), steer(True)
    assert (fresh.token_ids, fresh.complete, fresh.copied) == (
        remembered.token_ids,
        remembered.complete,
        remembered.copied,
    )
    check = ENGINE.matcher(constraint.grammar, EOS)
    assert check.try_consume_tokens(fresh.token_ids) == len(fresh.token_ids)
    assert fresh.complete, (family.name, kind, TOKENIZER.decode(fresh.token_ids)[-200:])
