"""The frontend's session memory: one record per session, forgotten whole."""

from __future__ import annotations

import pytest

from agentserve.conversation import Conversation, Message, Reasoning, Text
from agentserve.prompt.pipeline import PromptPipeline, render_prompt
from agentserve.prompt.session_memory import SessionMemory
from agentserve.prompt.splice import Produced


def _decode(ids: object) -> str:
    return ""


def _produced(text: str = "hi") -> Produced:
    pipeline = PromptPipeline.for_family("qwen3")
    prompt = render_prompt(Conversation((), (Message("user", (Text(text),)),)), pipeline)
    return Produced.of(prompt.text, prompt, [1, 2], "ok")


def _answer(text: str) -> Message:
    return Message("assistant", (Reasoning("why"), Text(text)))


def test_a_session_is_forgotten_whole_least_recently_used_first() -> None:
    memory = SessionMemory(_decode, max_sessions=2)
    for session in ("a", "b"):
        memory.remember_context(session, [1, 2, 3], [4])
        memory.remember_turn(session, _produced())
        memory.remember_answer(session, _answer("done."))
    assert memory.drift("a", [1, 2, 3, 4, 5]) is not None  # a used: b is now the oldest
    memory.arrived("c", now=1.0)
    assert len(memory) == 2
    assert memory.turns("b") == [] and memory.context("b") is None and memory.prompt_tokens("b") is None
    echo = Conversation((), (Message("assistant", (Text("done."),)),))
    assert memory.restore_answers("b", echo) is echo
    assert memory.restore_answers("a", echo).messages[0] == _answer("done.")
    assert memory.prompt_tokens("a") == 3 and list(memory.context("a") or ()) == [1, 2, 3, 4]


def test_the_replay_budget_counts_turns_and_answers_and_evicts_other_sessions() -> None:
    size = _produced().size
    memory = SessionMemory(_decode, max_replay_size=size + 10)
    memory.remember_turn("a", _produced())
    memory.remember_answer("b", _answer("x" * 11))  # a's turn and b's answer exceed the budget
    assert memory.turns("a") == [] and len(memory) == 1
    memory.remember_answer("b", Message("assistant", (Text("  "),)))  # blank: nothing to restore
    assert len(memory) == 1


def test_the_idle_clock_and_a_renamed_conversation() -> None:
    memory = SessionMemory(_decode)
    assert memory.arrived("turn-1-key", now=10.0) is None
    memory.rename("turn-1-key", "anchored")
    assert memory.arrived("anchored", now=12.5) == 2.5  # the conversation's clock moved along
    memory.remember_context("other", [1])
    memory.arrived("other", now=20.0)
    memory.arrived("old-key", now=30.0)
    memory.rename("old-key", "other")  # `other` keeps its own context; the clock is the later one
    assert memory.arrived("other", now=31.0) == 1.0 and memory.prompt_tokens("other") == 1
    assert len(memory) == 2
    memory.rename("missing", "other")
    memory.rename("other", "other")
    assert len(memory) == 2 and memory.prompt_tokens("other") == 1


def test_answers_per_session_are_bounded() -> None:
    memory = SessionMemory(_decode, answers_per_session=2)
    for text in ("one.", "two.", "three."):
        memory.remember_answer("s", _answer(text))
    echo = Conversation((), (Message("assistant", (Text("one."),)), Message("assistant", (Text("three."),))))
    restored = memory.restore_answers("s", echo)
    assert restored.messages == (echo.messages[0], _answer("three."))


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SessionMemory(_decode, max_sessions=0)


def test_the_single_kind_views_are_the_same_store() -> None:
    from agentserve.frontend.retention import RetentionTracker
    from agentserve.prompt.drift import DriftDetector
    from agentserve.prompt.splice import AnswerMemory, ReplayMemory

    drift = DriftDetector(_decode, max_sessions=1)
    drift.remember("a", [1, 2], [3])
    assert list(drift.last("a") or ()) == [1, 2, 3] and drift.stored_tokens == 3
    report = drift.check("a", [1, 2, 3, 4])
    assert report is not None and not report.drifted
    drift.remember("b", [1])
    assert drift.check("a", [1]) is None and len(drift) == 1
    replay = ReplayMemory(per_session=2)
    for _ in range(3):
        replay.remember("s", _produced())
    assert len(replay.get("s")) == 2 and len(replay) == 1
    answers = AnswerMemory()
    answers.remember("s", _answer("done."))
    echo = Conversation((), (Message("assistant", (Text("done."),)),))
    assert answers.restore("s", echo).messages[0] == _answer("done.")
    tracker = RetentionTracker(block_size=16)
    assert tracker.observe((1, 2), "x", now=1.0) == (0, None)
    tracker.rename("x", "y", 1)
    assert tracker.observe((1, 2, 3), "y", now=3.0) == (0, 2.0)
    assert tracker.observe((1, 9), "z", now=4.0) == (16, None)
