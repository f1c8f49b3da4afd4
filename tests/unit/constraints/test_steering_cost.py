"""The sim's steering fast paths (issue 22's mask cost): the same guarantees as a mask at every step,
with a vocabulary mask computed only where the script's token is refused and a replacement must be
chosen. Every output here is checked on an independent matcher."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from test_constraints import BASH, EOS, MARKERS, QWEN3, READ, SCHEMAS, TOKENIZER, call, calls_in

from agentserve.api.options import GenerationOptions, ReasoningOptions, ResponseFormat, ToolChoice
from agentserve.constraints.build import build
from agentserve.constraints.engine import Steered, bulk_safe, engine_for
from agentserve.constraints.spec import Constraint
from agentserve.conversation import ToolSpec
from agentserve.families import FAMILIES, Family, get_family
from agentserve.families.grammar import Markers
from agentserve.parsing.events import ToolCallEnd, ToolCallStart
from agentserve.parsing.stream import ParserOptions
from agentserve.worker.constrained import constrained_plan
from agentserve.worker.engine import SamplingParams
from agentserve.worker.tokenizer import token_pieces

ENGINE = engine_for(TOKENIZER.to_json())


def grammar(options: GenerationOptions, tools: tuple[ToolSpec, ...] = (BASH, READ)) -> str:
    constraint = build(options, tools, QWEN3.grammar, MARKERS, family="qwen3")
    assert constraint is not None
    return constraint.grammar


def sim_steer(source: str, script: str, seed: int = 0, max_tokens: int = 2000) -> Steered:
    """What the sim emits (`GrammarEngine.steer`: every fast path on), checked on a fresh matcher."""
    steered = ENGINE.steer(
        ENGINE.matcher(source, EOS),
        source,
        TOKENIZER.encode(script),
        eos=EOS,
        max_tokens=max_tokens,
        rng=random.Random(seed),
        stop_ids=EOS,
    )
    check = ENGINE.matcher(source, EOS)
    assert check.try_consume_tokens(steered.token_ids) == len(steered.token_ids)
    return steered


def test_a_script_the_grammar_allows_costs_no_mask() -> None:
    script = call("Bash", {"command": "ls -la"})
    steered = sim_steer(grammar(GenerationOptions("m", tool_choice=ToolChoice("required"))), script)
    ids = TOKENIZER.encode(script)
    assert steered.token_ids == ids and steered.complete  # it ends as the script does: no end token added
    assert steered.masks == 0 and steered.diverged == 0
    assert steered.copied == ((0, 0, len(ids)),)


def test_prose_under_a_forced_call_masks_only_where_a_token_is_chosen() -> None:
    """Prose where a call is required: the call's syntax, keys and punctuation come from the
    grammar's forced bytes or a mask, the prose continues inside the free string, and no drawn
    token is whitespace alone (it would leave the output where it was)."""
    prose = " ".join(["word"] * 200)
    source = grammar(GenerationOptions("m", tool_choice=ToolChoice("required")), (BASH,))
    for seed in range(6):
        steered = sim_steer(source, prose, seed)
        assert steered.complete
        text = TOKENIZER.decode(steered.token_ids)
        (got,) = [json.loads(p.split("</tool_call>")[0]) for p in text.split("<tool_call>")[1:]]
        assert got["name"] == "Bash"
        copied = sum(length for _, _, length in steered.copied)
        assert copied >= 180  # the script's words went on (in the thought or the argument)
        # a handful of masks for ~20 tokens of syntax, not one per token
        assert steered.masks <= 20, (seed, steered.masks, text[-200:])
        chosen = [t for k, t in enumerate(steered.token_ids) if not _in_runs(k, steered.copied)]
        assert not [t for t in chosen if t in ENGINE.blank()], text


def _in_runs(k: int, runs: tuple[tuple[int, int, int], ...]) -> bool:
    return any(at <= k < at + length for at, _, length in runs)


def test_forced_text_resumes_the_scripts_own_copy() -> None:
    """A named tool while the script calls another first: the script's own call of that tool is
    found again (its arguments kept), as the mask's resync would find it."""
    script = "Sure.\n" + call("Bash", {"command": "ls"}) + "\n" + call("Read", {"path": "a.py"})
    steered = sim_steer(grammar(GenerationOptions("m", tool_choice=ToolChoice("named", "Read"))), script)
    text = TOKENIZER.decode(steered.token_ids)
    assert [json.loads(p.split("</tool_call>")[0]) for p in text.split("<tool_call>")[1:]] == [
        {"name": "Read", "arguments": {"path": "a.py"}}
    ]


