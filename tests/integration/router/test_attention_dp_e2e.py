"""Attention DP end to end over the network (issue 15, item 3): a worker app around the sim engine
with 2 ranks (`--sim-dp-ranks 2`: one KV cache and one KV event stream per rank) publishing on a
real ZeroMQ socket, the router service over loopback HTTP, a frontend's `RouterClient` +
`Dispatcher`. The router follows each rank's stream (topic `kv/<rank>`), indexes blocks by (worker,
rank), places a prompt on the rank that caches it, and the worker runs it there.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from routed import routed
from worker_served import served

from agentserve.config import RouterConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.router.dispatch import Dispatcher
from agentserve.router.index import target
from agentserve.router.placement import RouteRequest
from agentserve.router.remote import RouterClient
from agentserve.worker.client import WorkerClient
from agentserve.worker.engine import GenerateRequest, SamplingParams
from agentserve.worker.engines.sim import SimConfig
from agentserve.worker.engines.sim_dp import DpSimEngine
from agentserve.worker.publisher import KvEventPublisher

pytestmark = pytest.mark.anyio

BS = 4
PROMPT = list(range(1, 41))  # 10 blocks
HASHES = block_hashes(PROMPT, BS)


async def test_worker_ranks_reach_the_index_and_placement_pins_the_cached_rank() -> None:
    engine = DpSimEngine(2, SimConfig(num_blocks=128, block_size=BS, speedup=0))
    async with served(engine, publisher=KvEventPublisher("tcp://127.0.0.1:0")) as worker:
        config = RouterConfig.model_validate(
            {"block_size": BS, "workers": [worker.url], "health_interval_s": 0.2, "kv_events_timeout_s": 3.0}
        )
        async with routed(config) as svc, RouterClient(svc.url) as client:
            core = svc.router.core
            assert await svc.router.fleet.wait_live(1, 10)
            for _ in range(250):  # both ranks' streams subscribed and resynced
                if len(core.targets(worker.url)) == 2:
                    break
                await asyncio.sleep(0.02)
            assert core.targets(worker.url) == (target(worker.url, 0), target(worker.url, 1))

            # The worker's HTTP face of the ranks.
            async with httpx.AsyncClient(base_url=worker.url) as http:
                assert (await http.get("/info")).json()["dp_ranks"] == 2
                assert (await http.get("/kv/snapshot", params={"dp_rank": 1})).json()["dp_rank"] == 1
                assert (await http.get("/kv/snapshot")).status_code == 400  # which rank?
                assert (await http.get("/kv/snapshot", params={"dp_rank": 9})).status_code == 400

            # Cache the prompt on rank 1 only, straight on the worker.
            async with WorkerClient(worker.url) as wc:
                warm = await wc.generate(
                    GenerateRequest("warm", PROMPT, SamplingParams(max_tokens=1), dp_rank=1)
                )
                async for _ in warm:
                    pass
            for _ in range(250):  # rank 1's stored events reach the router's index, rank 0 stays empty
                if core.index.held(target(worker.url, 1)) >= frozenset(HASHES):
                    break
                await asyncio.sleep(0.02)
            assert core.index.held(target(worker.url, 1)) >= frozenset(HASHES)
            assert not core.index.held(target(worker.url, 0)) & frozenset(HASHES)

            # The next turn: routed to rank 1, and the worker serves it there from its cache. Unpinned,
            # the engine would have balanced it onto idle rank 0 and recomputed the whole prompt.
            dispatcher = Dispatcher(client, client.registry.transports)
            prompt = [*PROMPT, 7, 7]
            stream = await dispatcher.generate(
                GenerateRequest("turn", prompt, SamplingParams(max_tokens=3, ignore_eos=True)),
                RouteRequest(block_hashes(prompt, BS), len(prompt), "session"),
            )
            steps = [s async for s in stream]
            assert (stream.decision.worker, stream.decision.dp_rank) == (worker.url, 1)
            assert stream.decision.overlap_blocks == len(HASHES)
            assert steps[0].cached_tokens == len(PROMPT)
            assert engine.ranks[0].load().prompt_tokens == 0 and engine.ranks[1].load().prompt_tokens > 0
            listed = {w["id"]: w for w in await client.workers()}
            assert listed[worker.url]["cached_blocks"] >= len(HASHES) and listed[worker.url]["dp_ranks"] == 2
