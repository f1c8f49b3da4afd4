"""The constraint builder (pure) and the sim's steering over the real grammar engine.

Every output the steering produces must be accepted by the grammar; with a JSON-schema output it
must validate (jsonschema) — for hand-picked cases and ≥ 500 hypothesis-generated schemas (objects,
arrays, enums, bounded numbers, anyOf, patterns), whatever the script says.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parents[1] / "prompt"))
from prompt_cases import FAMILY_NAMES, KWARGS, cases

from agentserve.api.options import GenerationOptions, ReasoningOptions, ResponseFormat, ToolChoice
from agentserve.constraints.build import ConstraintError, build, needs_constraint
from agentserve.constraints.engine import engine_for, schema_error, steer
from agentserve.conversation import ToolSpec
from agentserve.families import get_family
from agentserve.families.grammar import Markers
from agentserve.worker.tokenizer import EMBEDDED_TOKENIZER, HFTokenizer

TOKENIZER = HFTokenizer.from_file(EMBEDDED_TOKENIZER)
ENGINE = engine_for(TOKENIZER.to_json())
QWEN3 = get_family("qwen3")
assert QWEN3.grammar is not None
MARKERS = Markers(ENGINE.specials(QWEN3.grammar.marker_strings))
EOS = (TOKENIZER.encode("<|im_end|>")[0],)
BASH = ToolSpec(
    "Bash", "", {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
)
READ = ToolSpec(
    "Read", "", {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
)


def run(options: GenerationOptions, script: str, tools: tuple[ToolSpec, ...] = (BASH, READ)) -> str:
    constraint = build(options, tools, QWEN3.grammar, MARKERS, family="qwen3")
    assert constraint is not None
    assert ENGINE.check(constraint.grammar, EOS) is None
    matcher = ENGINE.matcher(constraint.grammar, EOS)
    steered = steer(
        matcher,
        TOKENIZER.encode(script),
        max_tokens=2000,
        rng=random.Random(0),
        preferred=ENGINE.preferred(EOS),
        closing=ENGINE.closing(EOS),
        stop_ids=EOS,
    )
    assert steered.complete, (TOKENIZER.decode(steered.token_ids)[:300], constraint.grammar[-600:])
    # Every token passed the grammar: a fresh matcher accepts the whole output.
    check = ENGINE.matcher(constraint.grammar, EOS)
    assert check.try_consume_tokens(steered.token_ids) == len(steered.token_ids)
    return TOKENIZER.decode(steered.token_ids)


def call(name: str, arguments: Any) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


TWO = (
    "<think>\nhm\n</think>\n\nSure.\n" + call("Bash", {"command": "ls"}) + "\n" + call("Read", {"path": "a"})
)


def calls_in(text: str) -> list[dict[str, Any]]:
    parts = text.split("<tool_call>")[1:]
    return [json.loads(p.split("</tool_call>")[0]) for p in parts]


def test_no_constraint_without_a_reason() -> None:
    assert not needs_constraint(GenerationOptions("m"), (BASH,))
    assert build(GenerationOptions("m"), (BASH,), QWEN3.grammar, MARKERS, family="qwen3") is None
    assert needs_constraint(GenerationOptions("m", parallel_tool_calls=False), (BASH,))
    assert not needs_constraint(GenerationOptions("m", parallel_tool_calls=False), ())


def test_each_tool_choice_is_obeyed_against_the_script() -> None:
    assert calls_in(run(GenerationOptions("m", tool_choice=ToolChoice("none")), TWO)) == []
    assert [c["name"] for c in calls_in(run(GenerationOptions("m", parallel_tool_calls=False), TWO))] == [
        "Bash"
    ]
    named = calls_in(run(GenerationOptions("m", tool_choice=ToolChoice("named", "Read")), TWO))
    assert named == [{"name": "Read", "arguments": {"path": "a"}}]
    forced = run(GenerationOptions("m", tool_choice=ToolChoice("required")), "<think>\nx\n</think>\n\nNo.")
    assert len(calls_in(forced)) >= 1
    allowed = ToolChoice("required", allowed=("Read",))
    assert {c["name"] for c in calls_in(run(GenerationOptions("m", tool_choice=allowed), TWO))} == {"Read"}


def test_strict_arguments_match_their_schema() -> None:
    strict = (ToolSpec("Bash", "", BASH.parameters, strict=True),)
    out = run(GenerationOptions("m"), call("Bash", {"command": 5}), strict)
    (got,) = calls_in(out)
    jsonschema.validate(got["arguments"], BASH.parameters)


def test_the_budget_closes_the_thought() -> None:
    script = "<think>\n" + " ".join(["ponder"] * 300) + "\n</think>\n\nDone."
    out = run(GenerationOptions("m", reasoning=ReasoningOptions("enabled", budget_tokens=50)), script, ())
    thought, _, answer = out.partition("</think>")
    assert len(TOKENIZER.encode(thought)) <= 51 and answer.strip().startswith("Done.")


def test_bad_choices_and_schemas_are_refused() -> None:
    with pytest.raises(ConstraintError):
        build(
            GenerationOptions("m", tool_choice=ToolChoice("required")), (), QWEN3.grammar, MARKERS, family="q"
        )
    with pytest.raises(ConstraintError):
        build(
            GenerationOptions("m", tool_choice=ToolChoice("named", "X")),
            (BASH,),
            QWEN3.grammar,
            MARKERS,
            family="q",
        )
    with pytest.raises(ConstraintError, match="not supported for the mistral family"):
        build(
            GenerationOptions("m", tool_choice=ToolChoice("none")), (BASH,), None, Markers(), family="mistral"
        )
    assert schema_error({"type": "strin"}) is not None
    assert schema_error({"type": "string", "format": "foo"}) is not None
    assert schema_error(BASH.parameters) is None


def test_compiles_are_cached() -> None:
    options = GenerationOptions("m", tool_choice=ToolChoice("named", "Bash"))
    constraint = build(options, (BASH, READ), QWEN3.grammar, MARKERS, family="qwen3")
    assert constraint is not None
    ENGINE.check(constraint.grammar, EOS)
    before = ENGINE.compiles
    for _ in range(5):
        ENGINE.matcher(constraint.grammar, EOS)
    assert ENGINE.compiles == before


# --------------------------------------------------------------------------------------------------
# Generated schemas: every constrained output validates


def leaf() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.just({"type": "string"}),
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(1, 8)),
        st.lists(st.text("abcxyz", min_size=1, max_size=6), min_size=1, max_size=4, unique=True).map(
            lambda v: {"enum": v}
        ),
        st.tuples(st.integers(-50, 50), st.integers(0, 100)).map(
            lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}
        ),
        st.tuples(st.integers(-5, 5), st.integers(1, 10)).map(
            lambda t: {"type": "number", "minimum": t[0], "maximum": t[0] + t[1]}
        ),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.sampled_from(["^[a-z]{2,5}$", "^[0-9]{3}-[0-9]{2}$", "^(yes|no)$"]).map(
            lambda p: {"type": "string", "pattern": p}
        ),
    )


def node(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    props = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=5), children, min_size=1, max_size=4)
    obj = st.tuples(props, st.booleans(), st.booleans()).map(
        lambda t: {
            "type": "object",
            "properties": t[0],
            "required": sorted(t[0]) if t[1] else sorted(t[0])[:1],
            **({"additionalProperties": False} if t[2] else {}),
        }
    )
    arr = st.tuples(children, st.integers(0, 2), st.integers(0, 3)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]}
    )
    any_of = st.lists(children, min_size=2, max_size=3).map(lambda v: {"anyOf": v})
    return st.one_of(obj, arr, any_of)


SCHEMAS = st.recursive(leaf(), node, max_leaves=8).map(
    lambda s: (
        s if s.get("type") == "object" else {"type": "object", "properties": {"v": s}, "required": ["v"]}
    )
)
SCRIPTS = st.sampled_from(
    [
        "<think>\nok\n</think>\n\nThe answer is 42.",
        '{"a": "wrong", "b": [1, 2, 3]}',
        call("Bash", {"command": "ls"}),
        "",
    ]
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS, script=SCRIPTS)
def test_generated_schemas_always_validate(schema: dict[str, Any], script: str) -> None:
    assert schema_error(schema) is None, schema
    options = GenerationOptions("m", response_format=ResponseFormat("json_schema", schema))
    out = run(options, script, ())
    _, _, body = out.rpartition("</think>")
    body = body.removesuffix("<|im_end|>")
    jsonschema.validate(json.loads(body), schema)


@pytest.mark.parametrize("name", [n for n in FAMILY_NAMES if n not in ("llama3-json", "pythonic")])
def test_every_reasoning_family_closes_its_thought_at_the_budget(name: str) -> None:
    """The family's canonical answer with a 300-word thought, under a 40-token budget: the parser
    sees a thought of at most 40 tokens, then the family's own answer."""
    from agentserve.conversation import ReasoningDelta, TextDelta
    from agentserve.parsing.stream import ParserOptions

    family = get_family(name)
    assert family.grammar is not None
    answer = {c.name: c.raw for c in cases(name)}["answer"]
    script = answer.replace("Both are known now.", " ".join(["ponder"] * 300))
    opened = family.starts_in_reasoning or bool(KWARGS.get(name, {}).get("enable_thinking"))
    markers = Markers(ENGINE.specials(family.grammar.marker_strings))
    options = GenerationOptions("m", reasoning=ReasoningOptions("enabled", budget_tokens=40))
    constraint = build(options, (), family.grammar, markers, family=name, starts_in_reasoning=opened)
    assert constraint is not None
    eos = tuple(TOKENIZER.encode(t)[0] for t in family.stop_tokens if len(TOKENIZER.encode(t)) == 1)
    steered = steer(
        ENGINE.matcher(constraint.grammar, eos),
        TOKENIZER.encode(script),
        max_tokens=1000,
        rng=random.Random(0),
        preferred=ENGINE.preferred(eos),
        closing=ENGINE.closing(eos),
        stop_ids=eos,
        prefixes=ENGINE.prefixes,
    )
    assert steered.complete, name
    parser = family.parser(ParserOptions(starts_in_reasoning=opened))
    events = parser.feed(TOKENIZER.decode(steered.token_ids)) + parser.close()
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert 0 < len(TOKENIZER.encode(thought)) <= 41, name
    assert "Paris is 18C and Rome is 21C." in text, (name, text)