def test_a_token_budget_turns_bulk_validation_off() -> None:
    """llguidance's `validate_tokens` does not count `max_tokens` past a run's first token: a budget
    grammar is consumed token by token, and the thought still ends at the budget."""
    budget = grammar(GenerationOptions("m", reasoning=ReasoningOptions("enabled", budget_tokens=30)), ())
    assert not bulk_safe(budget)
    assert bulk_safe(grammar(GenerationOptions("m", tool_choice=ToolChoice("required"))))
    script = "<think>\n" + " ".join(["ponder"] * 200) + "\n</think>\n\nDone."
    steered = sim_steer(budget, script)
    thought, _, answer = TOKENIZER.decode(steered.token_ids).partition("</think>")
    assert len(TOKENIZER.encode(thought)) <= 31 and answer.strip().startswith("Done.")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS)
def test_generated_schemas_validate_through_the_sims_fast_paths(schema: dict[str, Any]) -> None:
    options = GenerationOptions("m", response_format=ResponseFormat("json_schema", schema))
    source = grammar(options, ())
    for script in ('Here: {"a": "wrong", "b": [1, 2, 3]} done', "<think>\nok\n</think>\n\nThe answer."):
        steered = sim_steer(source, script)
        assert steered.complete
        body = TOKENIZER.decode(steered.token_ids).rpartition("</think>")[2].removesuffix("<|im_end|>")
        jsonschema.validate(json.loads(body), schema)


