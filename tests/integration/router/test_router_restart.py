"""A router replica restart (issue 12): the in-flight view is rebuilt from the workers.

A router's tickets live in its process; a replica that restarts (or one of several, each seeing its
own tickets) knows nothing of the requests already running. Each worker reports what it holds on
`GET /load` (running + waiting, KV blocks in use); the router reads it when the worker joins and at
every health probe, and counts what exceeds its own tickets as load. Real worker apps around sim
engines, real ZeroMQ events, the router service over loopback HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from routed import routed
from worker_served import served

from agentserve.config import RouterConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.router.placement import RouteRequest
from agentserve.router.remote import RouterClient
from agentserve.worker.client import RemoteStepStream, WorkerClient
from agentserve.worker.engine import GenerateRequest, SamplingParams
from agentserve.worker.engines.sim import SimConfig, SimEngine
from agentserve.worker.publisher import KvEventPublisher

pytestmark = pytest.mark.anyio

BS = 4


def route_of(prompt: list[int]) -> RouteRequest:
    return RouteRequest(block_hashes(prompt, BS), len(prompt))


async def test_a_restarted_router_rebuilds_the_in_flight_view_from_the_workers() -> None:
    async with contextlib.AsyncExitStack() as stack:
        # Real time (speedup 1): a 2,000-token output runs for seconds, long enough to restart beside it.
        ws = [
            await stack.enter_async_context(
                served(
                    SimEngine(SimConfig(num_blocks=512, block_size=BS, speedup=1.0)),
                    publisher=KvEventPublisher("tcp://127.0.0.1:0"),
                )
            )
            for _ in range(2)
        ]
        urls = [w.url for w in ws]
        config = RouterConfig.model_validate(
            {
                "block_size": BS,
                "workers": urls,
                "health_interval_s": 0.2,
                "kv_events_timeout_s": 3.0,
                "max_inflight_per_worker": 2,
                "policy": "least-loaded",
            }
        )
        streams: list[RemoteStepStream] = []
        clients = {u: await stack.enter_async_context(WorkerClient(u)) for u in urls}

        # The first incarnation routes three long requests; their streams run on the workers.
        async with routed(config) as svc, RouterClient(svc.url) as client:
            assert await svc.router.fleet.wait_live(2, 10)
            for i in range(3):
                prompt = list(range(1000 * i + 1, 1000 * i + 41))
                decision = await client.route(route_of(prompt))
                request = GenerateRequest(f"r{i}", prompt, SamplingParams(max_tokens=2000, ignore_eos=True))
                stream = await clients[decision.worker].generate(request)
                await stream.__anext__()  # running
                streams.append(stream)
            before = {u: svc.router.core.placement.inflight(u) for u in urls}
        assert sum(before.values()) == 3
        # ... and is gone (its tickets with it). The next one starts from nothing but the workers.
        async with routed(config) as svc, RouterClient(svc.url) as client:
            assert await svc.router.fleet.wait_live(2, 10)
            placement = svc.router.core.placement
            assert {u: placement.inflight(u) for u in urls} == before
            assert all(placement.tracked(u) == (0, 0) for u in urls)  # none of it is its own tickets
            quiet = min(urls, key=lambda u: before[u])
            decision = await client.route(route_of(list(range(9000, 9040))))
            assert decision.worker == quiet  # least loaded by what the workers run
            await client.finish(decision)
            # Least-loaded spread the three 2 + 1: the busiest is at the limit for this replica too.
            assert sorted(before.values()) == [1, 2] and svc.router.core.saturated(frozenset({quiet}))
            listed = {w["id"]: w["inflight_requests"] for w in await client.workers()}
            assert listed == before

            # The old requests end; the next reports take them off.
            for stream in streams:
                await stream.aclose()
            for _ in range(100):
                if all(placement.inflight(u) == 0 for u in urls):
                    break
                await asyncio.sleep(0.05)
            assert all(placement.inflight(u) == 0 for u in urls)
