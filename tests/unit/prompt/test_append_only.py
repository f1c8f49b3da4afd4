"""Append-only across a 10-turn tool-using conversation, token for token, for every family under the
native and inject policies; and the combinations that cannot be append-only by design, with what the
drift detector reports for each.

Each turn: render the prompt, let the "model" write the family's canonical raw output, parse it (with
the family's parser where registered, else take the turn's known parts), append it and the tool results
or the user's next message, render again. The drift detector holds prompt + generated tokens; every
next prompt must extend them exactly, or it reports where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from prompt_cases import (
    CASES,
    FAMILY_NAMES,
    KWARGS,
    QUESTION,
    SYSTEM,
    Case,
    conversation,
    family,
    follow_up,
    has_parser,
    parse_turn,
)

from agentserve.config import ReplayPolicy
from agentserve.conversation import Conversation, Message, Reasoning, Text
from agentserve.families import Family
from agentserve.prompt.drift import DriftReport
from agentserve.prompt.pipeline import PromptPipeline, render_prompt
from agentserve.prompt.session_memory import SessionMemory
from agentserve.prompt.template import ChatTemplate, ModelTemplates


def simulate(
    pipeline: PromptPipeline, name: str, script: Sequence[Case], turns: int = 10, **kwargs: Any
) -> list[DriftReport]:
    detector = SessionMemory(pipeline.tokenizer.decode)
    messages: list[Message] = []
    reports: list[DriftReport] = []
    calls = 0
    for turn in range(turns):
        rendered = render_prompt(conversation(*messages), pipeline, **kwargs)
        report = detector.drift("session", rendered.token_ids)
        if report is not None:
            reports.append(report)
        case = script[turn % len(script)].numbered(calls, kimi=name == "kimi-k2")
        calls += len(case.calls)
        detector.remember_context("session", rendered.token_ids, pipeline.tokenizer.encode(case.raw))
        if has_parser(name):
            answer = parse_turn(name, case.raw, rendered.starts_in_reasoning)
        else:
            answer = Message("assistant", case.parts)
        messages += [answer, follow_up(case, turn)]
    return reports


@pytest.mark.parametrize("policy", [ReplayPolicy.NATIVE, ReplayPolicy.INJECT])
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_ten_tool_using_turns_are_append_only(name: str, policy: ReplayPolicy) -> None:
    pipeline = PromptPipeline.for_family(family(name), replay=policy)
    script = CASES[name]
    reports = simulate(pipeline, name, script, **KWARGS.get(name, {}))
    assert len(reports) == 9
    for turn, report in enumerate(reports):
        case = script[turn % len(script)]
        if case.replayed is None:
            assert not report.drifted, (turn, report)
            assert report.reusable_tokens == report.previous_tokens
        else:
            # gpt-oss: a final answer ends <|return|> when generated and <|end|> in history.
            assert report.drifted
            assert report.previous_after.startswith("<|return|>")
            assert report.prompt_after.startswith("<|end|>")
            assert report.previous_tokens - report.index == 1  # only the stop token differs


# -- documented exceptions ---------------------------------------------------------------------


def test_drop_policy_loses_the_cache_at_the_first_replayed_reasoning() -> None:
    pipeline = PromptPipeline.for_family(family("qwen3"), replay=ReplayPolicy.DROP)
    report = simulate(pipeline, "qwen3", CASES["qwen3"], turns=2)[0]
    assert report.drifted
    assert report.before.endswith("<|im_start|>assistant\n")
    assert report.previous_after.startswith("<think>\nThe user wants the weather")
    assert report.prompt_after.startswith("<tool_call>")


def test_a_plain_chat_turn_drops_its_reasoning_when_the_user_speaks_again() -> None:
    # No tool call in the turn: the family default (drop past reasoning) applies once it is history.
    pipeline = PromptPipeline.for_family(family("qwen3"))
    answer = next(c for c in CASES["qwen3"] if c.name == "answer")
    report = simulate(pipeline, "qwen3", [answer], turns=2)[0]
    assert report.drifted
    assert report.previous_after.startswith("<think>\nBoth are known now.")
    assert report.prompt_after.startswith("Paris is 18C")


def test_a_prefilled_empty_think_block_is_not_in_history() -> None:
    # Qwen3 with enable_thinking=false writes <think>\n\n</think>\n\n into the prompt; the turn as
    # history has no reasoning, so that block is gone from the next prompt.
    pipeline = PromptPipeline.for_family(family("qwen3"))
    call = Case("call", CASES["qwen3"][0].parts[1:], CASES["qwen3"][0].raw.split("\n\n", 1)[1])
    report = simulate(pipeline, "qwen3", [call], turns=2, enable_thinking=False)[0]
    assert report.drifted
    assert report.previous_after.startswith("<think>\n\n</think>")
    assert report.prompt_after.startswith("<tool_call>")


# A template in the common Hugging Face shape that never sees reasoning and renders every assistant
# message with its own header: it cannot continue one turn across runs. Written for this test.
CONTENT_ONLY_TEMPLATE = """
{%- for m in messages %}
{{- '<|im_start|>' + m.role + '\\n' + m.content }}
{%- for c in m.tool_calls or [] %}
{{- ('\\n' if m.content and not m.content.endswith('\\n') or not loop.first else '') }}
{{- '<tool_call>\\n{"name": ' + c.function.name | tojson }}
{{- ', "arguments": ' + c.function.arguments | tojson + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def content_only_pipeline(fam: Family) -> PromptPipeline:
    return PromptPipeline(
        fam, ModelTemplates.single(CONTENT_ONLY_TEMPLATE), PromptPipeline.for_family(fam).tokenizer
    )


def test_auto_injects_reasoning_for_a_template_that_does_not_read_it_and_stays_append_only() -> None:
    pipeline = content_only_pipeline(family("qwen3"))
    assert not ChatTemplate(CONTENT_ONLY_TEMPLATE).reads_reasoning
    script = [c for c in CASES["qwen3"] if c.name != "interleaved"]
    reports = simulate(pipeline, "qwen3", script)
    assert all(not r.drifted for r in reports)
    rendered = render_prompt(
        Conversation(SYSTEM, (QUESTION, Message("assistant", script[0].parts))), pipeline
    )
    assert rendered.replay == "inject"
    assert "<think>\nThe user wants the weather" in rendered.text


def test_interleaved_reasoning_through_a_template_without_turn_continuation() -> None:
    # inject keeps each segment before its own call by splitting the turn into runs; a template that
    # gives every message its own header writes one between the runs, where the model wrote none.
    pipeline = content_only_pipeline(family("qwen3"))
    interleaved = next(c for c in CASES["qwen3"] if c.name == "interleaved")
    report = simulate(pipeline, "qwen3", [interleaved], turns=2)[0]
    assert report.drifted
    assert report.previous_after.startswith("\n<think>\nThen run the tests.")
    assert report.prompt_after.startswith("<|im_end|>\n<|im_start|>assistant\n<think>\nThen run")


def test_reasoning_first_flattening_would_move_the_second_segment() -> None:
    # What inject avoids: all reasoning in front of the first call (Dynamo v1) reorders the turn.
    interleaved = next(c for c in CASES["qwen3"] if c.name == "interleaved")
    reasoning = [p for p in interleaved.parts if isinstance(p, Reasoning)]
    others = [p for p in interleaved.parts if not isinstance(p, Reasoning)]
    flattened = Message("assistant", (Reasoning("\n".join(r.text for r in reasoning)), *others))
    pipeline = PromptPipeline.for_family(family("qwen3"))
    prompt = render_prompt(conversation(), pipeline).text
    text = render_prompt(conversation(flattened, Message("user", (Text("ok"),))), pipeline).text
    assert not text.startswith(prompt + interleaved.raw)
