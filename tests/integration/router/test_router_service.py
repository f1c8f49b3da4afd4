"""The router service over real loopback HTTP: route API, queueing, worker list, metrics.

Workers are the real worker app around sim engines (uvicorn in this loop, real ZeroMQ events);
frontends are `RouterClient` (msgpack) and httpx (JSON, as curl would send it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from routed import routed
from worker_served import Served, served

from agentserve.config import RouterConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.router.core import OverloadedError
from agentserve.router.dispatch import Dispatcher
from agentserve.router.placement import NoWorkerError, RouteRequest
from agentserve.router.remote import RouterClient, RouterUnavailableError
from agentserve.worker.engine import GenerateRequest, SamplingParams
from agentserve.worker.engines.sim import SimConfig, SimEngine
from agentserve.worker.publisher import KvEventPublisher

pytestmark = pytest.mark.anyio

BS = 4
PROMPT = list(range(1, 41))


def config(workers: list[str], **kw: object) -> RouterConfig:
    return RouterConfig.model_validate(
        {"block_size": BS, "workers": workers, "health_interval_s": 0.2, "kv_events_timeout_s": 3.0, **kw}
    )


def route_of(prompt: list[int] = PROMPT, **kw: object) -> RouteRequest:
    return RouteRequest(block_hashes(prompt, BS), len(prompt), **kw)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def workers(n: int) -> AsyncIterator[list[Served]]:
    async with contextlib.AsyncExitStack() as stack:
        out = []
        for _ in range(n):
            engine = SimEngine(SimConfig(num_blocks=256, block_size=BS, speedup=0))
            out.append(
                await stack.enter_async_context(
                    served(engine, publisher=KvEventPublisher("tcp://127.0.0.1:0"))
                )
            )
        yield out


async def test_route_finish_and_the_worker_list_over_msgpack() -> None:
    async with workers(2) as ws, routed(config([w.url for w in ws])) as svc, RouterClient(svc.url) as client:
        assert await svc.router.fleet.wait_live(2, 10)
        dispatcher = Dispatcher(client, client.registry.transports)
        stream = await dispatcher.generate(
            GenerateRequest("a", PROMPT, SamplingParams(max_tokens=4, ignore_eos=True)),
            route_of(session_id="s"),
        )
        first = stream.decision
        assert first.worker in {w.url for w in ws} and first.overlap_blocks == 0
        steps = [s async for s in stream]
        assert steps[-1].finish_reason == "length"
        core = svc.router.core
        for _ in range(250):  # the stored events reach the router
            if core.index.overlaps(block_hashes(PROMPT, BS)).get(first.worker) == len(PROMPT) // BS:
                break
            await asyncio.sleep(0.02)
        second = await client.route(route_of(session_id="s"))
        assert second.worker == first.worker and second.overlap_blocks == len(PROMPT) // BS
        assert second.ticket != first.ticket and second.policy == "kv"
        listed = {w["id"]: w for w in await client.workers()}
        assert listed[first.worker]["inflight_requests"] == 1  # `first` was finished by the dispatcher
        assert listed[first.worker]["cached_blocks"] >= len(PROMPT) // BS
        assert {w["state"] for w in listed.values()} == {"live"}
        await client.finish(second)
        assert core.placement.inflight(first.worker) == 0


async def test_json_bodies_and_errors_are_api_shaped() -> None:
    async with (
        workers(1) as ws,
        routed(config([ws[0].url])) as svc,
        httpx.AsyncClient(base_url=svc.url) as http,
    ):
        assert await svc.router.fleet.wait_live(1, 10)
        r = await http.post("/route", json={"block_hashes": block_hashes(PROMPT, BS), "prompt_tokens": 40})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        body = r.json()
        assert body["worker"] == ws[0].url and body["url"] == ws[0].url and body["prompt_blocks"] == 10
        assert (await http.post("/finish", json={"ticket": body["ticket"]})).status_code == 204
        bad = await http.post("/route", json={"block_hashes": [-1], "prompt_tokens": 1})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request"
        assert (
            await http.post("/route", content=b"x", headers={"content-type": "text/plain"})
        ).status_code == 400
        assert (await http.get("/route")).status_code == 405
        none = await http.post("/route", json={"prompt_tokens": 1, "exclude": [ws[0].url]})
        assert none.status_code == 503 and none.json()["error"]["type"] == "no_worker"
        assert (await http.get("/ready")).status_code == 200
        assert (await http.get("/health")).json() == {"status": "ok"}


async def test_no_worker_and_an_unreachable_router_raise_typed_errors() -> None:
    async with routed(config([])) as svc, RouterClient(svc.url) as client, httpx.AsyncClient() as http:
        with pytest.raises(NoWorkerError):
            await client.route(route_of())
        assert (await http.get(svc.url + "/ready")).status_code == 503
        url = svc.url
    async with RouterClient(url) as gone:
        with pytest.raises(RouterUnavailableError):
            await gone.route(route_of())


async def test_saturated_requests_wait_by_priority_and_leave_the_queue_when_the_caller_goes() -> None:
    cfg = config([], max_inflight_per_worker=1, queue_max=3)
    async with (
        workers(1) as ws,
        routed(cfg.model_copy(update={"workers": [ws[0].url]})) as svc,
        RouterClient(svc.url) as client,
        httpx.AsyncClient() as http,
    ):
        assert await svc.router.fleet.wait_live(1, 10)
        core = svc.router.core
        held = await client.route(route_of())  # the worker is now saturated
        order: list[str] = []

        async def wait(name: str, priority: int) -> None:
            d = await client.route(route_of(priority=priority))
            order.append(name)
            await client.finish(d)

        async def queued(n: int) -> bool:
            for _ in range(100):
                if core.stats().queued == n:
                    return True
                await asyncio.sleep(0.01)
            return False

        low = asyncio.create_task(wait("low", 0))
        assert await queued(1)
        high = asyncio.create_task(wait("high", 5))
        assert await queued(2)
        leaving = asyncio.create_task(http.post(svc.url + "/route", json={"prompt_tokens": 1}))
        assert await queued(3)
        with pytest.raises(OverloadedError):  # the queue holds 3
            await client.route(route_of())
        leaving.cancel()  # a caller that gives up leaves the queue
        with contextlib.suppress(asyncio.CancelledError):
            await leaving
        assert await queued(2)
        await client.finish(held)
        await asyncio.wait_for(asyncio.gather(low, high), 5)
        assert order == ["high", "low"]
        assert core.stats().queued == 0
        metrics = (await http.get(svc.url + "/metrics")).text
        assert 'agentserve_router_route_errors_total{type="overloaded"} 1.0' in metrics
        assert "agentserve_router_queue_wait_seconds_count 3.0" in metrics


async def test_metrics_report_decisions_overlap_queue_index_and_ingestion() -> None:
    async with workers(2) as ws, routed(config([w.url for w in ws])) as svc, RouterClient(svc.url) as client:
        assert await svc.router.fleet.wait_live(2, 10)
        for _ in range(3):
            await client.finish(await client.route(route_of()))
        async with httpx.AsyncClient() as http:
            text = (await http.get(svc.url + "/metrics")).text
        assert 'agentserve_router_decisions_total{policy="kv"} 3.0' in text
        assert "agentserve_router_overlap_blocks_bucket" in text
        assert "agentserve_router_decision_seconds_count 3.0" in text
        assert "agentserve_router_queue_wait_seconds_count 3.0" in text
        assert "agentserve_router_queue_depth 0.0" in text
        assert "agentserve_router_index_blocks" in text and "agentserve_router_index_entries" in text
        assert "agentserve_router_resyncs_total 2.0" in text
        assert "agentserve_router_kv_events_per_second" in text
        assert 'agentserve_router_workers{state="live"} 2.0' in text


async def test_a_reported_failure_purges_the_worker_until_it_answers_again() -> None:
    async with workers(1) as ws, routed(config([ws[0].url])) as svc, RouterClient(svc.url) as client:
        assert await svc.router.fleet.wait_live(1, 10)
        await client.route(route_of())
        await client.worker_failed(ws[0].url)
        assert svc.router.core.workers == () and svc.router.core.placement.inflight(ws[0].url) == 0
        assert await svc.router.fleet.wait_live(1, 10)  # it still answers: resynced and back
        assert svc.router.fleet.removals["reported"] == 1
