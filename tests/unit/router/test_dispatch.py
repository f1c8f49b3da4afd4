"""Routing + generation with failover, on real in-process sim engines.

A crashed worker is played by a transport whose connection fails (`Crashed`): the real failure a
router sees when a worker process dies is a refused or reset connection, which this raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agentserve.config import RouterConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.router.core import RouterCore
from agentserve.router.dispatch import (
    Dispatcher,
    EngineTransport,
    NoCapacityError,
    WorkerLostError,
    WorkerTransport,
)
from agentserve.router.placement import RouteRequest
from agentserve.worker.engine import GenerateRequest, SamplingParams, Step, StepStream
from agentserve.worker.engines.sim import SimConfig, SimEngine

pytestmark = pytest.mark.anyio

PROMPT = list(range(1, 200))


class Crashed:
    """A worker whose process is gone: connecting fails."""

    async def open(self, request: GenerateRequest) -> StepStream:
        raise ConnectionRefusedError("connection refused")


class DiesAfter:
    """A worker that streams `n` steps of a real engine, then its connection resets."""

    def __init__(self, engine: SimEngine, n: int) -> None:
        self.engine, self.n = engine, n

    async def open(self, request: GenerateRequest) -> StepStream:
        inner = self.engine.generate(request)
        n = self.n

        async def steps() -> AsyncIterator[Step]:
            for _ in range(n):
                step = await inner.__anext__()
                yield Step(step.token_ids, step.text, step.cached_tokens)  # not the last step
            await inner.aclose()
            raise ConnectionResetError("connection reset by peer")

        return steps()  # type: ignore[return-value]


async def engines(n: int) -> list[SimEngine]:
    out = [SimEngine(SimConfig(num_blocks=256, block_size=16, speedup=0)) for _ in range(n)]
    for e in out:
        await e.start()
    return out


def route(prompt: list[int] = PROMPT, session: str | None = None) -> RouteRequest:
    return RouteRequest(block_hashes(prompt, 16), len(prompt), session)


def request(rid: str, prompt: list[int] = PROMPT, max_tokens: int = 8) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


async def feed_events(core: RouterCore, name: str, engine: SimEngine) -> None:
    async for batch in engine.kv_events():
        assert core.apply_events(name, batch)


async def collect(stream: AsyncIterator[Step]) -> list[Step]:
    return [s async for s in stream]


async def test_second_turn_goes_to_the_worker_holding_the_prefix() -> None:
    workers = await engines(3)
    core = RouterCore(RouterConfig(block_size=16, load_weight=0.1))
    names = [f"w{i}" for i in range(3)]
    transports: dict[str, WorkerTransport] = {}
    for name, engine in zip(names, workers, strict=True):
        core.add_worker(name)
        transports[name] = EngineTransport(engine)
    tasks = [asyncio.create_task(feed_events(core, n, e)) for n, e in zip(names, workers, strict=True)]
    await asyncio.sleep(0.01)  # subscriptions start when their tasks first run
    dispatcher = Dispatcher(core, lambda: transports)
    first = await dispatcher.generate(request("a"), route())
    steps = await collect(first)
    assert steps[-1].finish_reason is not None
    await asyncio.sleep(0.05)  # let the stored events reach the index
    second = await dispatcher.generate(request("b"), route())
    assert second.decision.worker == first.decision.worker
    assert second.decision.overlap_blocks == len(PROMPT) // 16
    steps = await collect(second)
    assert steps[0].cached_tokens == (len(PROMPT) // 16) * 16
    for t in tasks:
        t.cancel()
    for e in workers:
        await e.stop()


async def test_failure_before_the_first_token_is_retried_elsewhere_and_the_worker_purged() -> None:
    (engine,) = await engines(1)
    core = RouterCore(RouterConfig(block_size=16))
    transports: dict[str, WorkerTransport] = {"dead": Crashed(), "ok": EngineTransport(engine)}
    core.add_worker("dead")
    core.add_worker("ok")
    core.index.stored("dead", block_hashes(PROMPT, 16))  # the dead worker looks like the best cache hit
    failed: list[str] = []
    dispatcher = Dispatcher(core, lambda: transports, on_worker_failed=failed.append)
    stream = await dispatcher.generate(request("a"), route())
    steps = await collect(stream)
    assert stream.decision.worker == "ok"
    assert [a.worker for a in stream.attempts] == ["dead"]
    assert failed == ["dead"] and core.workers == ("ok",)
    assert sum(len(s.token_ids) for s in steps) == 8
    assert core.placement.inflight("ok") == 0 and core.placement.inflight("dead") == 0
    await engine.stop()


async def test_failure_after_tokens_were_streamed_is_a_clean_error_not_a_retry() -> None:
    (engine,) = await engines(1)
    core = RouterCore(RouterConfig(block_size=16))
    transports: dict[str, WorkerTransport] = {"flaky": DiesAfter(engine, 1)}
    core.add_worker("flaky")
    stream = await Dispatcher(core, lambda: transports).generate(request("a", max_tokens=64), route())
    got: list[Step] = []
    with pytest.raises(WorkerLostError, match="flaky"):
        async for step in stream:
            got.append(step)
    assert len(got) == 1
    assert core.workers == ()  # purged
    await engine.stop()


async def test_no_worker_left_is_no_capacity() -> None:
    core = RouterCore(RouterConfig(block_size=16))
    core.add_worker("dead")
    transports: dict[str, WorkerTransport] = {"dead": Crashed()}
    with pytest.raises(NoCapacityError, match="dead"):
        await Dispatcher(core, lambda: transports).generate(request("a"), route())


async def test_saturated_workers_queue_requests_by_priority() -> None:
    core = RouterCore(RouterConfig(block_size=16, max_inflight_per_worker=1))
    core.add_worker("w")
    held = await core.route(route())
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        decision = await core.route(RouteRequest([], 16, priority=priority))
        order.append(name)
        await core.finish(decision)

    low = asyncio.create_task(wait("low", 0))
    await asyncio.sleep(0)
    high = asyncio.create_task(wait("high", 5))
    await asyncio.sleep(0.01)
    assert order == [] and core.stats().queued == 2
    await core.finish(held)
    await asyncio.gather(low, high)
    assert order == ["high", "low"]


async def test_closing_a_stream_early_aborts_and_releases_load() -> None:
    (engine,) = await engines(1)
    core = RouterCore(RouterConfig(block_size=16))
    core.add_worker("w")
    transports: dict[str, WorkerTransport] = {"w": EngineTransport(engine)}
    stream = await Dispatcher(core, lambda: transports).generate(request("a", max_tokens=10_000), route())
    iterator = stream.__aiter__()
    await iterator.__anext__()
    await iterator.aclose()  # type: ignore[attr-defined]
    assert core.placement.inflight("w") == 0
    await asyncio.sleep(0.01)
    assert engine.load().running == 0
    await engine.stop()
