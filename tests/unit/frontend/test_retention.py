"""The frontend's KV retention policy."""

from __future__ import annotations

import pytest

from agentserve.frontend.retention import (
    AGENT,
    OFF,
    RetentionInputs,
    RetentionPolicy,
    SharedPrefixTracker,
    decide_retention,
)
from agentserve.prompt.session_memory import SessionMemory
from agentserve.worker.engine import TokenRangeRetention


def test_off_keeps_nothing() -> None:
    assert decide_retention(OFF, RetentionInputs(1000, 500, has_tools=True)) is None


def test_agent_pins_the_shared_prefix_and_keeps_the_session_through_a_tool_gap() -> None:
    r = decide_retention(AGENT, RetentionInputs(1000, 400, has_tools=True, after_tool_result=True, idle_s=30))
    assert r is not None
    assert r.ranges == (
        TokenRangeRetention(0, 400, AGENT.prefix_priority, None),
        TokenRangeRetention(400, None, AGENT.session_priority, AGENT.session_duration_s),
    )
    assert (r.decode_priority, r.decode_duration_s) == (AGENT.session_priority, AGENT.session_duration_s)


def test_chat_is_kept_shorter_and_not_at_all_after_a_long_idle_time_while_agents_keep_their_class() -> None:
    chat = decide_retention(AGENT, RetentionInputs(1000, 0))
    assert chat is not None
    assert chat.ranges == (TokenRangeRetention(0, None, AGENT.idle_priority, AGENT.idle_duration_s),)
    late_chat = decide_retention(AGENT, RetentionInputs(1000, 200, idle_s=AGENT.session_duration_s + 1))
    assert late_chat is not None
    assert late_chat.ranges == (TokenRangeRetention(0, 200, AGENT.prefix_priority, None),)
    assert late_chat.decode_priority is None
    assert decide_retention(AGENT, RetentionInputs(1000, 0, idle_s=AGENT.session_duration_s + 1)) is None
    late_agent = decide_retention(AGENT, RetentionInputs(1000, 0, has_tools=True, idle_s=1e6))
    assert late_agent is not None and late_agent.ranges[0].priority == AGENT.session_priority


def test_agent_hint_priority_shifts_session_priority_within_bounds() -> None:
    up = decide_retention(AGENT, RetentionInputs(100, 0, has_tools=True, hint_priority=100))
    down = decide_retention(AGENT, RetentionInputs(100, 0, has_tools=True, hint_priority=-100))
    assert up is not None and up.ranges[0].priority == AGENT.max_priority < AGENT.prefix_priority
    assert down is not None and down.ranges[0].priority == 0


def test_a_prefix_longer_than_the_prompt_is_clamped() -> None:
    r = decide_retention(AGENT, RetentionInputs(100, 5000, has_tools=True))
    assert r is not None and r.ranges == (TokenRangeRetention(0, 100, AGENT.prefix_priority, None),)


@pytest.mark.parametrize("field", ["session_priority", "prefix_priority"])
def test_priorities_out_of_range_are_refused(field: str) -> None:
    with pytest.raises(ValueError):
        RetentionPolicy(**{field: 101})  # type: ignore[arg-type]


class _Tracker:
    """The shared-prefix tracker and the sessions' idle clock, observed together as the frontend does."""

    def __init__(self) -> None:
        self.prefix = SharedPrefixTracker(block_size=32)
        self.sessions = SessionMemory(lambda ids: "")

    def observe(self, hashes: tuple[int, ...], session: str, now: float) -> tuple[int, float | None]:
        return self.prefix.observe(hashes, session), self.sessions.arrived(session, now)


def test_tracker_learns_the_shared_prefix_across_sessions_and_the_idle_time() -> None:
    t = _Tracker()
    prefix = (1, 2, 3, 4)
    assert t.observe((*prefix, 10, 11), "a", now=0.0) == (0, None)
    # The same session growing its prompt says nothing about what other sessions share.
    assert t.observe((*prefix, 10, 11, 12), "a", now=5.0) == (0, 5.0)
    shared, idle = t.observe((*prefix, 20), "b", now=6.0)
    assert (shared, idle) == (4 * 32, None)
    # A third conversation sharing less narrows the known prefix.
    assert t.observe((1, 2, 30), "c", now=7.0)[0] == 2 * 32
