"""Behaviour of the special-token families (gpt-oss, kimi-k2, deepseek-v3.1, deepseek-r1) that the
segment-level corpus cannot show: ids, when events come out while streaming, error payloads.
"""

from __future__ import annotations

import pytest

from agentserve.conversation import (
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
)
from agentserve.families import get_family
from agentserve.families.gpt_oss import MAX_HEADER, parse_header
from agentserve.families.kimi_k2 import call_name
from agentserve.parsing import OutputParser, ParserOptions, sequential_call_id
from agentserve.parsing.events import merge_deltas, summarize

ARGS = '{"path": "src/app.py", "content": "x = {\\"a\\": [1, 2]}"}'

# (family, text up to and including the end of the call's header, the text after the arguments)
CALLS = [
    (
        "gpt-oss",
        "<|channel|>commentary to=functions.write <|constrain|>json<|message|>",
        "<|call|>",
    ),
    (
        "kimi-k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.write:7<|tool_call_argument_begin|>",
        "<|tool_call_end|><|tool_calls_section_end|>",
    ),
    (
        "deepseek-v3.1",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write<｜tool▁sep｜>",
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    (
        "deepseek-r1",
        "</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>write\n```json\n",
        "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
]


def parser(family: str, starts_in_reasoning: bool = False) -> OutputParser:
    return get_family(family).parser(ParserOptions(starts_in_reasoning, (), sequential_call_id))


def run(family: str, text: str, starts_in_reasoning: bool = False) -> list[OutputEvent]:
    p = parser(family, starts_in_reasoning)
    return p.feed(text) + p.close()


@pytest.mark.parametrize(("family", "head", "tail"), CALLS, ids=[c[0] for c in CALLS])
def test_call_starts_at_its_header_and_streams_its_arguments(family: str, head: str, tail: str) -> None:
    p = parser(family)
    events = p.feed(head)
    assert [type(e) for e in events] == [ToolCallStart]
    assert events[0].name == "write"
    fragments = []
    for i in range(0, len(ARGS), 4):
        chunk_events = p.feed(ARGS[i : i + 4])
        assert all(isinstance(e, ToolCallArgsDelta) for e in chunk_events)
        fragments += [e.fragment for e in chunk_events if isinstance(e, ToolCallArgsDelta)]
    assert len(fragments) > 5  # streamed as the model writes, not buffered to the end
    end = p.feed(tail) + p.close()
    assert [e for e in end if isinstance(e, ToolCallEnd)] == [ToolCallEnd(0, ARGS)]
    assert "".join(fragments) + "".join(e.fragment for e in end if isinstance(e, ToolCallArgsDelta)) == ARGS


@pytest.mark.parametrize(("family", "head", "tail"), CALLS, ids=[c[0] for c in CALLS])
def test_whole_call_in_one_chunk_after_earlier_text(family: str, head: str, tail: str) -> None:
    # Begin and end markers in one delta (MTP, batching) must not drop the call (vLLM#48020).
    p = parser(family)
    events = p.feed("Hi. ")
    events += p.feed(head + ARGS + tail) + p.close()
    assert summarize(merge_deltas(events))[1:] == [
        {
            "call": "write",
            "args": {"path": "src/app.py", "content": 'x = {"a": [1, 2]}'},
        }
    ]


@pytest.mark.parametrize(("family", "head", "tail"), CALLS, ids=[c[0] for c in CALLS])
def test_errors_carry_the_models_arguments_text(family: str, head: str, tail: str) -> None:
    malformed = [e for e in run(family, head + '{"a": 1,}' + tail) if isinstance(e, ToolCallError)]
    assert [(e.index, e.reason, e.raw) for e in malformed] == [(0, "malformed", '{"a": 1,}')]
    truncated = [e for e in run(family, head + '{"a": "b') if isinstance(e, ToolCallError)]
    assert [(e.index, e.reason, e.raw) for e in truncated] == [(0, "truncated", '{"a": "b')]


def test_kimi_keeps_the_models_call_id_for_its_template() -> None:
    events = run(
        "kimi-k2",
        "<|tool_calls_section_begin|><|tool_call_begin|> functions.mcp__fs.read-file:12 "
        '<|tool_call_argument_begin|>{"p": 1}<|tool_call_end|><|tool_calls_section_end|>',
    )
    assert events[0] == ToolCallStart(0, "functions.mcp__fs.read-file:12", "mcp__fs.read-file")


@pytest.mark.parametrize(
    ("call_id", "name"),
    [
        ("functions.get_weather:0", "get_weather"),
        ("functions.mcp.git-log:3", "mcp.git-log"),
        ("get_weather:1", "get_weather"),
        ("functions.no_index", "no_index"),
        ("functions.:2", ""),
    ],
)
def test_kimi_call_name_from_id(call_id: str, name: str) -> None:
    assert call_name(call_id) == name


def test_kimi_call_without_a_name_is_text() -> None:
    raw = "<|tool_calls_section_begin|><|tool_call_begin|>functions.:0<|tool_call_argument_begin|>{}"
    assert summarize(merge_deltas(run("kimi-k2", raw))) == [{"text": raw}]


def test_deepseek_generates_ids() -> None:
    events = run(
        "deepseek-v3.1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>ls<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
    )
    assert events[0] == ToolCallStart(0, "call_0", "ls")


def test_deepseek_r1_family_default_starts_in_reasoning() -> None:
    p = get_family("deepseek-r1").parser()
    events = merge_deltas(p.feed("<think>\nPonder.</think>Done.") + p.close())
    assert events[0] == ReasoningDelta("Ponder.")
    assert events[-1] == TextDelta("Done.")


@pytest.mark.parametrize(
    ("header", "channel", "recipient"),
    [
        ("<|channel|>analysis", "analysis", ""),
        (
            "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json",
            "commentary",
            "functions.f",
        ),
        ("<|start|>assistant to=functions.x<|channel|>commentary json", "commentary", "functions.x"),
        (" to=functions.g<|channel|>commentary", "commentary", "functions.g"),
        ("<|channel|>final", "final", ""),
        ("<|start|>assistant", "", ""),
    ],
)
def test_harmony_header(header: str, channel: str, recipient: str) -> None:
    assert parse_header(header) == (channel, recipient)


def test_harmony_header_that_runs_too_long_was_text() -> None:
    prose = "a stray channel token followed by prose " * 10
    raw = "<|channel|>" + prose + "<|end|>after"
    assert len(prose) > MAX_HEADER
    for size in (1, 5, len(raw)):
        p = parser("gpt-oss")
        events: list[OutputEvent] = []
        for i in range(0, len(raw), size):
            events += p.feed(raw[i : i + size])
        assert summarize(merge_deltas(events + p.close())) == [
            {"text": "<|channel|>" + prose.rstrip() + "\n\nafter"}
        ]


def test_harmony_message_to_a_builtin_tool_is_a_call() -> None:
    events = run("gpt-oss", '<|channel|>analysis to=browser.search<|message|>{"query": "x"}<|call|>')
    assert summarize(merge_deltas(events)) == [{"call": "browser.search", "args": {"query": "x"}}]


def test_harmony_hallucinated_tool_result_is_not_a_call() -> None:
    raw = '<|start|>functions.f to=assistant<|channel|>commentary<|message|>{"t": 1}<|end|>'
    assert summarize(merge_deltas(run("gpt-oss", raw))) == [{"text": '{"t": 1}'}]


@pytest.mark.parametrize("family", ["gpt-oss", "kimi-k2", "deepseek-v3.1", "deepseek-r1"])
def test_feed_after_close_is_an_error(family: str) -> None:
    p = parser(family)
    p.close()
    assert p.close() == []
    with pytest.raises(RuntimeError):
        p.feed("x")
