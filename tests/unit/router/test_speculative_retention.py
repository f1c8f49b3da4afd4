"""A speculative prefill releases the session's blocks last, so it carries the session's retention:
without it the warm-up would demote a session (or a parent held for its subagents) to the default
class (docs/subagents.md). In-process sim engines behind `in_process`, as `agentserve up` runs them."""

from __future__ import annotations

import pytest

from agentserve.config import RouterConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.router.dispatch import Dispatcher, EngineTransport
from agentserve.router.placement import RouteRequest
from agentserve.router.remote import in_process
from agentserve.worker.engine import GenerateRequest, Retention, SamplingParams, TokenRangeRetention
from agentserve.worker.engines.sim import SimConfig, SimEngine

pytestmark = pytest.mark.anyio

BS = 16
PROMPT = list(range(1, 200))
HELD = Retention((TokenRangeRetention(0, None, 85, 600.0),), decode_priority=85, decode_duration_s=600.0)


@pytest.mark.parametrize(("warm_retention", "classes"), [(HELD, {85}), (None, {35})])
async def test_a_warm_up_releases_the_blocks_under_the_retention_it_carries(
    warm_retention: Retention | None, classes: set[int]
) -> None:
    engine = SimEngine(SimConfig(num_blocks=512, block_size=BS, speedup=0))
    await engine.start()
    backend = await in_process({"w0": engine}, RouterConfig(block_size=BS))
    assert await backend.wait_ready(5)
    transports = {"w0": EngineTransport(engine)}
    dispatcher = Dispatcher(backend.router, lambda: transports)
    route = RouteRequest(block_hashes(PROMPT, BS), len(PROMPT), session_id="s")
    try:
        turn = await dispatcher.generate(
            GenerateRequest("t1", PROMPT, SamplingParams(max_tokens=20, ignore_eos=True), retention=HELD),
            route,
        )
        async for _ in turn:
            pass
        predicted = [*PROMPT, *turn.output_token_ids, 901, 902]
        hashes = block_hashes(predicted, BS)
        assert {engine.pool.priority_of(h) for h in hashes[:-1]} == {85}  # the turn left them held
        task = dispatcher.speculative_prefill(
            predicted, RouteRequest(hashes, len(predicted), "s"), warm_retention
        )
        assert task is not None and await task is not None
        full = len(predicted) // BS
        assert {engine.pool.priority_of(h) for h in hashes[:full]} == classes
    finally:
        await dispatcher.aclose()
        await backend.aclose()
        await engine.stop()
