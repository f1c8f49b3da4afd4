from __future__ import annotations

import pytest

from agentserve.router.queue import AdmissionQueue


def test_higher_priority_first_then_arrival_order() -> None:
    q: AdmissionQueue[str] = AdmissionQueue()
    q.push("low-1", 0)
    q.push("high", 5)
    q.push("low-2", 0)
    q.push("mid", 1)
    assert [q.pop() for _ in range(5)] == ["high", "mid", "low-1", "low-2", None]


def test_cancelled_entries_are_skipped_and_not_counted() -> None:
    q: AdmissionQueue[str] = AdmissionQueue()
    a = q.push("a")
    q.push("b")
    q.cancel(a)
    q.cancel(a)
    assert len(q) == 1
    assert q.pop() == "b" and len(q) == 0


def test_full_queue_refuses() -> None:
    q: AdmissionQueue[int] = AdmissionQueue(max_size=1)
    q.push(1)
    with pytest.raises(OverflowError):
        q.push(2)
