"""One request's preparation per event-loop iteration, in arrival order (head-of-line fairness).

Under a burst, every request's handler becomes ready in the same loop iteration, and each runs
its CPU-heavy part (decode, render, tokenize, route: ~0.7 ms) without awaiting anything real. The
loop polls sockets only between iterations, so the first request's first token, already back from
the worker, waited until *every* request of the burst was prepared: under bench/peers.py at 256
streams the first token of a burst came ~200 ms after it started, and TTFT min ≈ p50 ≈ p99.
Passing the turnstile costs one loop iteration; with it the loop reads sockets between two
preparations, so streams that are ready flow while the burst is still being prepared.

One per iteration is too few when iterations are long: on a multiplexed worker connection one read
wakes every stream at once (256 streams: an iteration of several ms), and requests arriving at a
steady ~600/s queued at the turnstile (~200-350 ms of a 256-stream TTFT in bench/peers.py,
per-token mode). So a pass lets through about one waiter per `share_s` of time since the previous
pass (at most `max_per_pass`): 0.1 ms, about one preparation's cost with a ~32-token prompt, keeps
admissions in step with the loop whatever its iteration length (with 1 ms the TTFT p50 stayed
above Dynamo's; with 0.1 ms it went below, same run).
"""

from __future__ import annotations

import asyncio
import collections


class Turnstile:
    __slots__ = ("_last", "_scheduled", "_waiting", "max_per_pass", "share_s")

    def __init__(self, *, share_s: float = 0.0001, max_per_pass: int = 64) -> None:
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._scheduled = False
        self._last = 0.0
        self.share_s = share_s
        self.max_per_pass = max_per_pass

    def __len__(self) -> int:
        return len(self._waiting)

    def turn(self) -> asyncio.Future[None]:
        """Await it: resolves in a later loop iteration than any waiter before it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiting.append(fut)
        if not self._scheduled:
            # From idle, the first pass counts from now: the time spent idle is no share to spend
            # (a burst after a quiet spell would otherwise pass `max_per_pass` at once).
            self._scheduled = True
            self._last = loop.time()
            loop.call_soon(self._release)
        return fut

    def _release(self) -> None:
        # A few waiters per call; the next call is scheduled with call_soon, which runs in the next
        # iteration (after the loop polled its sockets), as do the released waiters' tasks.
        loop = asyncio.get_running_loop()
        now = loop.time()
        since, self._last = now - self._last, now
        n = min(self.max_per_pass, max(1, int(since / self.share_s)))
        while self._waiting and n:
            fut = self._waiting.popleft()
            if not fut.done():  # a cancelled waiter (its client left) is skipped
                fut.set_result(None)
                n -= 1
        if self._waiting:
            loop.call_soon(self._release)
        else:
            self._scheduled = False


__all__ = ["Turnstile"]
