"""One request's preparation per event-loop iteration, in arrival order (head-of-line fairness).

Under a burst, every request's handler becomes ready in the same loop iteration, and each runs
its CPU-heavy part (decode, render, tokenize, route: ~0.7 ms) without awaiting anything real. The
loop polls sockets only between iterations, so the first request's first token, already back from
the worker, waited until *every* request of the burst was prepared: under bench/peers.py at 256
streams the first token of a burst came ~200 ms after it started, and TTFT min ≈ p50 ≈ p99.
Passing the turnstile costs one loop iteration; with it the loop reads sockets between two
preparations, so streams that are ready flow while the burst is still being prepared.
"""

from __future__ import annotations

import asyncio
import collections


class Turnstile:
    __slots__ = ("_scheduled", "_waiting")

    def __init__(self) -> None:
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._scheduled = False

    def __len__(self) -> int:
        return len(self._waiting)

    def turn(self) -> asyncio.Future[None]:
        """Await it: resolves in a later loop iteration than any waiter before it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiting.append(fut)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._release)
        return fut

    def _release(self) -> None:
        # One waiter per call; the next call is scheduled with call_soon, which runs in the next
        # iteration (after the loop polled its sockets), as does the released waiter's task.
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():  # a cancelled waiter (its client left) is skipped
                fut.set_result(None)
                break
        if self._waiting:
            asyncio.get_running_loop().call_soon(self._release)
        else:
            self._scheduled = False


__all__ = ["Turnstile"]
