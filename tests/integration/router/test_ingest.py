"""KV-event ingestion from real workers: a real ZeroMQ SUB socket on a worker service's publisher.

Each worker here is the real worker app (uvicorn on 127.0.0.1, an ephemeral port) around a sim
engine, publishing on a real PUB socket; the router side is the `Fleet` the router service and
the embedded router use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from worker_served import served

from agentserve.config import RouterConfig
from agentserve.router.core import RouterCore
from agentserve.router.discovery import WorkerEndpoint, static_endpoints
from agentserve.router.ingest import Fleet, State
from agentserve.worker.client import WorkerClient
from agentserve.worker.engine import GenerateRequest, KvEvent, SamplingParams
from agentserve.worker.engines.sim import SimConfig, SimEngine
from agentserve.worker.publisher import KvEventPublisher

pytestmark = pytest.mark.anyio

BS = 4


def sim(blocks: int = 64) -> SimEngine:
    return SimEngine(SimConfig(num_blocks=blocks, block_size=BS, speedup=0))


async def run(client: WorkerClient, rid: str, prompt: list[int], max_tokens: int = 2 * BS) -> None:
    stream = await client.generate(
        GenerateRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    )
    async for _ in stream:
        pass


async def converged(core: RouterCore, worker: str, engine: SimEngine, timeout_s: float = 5.0) -> bool:
    """Wait until the router's entries for `worker` are the engine's cache (bounded)."""
    for _ in range(int(timeout_s / 0.02)):
        snap = engine.kv_snapshot()
        if core.index.held(worker) == set(snap.block_hashes) and core.index.last_seq(worker) == snap.seq:
            return True
        await asyncio.sleep(0.02)
    return False


class DropsOne(KvEventPublisher):
    """A publisher that loses its `n`-th message, as a PUB socket past its high-water mark does."""

    def __init__(self, endpoint: str, n: int) -> None:
        super().__init__(endpoint, coalesce_s=0)  # a message per engine step: `n` counts steps
        self.n = n
        self.calls = 0

    def publish(self, events: Sequence[KvEvent]) -> None:
        self.calls += 1
        if self.calls == self.n:
            self.last_seq = events[-1].seq  # the engine moved on; nobody received these
            return
        super().publish(events)


async def test_a_worker_is_resynced_on_join_then_followed_event_by_event() -> None:
    engine = sim()
    core = RouterCore(RouterConfig(block_size=BS))
    async with served(engine, publisher=KvEventPublisher("tcp://127.0.0.1:0")) as srv:
        async with WorkerClient(srv.url) as client:
            await run(client, "before", list(range(1, 30)))  # state the router must get from a snapshot
        fleet = Fleet(core, kv_events_timeout_s=2.0, health_interval_s=0.2)
        try:
            fleet.update(static_endpoints([srv.url]))  # KV endpoint from the worker's /info
            assert await fleet.wait_live(1, 10)
            assert core.workers == (srv.url,)
            async with WorkerClient(srv.url) as client:
                for i in range(20):  # enough to evict: stored and removed events
                    await run(client, f"r{i}", [1000 * i + t for t in range(1, 30)])
            assert await converged(core, srv.url, engine)
            assert fleet.counters.events > 20 and fleet.counters.blocks > 100
            assert fleet.counters.gaps == 0 and fleet.counters.resyncs == 1
            (view,) = fleet.members()
            assert view.state is State.LIVE and view.kv_endpoint is None
        finally:
            await fleet.aclose()
    assert core.workers == ()


async def test_a_lost_message_is_detected_and_healed_by_a_resync() -> None:
    engine = sim()
    core = RouterCore(RouterConfig(block_size=BS))
    publisher = DropsOne("tcp://127.0.0.1:0", n=6)
    async with served(engine, publisher=publisher) as srv:
        fleet = Fleet(core, kv_events_timeout_s=2.0, health_interval_s=0.2)
        try:
            fleet.update([WorkerEndpoint("w", srv.url, publisher.endpoint)])
            assert await fleet.wait_live(1, 10)
            async with WorkerClient(srv.url) as client:
                for i in range(8):
                    await run(client, f"r{i}", [1000 * i + t for t in range(1, 30)])
            assert publisher.calls >= 6
            assert await converged(core, "w", engine)
            assert fleet.counters.gaps >= 1 and fleet.counters.resyncs >= 2
            assert core.workers == ("w",)  # a gap resyncs; it never removes the worker
        finally:
            await fleet.aclose()


async def test_a_gap_at_the_end_of_a_burst_is_revealed_by_the_heartbeat() -> None:
    engine = sim()
    core = RouterCore(RouterConfig(block_size=BS))
    publisher = DropsOne("tcp://127.0.0.1:0", n=10**9)
    async with served(engine, publisher=publisher) as srv:
        fleet = Fleet(core, kv_events_timeout_s=2.0, health_interval_s=0.2)
        try:
            fleet.update([WorkerEndpoint("w", srv.url, publisher.endpoint)])
            assert await fleet.wait_live(1, 10)
            publisher.n = publisher.calls + 1  # lose the next message, then nothing else is published
            async with WorkerClient(srv.url) as client:
                await run(client, "last", list(range(1, 30)), max_tokens=1)
            assert await converged(core, "w", engine)  # within a heartbeat interval (0.5 s)
            assert fleet.counters.gaps == 1
        finally:
            await fleet.aclose()


async def test_a_worker_that_stops_publishing_is_removed_and_its_blocks_purged() -> None:
    engine = sim()
    core = RouterCore(RouterConfig(block_size=BS))
    publisher = KvEventPublisher("tcp://127.0.0.1:0")
    async with served(engine, publisher=publisher) as srv:
        fleet = Fleet(core, kv_events_timeout_s=0.8, health_interval_s=0.2)
        try:
            fleet.update([WorkerEndpoint("w", srv.url, publisher.endpoint)])
            assert await fleet.wait_live(1, 10)
            async with WorkerClient(srv.url) as client:
                await run(client, "a", list(range(1, 30)))
            assert await converged(core, "w", engine)
            assert core.index.held_count("w") > 0
            publisher.close()  # the HTTP side still answers /ready: only the silence tells
            for _ in range(100):
                if fleet.removals["silent"]:
                    break
                await asyncio.sleep(0.05)
            assert fleet.removals["silent"] == 1
            assert "w" not in core.workers and core.index.held_count("w") == 0
            assert core.index.stats().entries == 0
        finally:
            await fleet.aclose()


class Flaky:
    """A worker client whose /ready can be switched off (a hung or unhealthy worker)."""

    def __init__(self, url: str) -> None:
        self.inner = WorkerClient(url)
        self.healthy = True

    async def ready(self) -> bool:
        return self.healthy and await self.inner.ready()

    async def kv_snapshot(self):  # type: ignore[no-untyped-def]
        return await self.inner.kv_snapshot()

    async def info(self) -> dict[str, object]:
        return await self.inner.info()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_failed_health_checks_remove_a_worker_and_recovery_brings_it_back() -> None:
    engine = sim()
    core = RouterCore(RouterConfig(block_size=BS))
    clients: list[Flaky] = []

    def factory(url: str) -> Flaky:
        clients.append(Flaky(url))
        return clients[-1]

    async with served(engine, publisher=KvEventPublisher("tcp://127.0.0.1:0")) as srv:
        fleet = Fleet(core, kv_events_timeout_s=5.0, health_interval_s=0.1, client_factory=factory)
        try:
            fleet.update(static_endpoints([srv.url]))
            assert await fleet.wait_live(1, 10)
            clients[0].healthy = False
            for _ in range(100):
                if fleet.removals["unhealthy"]:
                    break
                await asyncio.sleep(0.02)
            assert fleet.removals["unhealthy"] == 1 and core.workers == ()
            clients[0].healthy = True
            assert await fleet.wait_live(1, 10)  # probed, resubscribed, resynced
            assert fleet.counters.resyncs == 2
            fleet.report_failed(srv.url)  # a frontend saw it fail: removed, then back after a probe
            for _ in range(100):
                if fleet.removals["reported"]:
                    break
                await asyncio.sleep(0.02)
            assert fleet.removals["reported"] == 1
            assert await fleet.wait_live(1, 10)
        finally:
            await fleet.aclose()


async def test_scaling_down_through_discovery_purges_the_worker() -> None:
    engines = [sim(), sim()]
    core = RouterCore(RouterConfig(block_size=BS))
    async with (
        served(engines[0], publisher=KvEventPublisher("tcp://127.0.0.1:0")) as a,
        served(engines[1], publisher=KvEventPublisher("tcp://127.0.0.1:0")) as b,
    ):
        fleet = Fleet(core, kv_events_timeout_s=2.0, health_interval_s=0.2)
        try:
            fleet.update(static_endpoints([a.url, b.url]))
            assert await fleet.wait_live(2, 10)
            async with WorkerClient(b.url) as client:
                await run(client, "b", list(range(1, 30)))
            assert await converged(core, b.url, engines[1])
            fleet.update(static_endpoints([a.url]))
            for _ in range(100):
                if core.workers == (a.url,):
                    break
                await asyncio.sleep(0.02)
            assert core.workers == (a.url,) and core.index.held_count(b.url) == 0
        finally:
            await fleet.aclose()


async def test_an_idle_publisher_heartbeats_with_the_next_sequence_number() -> None:
    import zmq
    import zmq.asyncio

    from agentserve.worker.engine import AllCleared
    from agentserve.worker.events import EventHub
    from agentserve.worker.kvwire import GapDetector, decode_batch, decode_message, peek_range

    publisher = KvEventPublisher("tcp://127.0.0.1:0", heartbeat_s=0.05)
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(publisher.endpoint)
    hub = EventHub()
    task = asyncio.create_task(publisher.run(hub.subscribe()))
    try:
        first = await asyncio.wait_for(sub.recv_multipart(), 5)  # idle: a heartbeat
        assert decode_message(first) == (1, []) and decode_batch(first) == []
        hub.publish([AllCleared(1)])
        frames = await asyncio.wait_for(sub.recv_multipart(), 5)
        while not decode_batch(frames):  # heartbeats sent before the event may still be queued
            frames = await asyncio.wait_for(sub.recv_multipart(), 5)
        assert decode_message(frames) == (1, [AllCleared(1)])
        beat = await asyncio.wait_for(sub.recv_multipart(), 5)
        assert decode_message(beat) == (2, []) and peek_range(beat) == (2, 0)
        gaps = GapDetector()
        gaps.feed(1, 1)
        gaps.feed(*peek_range(beat))
        assert gaps.gaps == 0 and publisher.heartbeats_sent >= 2
    finally:
        hub.close()
        await asyncio.wait_for(task, 5)
        sub.close(0)
        ctx.term()
        publisher.close()
