"""The turnstile lets one waiter through per event-loop iteration, in arrival order."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from agentserve.frontend.turnstile import Turnstile

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_waiters_pass_in_order_one_per_loop_iteration() -> None:
    gate = Turnstile()
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
