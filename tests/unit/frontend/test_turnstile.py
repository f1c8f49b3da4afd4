"""The turnstile lets one waiter through per event-loop iteration (a few when iterations are long),
in arrival order."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from agentserve.frontend.turnstile import Turnstile

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_waiters_pass_in_order_one_per_loop_iteration() -> None:
    gate = Turnstile(share_s=3600)  # iterations far shorter than the share: one per pass
    log: list[str] = []

    async def request(name: str) -> None:
        await gate.turn()
        log.append(name)

    async def ticker() -> None:  # stands for the loop's other work (socket reads) between passes
        for _ in range(8):
            log.append("tick")
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(request(n)) for n in "abc"]
    tick = asyncio.create_task(ticker())
    await asyncio.gather(*tasks, tick)
    passed = [e for e in log if e != "tick"]
    assert passed == ["a", "b", "c"]
    # Something else ran between any two passes: never two preparations in one iteration.
    positions = [log.index(n) for n in "abc"]
    assert all("tick" in log[i + 1 : j] for i, j in itertools.pairwise(positions))
    assert len(gate) == 0


async def test_a_cancelled_waiter_is_skipped() -> None:
    gate = Turnstile()
    first, gone, last = gate.turn(), gate.turn(), gate.turn()
    gone.cancel()
    await first
    await asyncio.wait_for(last, 1)
    assert len(gate) == 0


async def test_long_iterations_let_a_few_through_per_pass_up_to_the_cap() -> None:
    gate = Turnstile(share_s=0.001, max_per_pass=3)
    log: list[str] = []

    async def request(name: str) -> None:
        await gate.turn()
        log.append(name)

    async def slow_ticker() -> None:  # each iteration busy for 20 ms (a read waking many streams)
        for _ in range(8):
            log.append("tick")
            time.sleep(0.02)
            await asyncio.sleep(0)

    tick = asyncio.create_task(slow_ticker())
    tasks = [asyncio.create_task(request(n)) for n in "abcdefg"]
    await asyncio.gather(*tasks, tick)
    assert [e for e in log if e != "tick"] == list("abcdefg")  # still in arrival order
    groups: list[int] = []
    count = 0
    for e in log:
        if e == "tick":
            if count:
                groups.append(count)
            count = 0
        else:
            count += 1
    if count:
        groups.append(count)
    assert max(groups) == 3 and all(g <= 3 for g in groups)  # several per pass, never above the cap