def test_a_budget_that_cannot_bind_needs_no_grammar() -> None:
    """Claude Code sends budget_tokens 31999 with max_tokens 32000; where the model's output limit
    clamps max_tokens below the budget, nothing is left to enforce: no grammar. Nor on a family
    without a reasoning block."""
    from agentserve.api.request import DecodedRequest
    from agentserve.conversation import Conversation, Message, Text
    from agentserve.frontend.constrain import Constrainer

    def request(budget: int) -> DecodedRequest:
        reasoning = ReasoningOptions("enabled", budget_tokens=budget)
        options = GenerationOptions("m", max_tokens=32000, reasoning=reasoning)
        conversation = Conversation(messages=(Message("user", (Text("hi"),)),))
        return DecodedRequest(api="anthropic", conversation=conversation, options=options)

    qwen3 = Constrainer(QWEN3, TOKENIZER.to_json, EOS)
    unclamped = qwen3.constraint(request(31999), starts_in_reasoning=False, max_tokens=32000)
    assert unclamped is not None and "max_tokens=31999" in unclamped.grammar
    assert qwen3.constraint(request(31999), starts_in_reasoning=False, max_tokens=8192) is None
    bound = qwen3.constraint(request(2048), starts_in_reasoning=False, max_tokens=32000)
    assert bound is not None and "max_tokens=2048" in bound.grammar
    llama = Constrainer(get_family("llama3-json"), TOKENIZER.to_json, EOS)
    assert llama.constraint(request(2048), starts_in_reasoning=False, max_tokens=32000) is None
