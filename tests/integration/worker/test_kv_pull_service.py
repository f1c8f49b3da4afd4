"""`POST /kv/pull` on a real loopback worker: a held KV is taken once; bad input gets the error shape."""

from __future__ import annotations

import httpx
import pytest
from worker_served import served

from agentserve.worker.client import KvPuller
from agentserve.worker.engine import GenerateRequest, KvTransfer, SamplingParams
from agentserve.worker.engines.sim import SimConfig, SimEngine

pytestmark = pytest.mark.anyio


async def test_a_held_prefill_is_pulled_once_over_http() -> None:
    engine = SimEngine(SimConfig(num_blocks=256, block_size=4, speedup=0))
    async with served(engine) as s:
        request = GenerateRequest("c1", list(range(1, 20)), SamplingParams(max_tokens=1), context_only=True)
        steps = [step async for step in engine.generate(request)]
        held = steps[-1].kv_transfer
        assert held == KvTransfer("c1", 16)
        puller = KvPuller()
        assert await puller(KvTransfer("c1", 0, s.url)) == 16
        assert await puller(KvTransfer("c1", 0, s.url)) is None  # taken
        assert await puller(KvTransfer("c1", 0, "not-a-url")) is None
        async with httpx.AsyncClient(base_url=s.url) as http:
            bad = await http.post("/kv/pull", content=b"{")
            assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request"
            bad = await http.post("/kv/pull", json={"handle": 7})
            assert bad.status_code == 400
            gone = await http.post("/kv/pull", json={"handle": "nope"})
            assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found"
