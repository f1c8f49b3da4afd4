"""Prefix drift detection: where a prompt stops extending the previous turn, bounded memory."""

from __future__ import annotations

from prompt_cases import SYSTEM, TOOLS, assert_divergence_in_date

from agentserve.conversation import Conversation, Message, Text, ToolCall, ToolResult
from agentserve.prompt.drift import common_prefix, compare
from agentserve.prompt.pipeline import PromptPipeline, render_prompt
from agentserve.prompt.session_memory import SessionMemory


def decode(ids: object) -> str:
    return "".join(chr(97 + i % 26) for i in ids)  # type: ignore[attr-defined]


def test_common_prefix() -> None:
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert common_prefix(range(1000), [*range(999), 5]) == 999


def test_an_extension_is_not_drift_and_everything_is_reusable() -> None:
    report = compare([0, 1, 2], [0, 1, 2, 3, 4], decode)
    assert not report.drifted and report.reusable_tokens == 3 and report.prompt_after == "de"


def test_a_retry_shorter_than_the_previous_turn_is_not_drift() -> None:
    assert not compare([0, 1, 2, 3], [0, 1], decode).drifted


def test_the_report_shows_the_text_around_the_divergence() -> None:
    previous = list(range(200))
    current = [*range(150), 25, 25, *range(152, 200)]
    report = compare(previous, current, decode)
    assert report.drifted and report.index == 150 and report.reusable_tokens == 150
    assert len(report.before) == 80 and report.before.endswith("rst")  # 147, 148, 149
    assert report.previous_after.startswith("uvw") and report.prompt_after.startswith("zzw")
    assert len(report.previous_after) <= 80


def claude_code_turn(date: str, *messages: Message) -> Conversation:
    reminder = Text(f"<system-reminder>Today's date is {date}.</system-reminder>")
    first = Message("user", (reminder, Text("Fix the failing test.")))
    return Conversation(SYSTEM, (first, *messages), TOOLS)


def test_finds_a_planted_date_change() -> None:
    pipeline = PromptPipeline.for_family("qwen3")
    detector = SessionMemory(pipeline.tokenizer.decode)
    turn1 = render_prompt(claude_code_turn("2026-01-01"), pipeline)
    output = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "pytest"}}\n</tool_call><|im_end|>'
    detector.remember_context("s1", turn1.token_ids, pipeline.tokenizer.encode(output))
    answer = Message("assistant", (ToolCall("c1", "bash", '{"cmd": "pytest"}'),))
    results = Message("user", (ToolResult("c1", (Text("1 failed"),)),))

    same_day = render_prompt(claude_code_turn("2026-01-01", answer, results), pipeline)
    report = detector.drift("s1", same_day.token_ids)
    assert report is not None and not report.drifted

    next_day = render_prompt(claude_code_turn("2026-01-02", answer, results), pipeline)
    report = detector.drift("s1", next_day.token_ids)
    assert report is not None and report.drifted
    assert_divergence_in_date(report.before, report.previous_after, report.prompt_after)
    assert report.reusable_tokens == common_prefix(turn1.token_ids, next_day.token_ids)


def test_unknown_sessions_report_nothing() -> None:
    assert SessionMemory(decode).drift("nobody", [1, 2]) is None


def test_memory_is_bounded_by_sessions_and_by_tokens() -> None:
    detector = SessionMemory(decode, max_sessions=2, max_context_tokens=10)
    detector.remember_context("a", [1, 2, 3])
    detector.remember_context("b", [1, 2, 3])
    detector.drift("a", [1])  # touch a: b is now the least recently used
    detector.remember_context("c", [1, 2, 3])
    assert detector.drift("b", [1]) is None and len(detector) == 2
    detector.remember_context("d", [1] * 6, [2] * 2)  # 8 tokens: a and c are evicted until the total fits
    assert detector.stored_tokens == 8 and len(detector) == 1
    detector.remember_context("huge", [1] * 11)  # larger than the budget: not kept at all
    assert detector.drift("huge", [1]) is None and detector.drift("d", [1]) is not None
    detector.remember_context("d", [1])  # replacing a session releases its old tokens
    assert detector.stored_tokens == 1
