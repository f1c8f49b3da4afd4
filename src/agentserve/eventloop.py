"""The event loop every agentserve server runs on: uvloop where it is installed.

uvloop's transports and callbacks are compiled: under bench/peers.py the worker spent ~10 % of its
time in asyncio's pure-Python `_SelectorSocketTransport.write` and loop machinery per frame.

Also the small task and wake-up patterns the servers share on it (`cancel_and_wait`, `Wakeup`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


def event_loop_runner() -> asyncio.Runner:
    """An `asyncio.Runner` on uvloop (the default on Linux and macOS), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - platforms without uvloop
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object]]) -> None:
    """Cancel every task, then wait for each to end: a task's cleanup runs before its owner's
    (the cancellation it was sent is the expected end, not an error)."""
    tasks = list(tasks)  # the owner's collection may change while they end
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Wakeup:
    """A consumer's wait for its producer: `wait()` parks until the next `set()`. A `set()` with
    nobody waiting is dropped: the consumer looks at what it consumes before it waits."""

    __slots__ = ("_waiter",)

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
