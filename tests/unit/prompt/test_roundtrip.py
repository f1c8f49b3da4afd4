"""The round-trip law per registered family (design.md): raw model output → the family's parser →
OutputEvents → assistant message → back as history → the rendered prompt reproduces the raw output.

Parametrized over FAMILIES, so each family is covered as soon as its module is registered; families
whose parser is not registered yet are covered by test_family_templates (template alone).
"""

from __future__ import annotations

import pytest
from prompt_cases import (
    KWARGS,
    Case,
    agent_turn_before,
    cases,
    conversation,
    follow_up,
    normalized,
    parse_turn,
)

from agentserve.config import ReplayPolicy
from agentserve.families import FAMILIES, get_family
from agentserve.prompt.pipeline import PromptPipeline, render_prompt

CASES = [(f.name, case) for f in FAMILIES for case in cases(f.name)]


@pytest.mark.parametrize("policy", [ReplayPolicy.AUTO, ReplayPolicy.INJECT])
@pytest.mark.parametrize(("name", "case"), CASES, ids=[f"{n}:{c.name}" for n, c in CASES])
def test_parsed_turn_renders_back_to_the_raw_output(name: str, case: Case, policy: ReplayPolicy) -> None:
    pipeline = PromptPipeline.for_family(name, replay=policy)
    kwargs = KWARGS.get(name, {})
    before = agent_turn_before(name, case)
    prompt = render_prompt(conversation(*before), pipeline, **kwargs)
    message = parse_turn(name, case.raw, prompt.starts_in_reasoning)
    kimi_ids = name == "kimi-k2"
    assert normalized(message.parts, kimi_ids) == normalized(case.parts, kimi_ids)
    history = render_prompt(conversation(*before, message, follow_up(case)), pipeline, **kwargs).text
    expected = prompt.text + (case.replayed or case.raw)
    assert history[: len(expected)] == expected


@pytest.mark.parametrize(("name", "case"), CASES, ids=[f"{n}:{c.name}" for n, c in CASES])
def test_a_turn_parsed_one_character_at_a_time_gives_the_same_message(name: str, case: Case) -> None:
    starts = get_family(name).starts_in_reasoning
    assert parse_turn(name, case.raw, starts, chunk=1) == parse_turn(name, case.raw, starts)