@pytest.mark.parametrize(
    "script",
    [
        'Voilà: {"note": "naïve café ☕ — 東京 👋🏽", "n": "x"}',
        "<think>\n日本語で考える 🤔\n</think>\n\n" + '{"note": "emoji 👩‍👩‍👧 ok"}',
    ],
)
def test_streamed_pieces_reuse_the_script_and_join_to_the_output(script: str) -> None:
    schema = {
        "type": "object",
        "properties": {"note": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["note", "n"],
        "additionalProperties": False,
    }
    constraint = Constraint(
        grammar(GenerationOptions("m", response_format=ResponseFormat("json_schema", schema)), ())
    )
    ids = TOKENIZER.encode(script)
    pieces = token_pieces(TOKENIZER, ids)
    sampling = SamplingParams(max_tokens=300, stop_token_ids=EOS, include_stop=True)
    plan = constrained_plan(
        TOKENIZER, constraint, script=ids, pieces=pieces, sampling=sampling, need=300, seed=3
    )
    assert plan.complete and len(plan.pieces) == len(plan.token_ids)
    assert "".join(plan.pieces) == TOKENIZER.decode(plan.token_ids)
    value = json.loads(TOKENIZER.decode(plan.token_ids).rpartition("</think>")[2].removesuffix("<|im_end|>"))
    jsonschema.validate(value, schema)
    # the note's text is the script's, streamed in the script's own pieces
    note = json.loads(script[script.index("{") :])["note"]
    assert value["note"] == note
    assert any(p and p in note and p in pieces for p in plan.pieces)


def test_a_forced_call_is_written_the_same_whatever_the_seed() -> None:
    """Prose where a call is required: the call is opened with the grammar's own opener and `{`
    (`_OPENERS`) rather than a seeded draw, so every seed gives the same plan (the memo shares it),
    and its steps are decided by a few candidates checked with `validate_tokens`, without a mask."""
    prose = " ".join(["word"] * 200)
    source = grammar(GenerationOptions("m", tool_choice=ToolChoice("required")), (BASH,))
    runs = [sim_steer(source, prose, seed) for seed in range(4)]
    assert len({tuple(r.token_ids) for r in runs}) == 1
    assert all(r.random_choices == 0 and r.masks <= 1 and r.complete for r in runs)
    assert TOKENIZER.decode(runs[0].token_ids).startswith("<tool_call>{")


@pytest.mark.parametrize(
    "options",
    [
        GenerationOptions("m", tool_choice=ToolChoice("required")),
        GenerationOptions("m", tool_choice=ToolChoice("named", "Read")),
        GenerationOptions("m", reasoning=ReasoningOptions("enabled", budget_tokens=20)),
    ],
)
def test_candidates_choose_what_the_mask_would(
    options: GenerationOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's candidates checked one by one (`validate_tokens`) give the same output as the same
    candidates read from a full vocabulary mask at every step (`PROBES` 0)."""
    from agentserve.constraints import engine

    source = grammar(options)
    scripts = [
        "Sure, " + " ".join(["word"] * 60),
        'Here: {"a": "wrong", "b": [1, 2, 3]} done',
        "<think>\n" + " ".join(["ponder"] * 40) + "\n</think>\n\n" + call("Bash", {"command": "ls"}),
    ]
    probed = [sim_steer(source, script, seed) for script in scripts for seed in range(3)]
    monkeypatch.setattr(engine, "PROBES", 0)
    masked = [sim_steer(source, script, seed) for script in scripts for seed in range(3)]
    assert [r.token_ids for r in probed] == [r.token_ids for r in masked]
    assert sum(r.masks for r in probed) <= sum(r.masks for r in masked)


def test_a_script_that_ends_the_answer_is_validated_not_consumed() -> None:
    """A script the grammar accepts to its end is the answer as it is (no end token added, as
    unconstrained), decided by one validation; cut by `max_tokens` it is incomplete."""
    script = call("Read", {"path": "a.txt"})
    source = grammar(GenerationOptions("m", tool_choice=ToolChoice("required")))
    ids = TOKENIZER.encode(script)
    whole = sim_steer(source, script)
    assert whole.token_ids == ids and whole.complete and whole.copied == ((0, 0, len(ids)),)
    cut = sim_steer(source, script, max_tokens=len(ids) - 3)
    assert cut.token_ids == ids[:-3] and not cut.complete


PROSE = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
    "apple",
    "berry",
    "cherry",
    "damson",
    "elder",
    "fig",
    "grape",
]


@pytest.mark.parametrize("choice", [ToolChoice("named", "Bash"), ToolChoice("required")])
def test_remembered_states_give_the_same_answers(choice: ToolChoice) -> None:
    """The states the steering's own tokens reach are remembered per grammar (`StateMemo`) and
    answer later requests, whatever their scripts: every output is what a fresh steering gives.
    What a state keeps (llguidance's answers, its mask, a real matcher at it, the step taken from
    it) changes the cost only."""
    from agentserve.constraints.engine import steer
    from agentserve.constraints.states import StateMemo

    source = grammar(GenerationOptions("m", tool_choice=choice))
    memo = StateMemo()
    scripts = [
        "I will list the files now.",
        "Let me look: " + " ".join(["word"] * 80),
        call("Bash", {"command": "ls"}),
        call("Read", {"path": "x"}),
        'He said "hi" and left {',
        "",
        "then\n\nmore words " * 12,
        # more distinct words than a step asks about one by one, then a token the start allows: the
        # resync finds it through the mask (remembered from the script before)
        " ".join(PROSE) + "\n\n" + " ".join(PROSE[:5]),
    ]

    def run(script: str, seed: int, remembered: StateMemo | None) -> Steered:
        return steer(
            ENGINE.matcher(source, EOS), TOKENIZER.encode(script), max_tokens=400,
            rng=random.Random(seed), preferred=ENGINE.referenced(source, EOS), closing=ENGINE.closing(EOS),
            stop_ids=EOS, ends=EOS, prefixes=ENGINE.prefixes, blank=ENGINE.blank(),
            tokenize=ENGINE.tokenizer(EOS).tokenize_bytes, spell=ENGINE.spell, bulk=True,
            openers=ENGINE.openers(source, EOS), memo=remembered,
        )  # fmt: skip

    def output(s: Steered) -> tuple[object, ...]:  # all but the cost (`masks`: answers cost less)
        return s.token_ids, s.complete, s.diverged, s.random_choices, s.copied

    for _ in range(2):  # the second round is answered from the states the first remembered
        for seed, script in enumerate(scripts):
            fresh, remembered = run(script, seed, None), run(script, seed, memo)
            assert output(remembered) == output(fresh)
            check = ENGINE.matcher(source, EOS)
            assert check.try_consume_tokens(fresh.token_ids) == len(fresh.token_ids)
    assert 1 < memo.states <= 256
    assert memo.matchers >= 1
    if choice.mode == "required":  # prose refused at the start: a resync there needed the mask
        assert memo.masks >= 1


def test_a_speculated_run_that_does_not_verify_is_steered_again() -> None:
    """A long run that ends the script inside an open string is not consumed: the steering goes on
    from a copy that consumed its first and last tokens, and the whole output is validated from
    the exact state. Where the copy's state is not the run's (a string whose length is bounded:
    the short copy must write more), the validation fails and the run is consumed after all."""
    words = " ".join(["word"] * 60)
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "minLength": len(words), "maxLength": len(words) + 2}},
        "required": ["s"],
        "additionalProperties": False,
    }
    source = grammar(GenerationOptions("m", response_format=ResponseFormat("json_schema", schema)), ())
    steered = sim_steer(source, '{"s": "' + words)
    assert steered.complete
    assert json.loads(TOKENIZER.decode(steered.token_ids)) == {"s": words}
    # unbounded, the same script is speculated and verified: the same answer
    free = {**schema, "properties": {"s": {"type": "string"}}}
    source = grammar(GenerationOptions("m", response_format=ResponseFormat("json_schema", free)), ())
    assert json.loads(TOKENIZER.decode(sim_steer(source, '{"s": "' + words).token_ids)) == {"s": words}


def test_a_thought_left_open_is_closed_before_the_forced_call() -> None:
    """A script that ends inside an open thought under a forced call: steering as from before the
    thought (the speculation) would write the call inside it, which the validation refuses, so
    the thought is closed and the call written after it."""
    source = grammar(GenerationOptions("m", tool_choice=ToolChoice("required")))
    steered = sim_steer(source, "<think>\n" + " ".join(["hmm"] * 80))
    text = TOKENIZER.decode(steered.token_ids)
    assert steered.complete and text.startswith("<think>\n" + " ".join(["hmm"] * 80))
    assert text.index("</think>") < text.index("<tool_call>")
    assert len(calls_in(text)) == 1


FAMILIES_WITH_CALLS = [f.name for f in FAMILIES if f.grammar is not None]
AGENT_BASH = ToolSpec(
    "Bash",
    "",
    {
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "timeout": {"type": "number", "maximum": 600000},
            "description": {"type": "string"},
            "run_in_background": {"type": "boolean"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    strict=True,
)


def required_bash(name: str) -> tuple[Family, Constraint]:
    """A family, and the constraint of a request requiring a call with `AGENT_BASH` offered."""
    family = get_family(name)
    assert family.grammar is not None
    markers = Markers(ENGINE.specials(family.grammar.marker_strings))
    options = GenerationOptions("m", tool_choice=ToolChoice("required"))
    constraint = build(options, (AGENT_BASH,), family.grammar, markers, family=name)
    assert constraint is not None
    return family, constraint


@pytest.mark.parametrize("name", FAMILIES_WITH_CALLS)
@pytest.mark.parametrize("script", [" ".join(PROSE), "I will run it now.", ""])
def test_prose_forced_into_a_call_is_a_whole_call_in_every_family(name: str, script: str) -> None:
    """A script of prose under a required call: the steering writes the family's whole call soon
    after the prose, whatever its syntax — a Kimi call index then its argument marker, the XML
    families' closing tags, a pythonic call's `)` and `]`, harmony's commentary channel after an
    analysis message — rather than digits, optional parameters, more calls or empty messages
    until the budget runs out. The family's own parser reads exactly one Bash call from it."""
    family, constraint = required_bash(name)
    ids = TOKENIZER.encode(script)
    steered = ENGINE.steer(
        ENGINE.matcher(constraint.grammar, EOS), constraint.grammar, ids, eos=EOS,
        max_tokens=len(ids) + 80, rng=0, stop_ids=EOS, at_start=True,
    )  # fmt: skip
    text = TOKENIZER.decode(steered.token_ids)
    assert steered.complete, text
    assert ENGINE.matcher(constraint.grammar, EOS).try_consume_tokens(steered.token_ids) == len(
        steered.token_ids
    )
    parser = family.parser(ParserOptions(starts_in_reasoning=family.starts_in_reasoning))
    events = parser.feed(text.removesuffix("<|im_end|>")) + parser.close()
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [s.name for s in starts] in (["Bash"], ["Read"]), (name, text)
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert len(ends) == 1, (name, text)
    required = {"Bash": {"command"}, "Read": {"path"}}[starts[0].name]
    assert set(json.loads(ends[0].arguments)) == required, (name, text)  # no optional parameter


@pytest.mark.parametrize("name", ["qwen3-coder", "minimax-m2"])
def test_a_speculated_raw_value_verifies_past_its_stop_string(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prose forced into a raw XML value is speculated (not consumed) and the output verified from
    before the run, in one validation: the value is a lazy lexeme holding its closing tag, which
    llguidance's validation sees past (it stops right after a `stop=` string), so the request is
    not steered a second time and nothing is consumed to verify it."""
    from agentserve.constraints import engine

    _, constraint = required_bash(name)
    ids = TOKENIZER.encode(" ".join(PROSE * 3))
    passes: list[bool] = []
    loop = engine._steer

    def counted(*args: Any, **kwargs: Any) -> Steered | None:
        passes.append(kwargs["fast"])
        return loop(*args, **kwargs)

    monkeypatch.setattr(engine, "_steer", counted)
    steered = ENGINE.steer(
        ENGINE.matcher(constraint.grammar, EOS), constraint.grammar, ids, eos=EOS,
        max_tokens=len(ids) + 80, rng=0, stop_ids=EOS,
    )  # fmt: skip
    assert passes == [True]  # verified: no second, exact steering
    assert steered.complete and any(length >= 48 for _, _, length in steered.copied)  # speculated
    assert ENGINE.matcher(constraint.grammar, EOS).try_consume_tokens(steered.token_ids) == len(
        steered.token_ids
    )


@pytest.mark.parametrize(
    "body",
    [
        'v2 "B" | v1 "A"\nv2[stop="</parameter>"]: /[0-9]*/',  # the run's words rule v2 out
        '"</parameter>" "B" | v1 "A"',  # the stop string is also a literal of another alternative
    ],
)
def test_a_speculated_run_is_verified_past_a_stop_string_where_it_decides_the_alternative(body: str) -> None:
    """Past a stop string the state depends on the text before it: from before the run an empty
    value allows what the run's text does not (`B`). The verification consumes up to the stop
    string and validates on, so what follows is checked in the run's own state."""
    grammar = f'start: "<p>" body\nbody: {body}\nv1[stop="</parameter>"]: /(.|\\n)*/\n'
    assert ENGINE.check(grammar, EOS) is None
    ids = TOKENIZER.encode(" ".join(["hello"] * 80))
    for remembered in (False, True):
        steered = ENGINE.steer(
            ENGINE.matcher(grammar, EOS), grammar, ids, eos=EOS, max_tokens=len(ids) + 40, rng=0,
            stop_ids=EOS, at_start=remembered,
        )  # fmt: skip
        assert steered.complete
        assert ENGINE.matcher(grammar, EOS).try_consume_tokens(steered.token_ids) == len(steered.token_ids)
        assert TOKENIZER.decode(steered.token_ids).endswith("hello</parameter>A")


@pytest.mark.parametrize("name", FAMILIES_WITH_CALLS)
def test_object_and_array_parameters_are_written_whole_in_every_family(name: str) -> None:
    """Required object and array parameters beside a string one: the steering closes each JSON
    value (`{"":""}`, `[""]`) rather than taking its empty strings' `""` for free text and
    nesting objects until the budget runs out (the XML families write JSON for such values)."""
    family = get_family(name)
    assert family.grammar is not None
    schema = {
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "env": {"type": "object"},
            "args": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["command", "env", "args"],
    }
    tool = ToolSpec("Bash", "", schema, strict=True)
    markers = Markers(ENGINE.specials(family.grammar.marker_strings))
    options = GenerationOptions("m", tool_choice=ToolChoice("required"))
    constraint = build(options, (tool,), family.grammar, markers, family=name)
    assert constraint is not None
    ids = TOKENIZER.encode("sure, let me look")
    steered = ENGINE.steer(
        ENGINE.matcher(constraint.grammar, EOS), constraint.grammar, ids, eos=EOS, max_tokens=400,
        rng=0, stop_ids=EOS, at_start=True,
    )  # fmt: skip
    text = TOKENIZER.decode(steered.token_ids)
    assert steered.complete and len(steered.token_ids) < 120, text
    parser = family.parser(ParserOptions(starts_in_reasoning=family.starts_in_reasoning))
    events = parser.feed(text.removesuffix("<|im_end|>")) + parser.close()
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert len(ends) == 1 and set(json.loads(ends[0].arguments)) == {"command", "env", "args"}, text


def test_forced_text_spelled_by_a_special_token_is_not_taken_for_allowed() -> None:
    """llguidance's forced tokens can spell forced text with a special token the grammar refuses
    there (gpt-oss: a const `<|channel|> x` inside a JSON string). They are validated before they
    are taken, so remembered states never call them allowed (which made a later request raise),
    and an answer the steering could not finish is not reported whole."""
    family = get_family("gpt-oss")
    assert family.grammar is not None
    schema = {"type": "object", "properties": {"mode": {"const": "<|channel|> x"}}, "required": ["mode"]}
    markers = Markers(ENGINE.specials(family.grammar.marker_strings))
    options = GenerationOptions("m", tool_choice=ToolChoice("required"))
    constraint = build(
        options, (ToolSpec("T", "", schema, strict=True),), family.grammar, markers, family="gpt-oss"
    )
    assert constraint is not None
    outputs = []
    for remembered in (False, True, True):
        steered = ENGINE.steer(
            ENGINE.matcher(constraint.grammar, EOS), constraint.grammar, TOKENIZER.encode("hi"), eos=EOS,
            max_tokens=100, rng=0, stop_ids=EOS, at_start=remembered,
        )  # fmt: skip
        check = ENGINE.matcher(constraint.grammar, EOS)
        assert check.try_consume_tokens(steered.token_ids) == len(steered.token_ids)
        assert steered.complete == (check.is_accepting() or check.is_stopped())
        outputs.append((steered.token_ids, steered.complete))
    assert outputs[0] == outputs[1] == outputs[2]


def test_a_remembered_mask_changes_no_answer_where_the_mask_and_validation_disagree() -> None:
    """llguidance's mask and `validate_tokens` can disagree: a special token spelling text the
    grammar expects (here harmony's markers written as text, over a tokenizer that holds them as
    special tokens) is allowed by the mask and refused when consumed. A state's remembered mask is
    only read where a fresh step would compute one, so the steering's answers are the same with
    remembered states as without."""
    family = get_family("gpt-oss")
    assert family.grammar is not None
    tools = (AGENT_BASH, READ)
    options = GenerationOptions("m", tool_choice=ToolChoice("required"))
    constraint = build(options, tools, family.grammar, Markers(), family="gpt-oss")  # markers as text
    assert constraint is not None
    engine = engine_for(TOKENIZER.to_json() + " ")  # remembered states of its own
    for budget in range(1, 12):
        for script in ("", "", "<tool_call>", "ok"):
            ids = TOKENIZER.encode(script)
            fresh, remembered = (
                engine.steer(
                    engine.matcher(constraint.grammar, EOS), constraint.grammar, ids, eos=EOS,
                    max_tokens=len(ids) + budget, rng=0, stop_ids=EOS, at_start=at_start,
                )
                for at_start in (False, True)
            )  # fmt: skip
            assert (fresh.token_ids, fresh.complete) == (remembered.token_ids, remembered.complete), (
                budget,
                script,
            )


def test_a_special_token_is_never_healed_to_a_prefix_of_its_spelling() -> None:
    """A forced call from prose that ended with `<|im_end|>` wrote `<|im` into the argument: the
    end token's spelling was offered as text prefixes. A special token is one symbol."""
    special = TOKENIZER.encode("<|im_end|>")
    assert len(special) == 1 and ENGINE.tokenizer().is_special_token(special[0])
    assert ENGINE.prefixes(special[0]) == ()
    plain = TOKENIZER.encode('"),')
    if len(plain) == 1:  # a text token still heals to the allowed part of it
        assert ENGINE.prefixes(plain[0])
