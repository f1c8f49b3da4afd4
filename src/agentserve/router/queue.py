"""Requests that wait while every worker is saturated, served by priority, then arrival.

`agent_hints.priority`: a higher number is more urgent (an agent's blocking turn over a background
subagent). Equal priorities are first come, first served. Pure: the caller decides when a worker
has room and pops.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from itertools import count
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(order=True, slots=True)
class _Entry(Generic[T]):
    key: tuple[int, int]
    item: T = field(compare=False)
    cancelled: bool = field(default=False, compare=False)


class AdmissionQueue(Generic[T]):
    def __init__(self, max_size: int = 10_000) -> None:
        self.max_size = max_size
        self._heap: list[_Entry[T]] = []
        self._arrivals = count()
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def push(self, item: T, priority: int = 0) -> _Entry[T]:
        """Queue `item`; raises OverflowError when full (the API answers 529 overloaded)."""
        if self._live >= self.max_size:
            raise OverflowError("admission queue is full")
        entry = _Entry((-priority, next(self._arrivals)), item)
        heapq.heappush(self._heap, entry)
        self._live += 1
        return entry

    def cancel(self, entry: _Entry[T]) -> None:
        """Drop a waiting request whose client went away (lazily removed on pop)."""
        if not entry.cancelled:
            entry.cancelled = True
            self._live -= 1

    def pop(self) -> T | None:
        while self._heap:
            entry = heapq.heappop(self._heap)
            if not entry.cancelled:
                self._live -= 1
                entry.cancelled = True
                return entry.item
        return None
