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
    DispatchedStream,
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


async def test_failure_after_tokens_were_streamed_with_migration_off_is_a_clean_error() -> None:
    (engine,) = await engines(1)
    core = RouterCore(RouterConfig(block_size=16))
    transports: dict[str, WorkerTransport] = {"flaky": DiesAfter(engine, 1)}
    core.add_worker("flaky")
    dispatcher = Dispatcher(core, lambda: transports, max_migrations=0)
    stream = await dispatcher.generate(request("a", max_tokens=64), route())
    got: list[Step] = []
    with pytest.raises(WorkerLostError, match="flaky"):
        async for step in stream:
            got.append(step)
    assert len(got) == 1
    assert core.workers == ()  # purged
    await engine.stop()


async def slow_engines(n: int) -> list[SimEngine]:
    """Engines whose steps arrive a few tokens at a time (a stream can die half-way). No catch-up: on a
    loaded machine it merges a late sim's steps, and a whole output could come as one step."""
    config = SimConfig(num_blocks=256, block_size=16, speedup=200, catch_up_s=0)
    out = [SimEngine(config) for _ in range(n)]
    for e in out:
        await e.start()
    return out


def text_of(steps: list[Step]) -> tuple[str, list[int]]:
    return "".join(s.text for s in steps), [t for s in steps for t in s.token_ids]


async def test_a_stream_whose_worker_dies_migrates_without_a_seam() -> None:
    reference, dying, taking_over = await slow_engines(3)
    core = RouterCore(RouterConfig(block_size=16, policy="round-robin"))
    alone = Dispatcher(core, lambda: {"ref": EngineTransport(reference)})
    core.add_worker("ref")
    whole = await collect(await alone.generate(request("r", max_tokens=120), route()))
    await core.worker_failed("ref")

    transports: dict[str, WorkerTransport] = {
        "dying": DiesAfter(dying, 3),
        "next": EngineTransport(taking_over),
    }
    core.add_worker("dying")
    core.add_worker("next")
    dispatcher = Dispatcher(core, lambda: transports)
    stream = await dispatcher.generate(request("a", max_tokens=120), route())
    while stream.decision.worker != "dying":  # round robin: make sure the dying worker serves it
        await stream.aclose()
        stream = await dispatcher.generate(request(f"a{len(core.workers)}", max_tokens=120), route())
    steps = await collect(stream)
    assert text_of(steps) == text_of(whole)
    (m,) = stream.migrations
    assert (m.from_worker, m.to_worker) == ("dying", "next")
    assert 0 < m.resumed_tokens < 120 and m.gap_s is not None and m.gap_s >= 0
    assert steps[-1].usage is not None and whole[-1].usage is not None
    assert steps[-1].usage.output_tokens == whole[-1].usage.output_tokens == 120  # counted once
    assert steps[-1].usage.input_tokens == len(PROMPT)
    assert core.workers == ("next",)
    assert core.placement.inflight("next") == 0 and core.placement.inflight("dying") == 0
    for e in (reference, dying, taking_over):
        await e.stop()


async def test_past_the_migration_limit_the_stream_fails_cleanly() -> None:
    engines_ = await slow_engines(3)
    core = RouterCore(RouterConfig(block_size=16))
    transports: dict[str, WorkerTransport] = {f"w{i}": DiesAfter(e, 2) for i, e in enumerate(engines_)}
    for name in transports:
        core.add_worker(name)
    stream = await Dispatcher(core, lambda: transports, max_migrations=2).generate(
        request("a", max_tokens=200), route()
    )
    with pytest.raises(WorkerLostError):
        await collect(stream)
    assert len(stream.migrations) == 2
    assert core.workers == ()
    for e in engines_:
        await e.stop()


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


class Hung:
    """A worker that stopped (SIGSTOP): the connection opens, nothing ever comes back."""

    def __init__(self, engine: SimEngine | None = None, steps: int = 0) -> None:
        self.engine, self.steps = engine, steps

    async def open(self, request: GenerateRequest) -> StepStream:
        if self.engine is None:
            await asyncio.Event().wait()  # the response head never arrives
        inner = self.engine.generate(request)
        n = self.steps
        stopped = asyncio.Event()

        class Stream:
            def __aiter__(self) -> Stream:
                return self

            async def __anext__(self) -> Step:
                nonlocal n
                if n > 0:
                    n -= 1
                    step = await inner.__anext__()
                    return Step(step.token_ids, step.text, step.cached_tokens)
                await stopped.wait()  # hung until closed; then the read fails, as a socket's does
                raise ConnectionResetError("connection closed")

            async def aclose(self) -> None:
                stopped.set()
                await inner.aclose()

        return Stream()  # type: ignore[return-value]


async def test_interrupting_a_dead_workers_streams_retries_or_fails_each_cleanly() -> None:
    (engine,) = await engines(1)
    core = RouterCore(RouterConfig(block_size=16, policy="round-robin"))
    transports: dict[str, WorkerTransport] = {"ok": EngineTransport(engine)}
    core.add_worker("hung")
    core.add_worker("ok")
    dispatcher = Dispatcher(core, lambda: transports, max_migrations=0)  # migration: tested above

    async def consume(stream_task: asyncio.Task[DispatchedStream]) -> tuple[str, int]:
        stream = await stream_task
        tokens = 0
        try:
            async for step in stream:
                tokens += len(step.token_ids)
        except WorkerLostError:
            return "lost", tokens
        return stream.decision.worker, tokens

    # 1: the open never answers. 2: opened, nothing streamed. 3: streamed a token, then hung.
    results = []
    for hung in (Hung(), Hung(engine, 0), Hung(engine, 1)):
        transports["hung"] = hung
        core.placement._rr = core.workers.index("hung")  # round-robin: the next request goes there
        task = asyncio.create_task(dispatcher.generate(request(f"r{len(results)}"), route()))
        run = asyncio.create_task(consume(task))
        await asyncio.sleep(0.05)
        assert not run.done()  # hung: nothing would ever end it
        assert dispatcher.interrupt("hung") == 1
        results.append(await asyncio.wait_for(run, 2))
        core.add_worker("hung")  # the failure purged it; put it back for the next case
    assert results[:2] == [("ok", 8), ("ok", 8)]  # nothing streamed yet: retried on "ok"
    assert results[2][0] == "lost" and results[2][1] > 0  # streamed, then hung: a clean error
    assert dispatcher.interrupt("hung") == 0 and dispatcher._open == {}
    await engine.stop()
