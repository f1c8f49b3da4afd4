"""Fan-out of KV event batches to async subscribers (in-process, unbounded, order-preserving).

An engine publishes each iteration's events as one batch; every subscriber gets every batch from
the moment it subscribed, in order. A subscriber that falls behind receives the batches queued
meanwhile merged into one list (fewer wake-ups, same events, same order).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from agentserve.eventloop import Wakeup
from agentserve.worker.engine import KvEvent


class _Subscription:
    __slots__ = ("_closed", "_hub", "_pending", "_wakeup")

    def __init__(self, hub: EventHub) -> None:
        self._hub = hub
        self._pending: list[KvEvent] = []
        self._wakeup = Wakeup()
        self._closed = False

    def _put(self, events: list[KvEvent]) -> None:
        self._pending += events
        self._wakeup.set()

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> list[KvEvent]:
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            await self._wakeup.wait()
        events, self._pending = self._pending, []
        return events

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        self._closed = True
        self._hub._subs.discard(self)
        self._wakeup.set()


class EventHub:
    def __init__(self) -> None:
        self._subs: set[_Subscription] = set()

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    def publish(self, events: list[KvEvent]) -> None:
        if events:
            for sub in self._subs:
                sub._put(events)

    def subscribe(self) -> AsyncIterator[list[KvEvent]]:
        sub = _Subscription(self)
        self._subs.add(sub)
        return sub

    def close(self) -> None:
        """End every subscription (after delivering what is queued)."""
        for sub in list(self._subs):
            sub._close()
