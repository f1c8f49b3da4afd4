"""`reasoning_parser` / `tool_call_parser`: the output parser chosen by name (families/compose.py)."""

from __future__ import annotations

import json

import pytest

from agentserve.config import PromptConfig
from agentserve.conversation import ReasoningDelta, TextDelta, ToolCallEnd, ToolCallStart
from agentserve.families import get_family
from agentserve.families.compose import ParserChoiceError, with_parsers
from agentserve.prompt.pipeline import TemplateLoadError, resolve_family

XML_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
)
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def run(
    family_name: str, text: str, **parsers: str | None
) -> tuple[str, str, list[tuple[str, dict[str, object]]]]:
    family = with_parsers(get_family(family_name), parsers.get("reasoning"), parsers.get("tools"))
    parser = family.parser()
    events = parser.feed(text) + parser.close()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    names = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
    calls = [(names[e.index], json.loads(e.arguments)) for e in events if isinstance(e, ToolCallEnd)]
    return reasoning, answer, calls


def test_no_choice_keeps_the_family_unchanged() -> None:
    family = get_family("qwen3")
    assert with_parsers(family, None, None) is family
    assert with_parsers(family, "qwen3", "hermes") is family


def test_a_tool_call_parser_of_another_family_parses_its_calls() -> None:
    # Served as qwen3 (Hermes JSON calls by default), but the model writes qwen3-coder XML calls.
    _, _, calls = run("qwen3", "<think>plan</think>" + XML_CALL)
    assert calls == []  # the family's own parser does not read XML calls
    reasoning, _, calls = run("qwen3", "<think>plan</think>" + XML_CALL, tools="qwen3_coder")
    assert reasoning == "plan" and calls == [("get_weather", {"city": "Paris"})]
    family = with_parsers(get_family("qwen3"), None, "qwen3_coder")
    assert family.name == "qwen3" and family.chat_template == get_family("qwen3").chat_template


def test_reasoning_and_tool_parsers_of_different_families_combine() -> None:
    # Mistral's [THINK] reasoning with Hermes calls: neither family alone reads both.
    text = "[THINK]check the weather[/THINK]" + HERMES_CALL
    reasoning, _, calls = run("qwen3", text, reasoning="mistral", tools="hermes")
    assert reasoning == "check the weather"
    assert calls == [("get_weather", {"city": "Paris"})]
    reasoning, _, calls = run("qwen3", text)
    assert reasoning == ""


def test_harmony_cannot_be_split_and_unknown_names_are_refused() -> None:
    with pytest.raises(ParserChoiceError, match="gpt-oss"):
        with_parsers(get_family("qwen3"), "gpt-oss", "hermes")
    assert (
        with_parsers(get_family("qwen3"), "harmony", "harmony").make_parser
        is get_family("gpt-oss").make_parser
    )
    with pytest.raises(ParserChoiceError, match="tool-call parser: unknown model family 'nope'"):
        with_parsers(get_family("qwen3"), None, "nope")


def test_the_prompt_pipeline_honours_the_config_fields() -> None:
    family = resolve_family(PromptConfig(model="m", family="qwen3", tool_call_parser="qwen3_coder"))
    parser = family.parser()
    events = parser.feed(XML_CALL) + parser.close()
    assert any(isinstance(e, ToolCallEnd) for e in events)
    with pytest.raises(TemplateLoadError, match="reasoning parser"):
        resolve_family(PromptConfig(model="m", family="qwen3", reasoning_parser="bogus"))


def test_constraints_follow_the_chosen_parsers() -> None:
    """A constraint is written in the syntax the chosen parser reads: the tool family's calls with the
    reasoning family's think markers; harmony, which lays out its whole output, cannot be split."""
    qwen3, coder, mistral = get_family("qwen3"), get_family("qwen3-coder"), get_family("mistral")
    hermes_calls = with_parsers(coder, None, "hermes")
    assert hermes_calls.grammar == qwen3.grammar  # the same think markers: the same grammar
    mixed = with_parsers(qwen3, "mistral", "hermes")
    assert mixed.grammar is not None and qwen3.grammar is not None and mistral.grammar is not None
    assert mixed.grammar.think == mistral.grammar.think and mixed.grammar.calls is qwen3.grammar.calls
    assert with_parsers(qwen3, None, None).grammar is qwen3.grammar
    assert with_parsers(qwen3, "qwen3", "hermes").grammar is qwen3.grammar
