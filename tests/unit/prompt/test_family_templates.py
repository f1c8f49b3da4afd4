"""The fallback template of every family is its documented format: history rendered from an assistant
turn reproduces the model's raw output (the round-trip law, template side), under native and inject.
"""

from __future__ import annotations

import pytest
from prompt_cases import (
    FAMILY_NAMES,
    KWARGS,
    Case,
    agent_turn_before,
    cases,
    conversation,
    family,
    follow_up,
)

from agentserve.config import ReplayPolicy
from agentserve.conversation import Message
from agentserve.families import FAMILIES
from agentserve.families.base import MissingTemplateError, fallback_template
from agentserve.prompt.markup import family_markup
from agentserve.prompt.pipeline import PromptPipeline, render_prompt
from agentserve.prompt.tokenizer import embedded_tokenizer

CASES = [(name, case) for name in FAMILY_NAMES for case in cases(name)]


def render(pipeline: PromptPipeline, name: str, *messages: Message) -> str:
    return render_prompt(conversation(*messages), pipeline, **KWARGS.get(name, {})).text


@pytest.mark.parametrize("policy", [ReplayPolicy.NATIVE, ReplayPolicy.INJECT])
@pytest.mark.parametrize(("name", "case"), CASES, ids=[f"{n}:{c.name}" for n, c in CASES])
def test_history_reproduces_the_raw_output(name: str, case: Case, policy: ReplayPolicy) -> None:
    pipeline = PromptPipeline.for_family(family(name), replay=policy)
    before = agent_turn_before(name, case)
    prompt = render(pipeline, name, *before)
    history = render(pipeline, name, *before, Message("assistant", case.parts), follow_up(case))
    expected = prompt + (case.replayed or case.raw)
    assert history[: len(expected)] == expected


@pytest.mark.parametrize(("name", "case"), [(n, c) for n, c in CASES if c.replayed])
def test_documented_exceptions_really_differ_from_the_raw_output(name: str, case: Case) -> None:
    pipeline = PromptPipeline.for_family(family(name))
    before = agent_turn_before(name, case)
    prompt = render(pipeline, name, *before)
    history = render(pipeline, name, *before, Message("assistant", case.parts), follow_up(case))
    assert not history.startswith(prompt + case.raw)


def test_every_registered_family_has_a_fallback_template_and_cases() -> None:
    for f in FAMILIES:
        assert f.chat_template == fallback_template(f.name)
        assert f.name in FAMILY_NAMES, f"add {f.name} to tests/unit/prompt/prompt_cases.py"


def test_a_family_without_a_template_file_is_a_clear_error() -> None:
    with pytest.raises(MissingTemplateError, match="no-such-family"):
        fallback_template("no-such-family")


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_think_markers_are_single_tokens_of_the_embedded_tokenizer(name: str) -> None:
    markup = family_markup(family(name))
    tokenizer = embedded_tokenizer()
    for marker in (markup.think_open, markup.think_close):
        if marker is not None:
            assert tokenizer.token_id(marker.strip()) is not None, marker


@pytest.mark.parametrize(
    ("name", "has_block"),
    [("qwen3", True), ("mistral", True), ("gpt-oss", False), ("llama3-json", False), ("pythonic", False)],
)
def test_families_without_an_inline_think_block_say_so(name: str, has_block: bool) -> None:
    assert family_markup(family(name)).can_inject is has_block
