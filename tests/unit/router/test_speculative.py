"""Speculative prefill: the predicted next prefix is warmed where the next turn will go.

In-process sim engines behind `in_process` (the `agentserve up` shape): routing follows their
real KV events. The sim already keeps a turn's output blocks, so what a warm-up adds is what the
template writes after the output (end of turn, the next message's header): without it the next
turn re-prefills those tokens, with it they are cached.
"""

from __future__ import annotations

import asyncio

import pytest

from agentserve.config import RouterConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.router.dispatch import WARM_PRIORITY, Dispatcher, EngineTransport
from agentserve.router.placement import RouteRequest
from agentserve.router.remote import in_process
from agentserve.worker.engine import GenerateRequest, SamplingParams, StepStream
from agentserve.worker.engines.sim import SimConfig, SimEngine

pytestmark = pytest.mark.anyio

BS = 16
PROMPT = list(range(1, 200))
SUFFIX = list(range(900, 950))  # what the template writes after the output, before the next message
TOOL_RESULT = list(range(2000, 2100))


def route(tokens: list[int]) -> RouteRequest:
    return RouteRequest(block_hashes(tokens, BS), len(tokens), session_id="s")


async def two_turns(*, speculative: bool) -> tuple[int, list[GenerateRequest]]:
    engines = {f"w{i}": SimEngine(SimConfig(num_blocks=512, block_size=BS, speedup=0)) for i in range(2)}
    for e in engines.values():
        await e.start()
    backend = await in_process(engines, RouterConfig(block_size=BS))
    assert await backend.wait_ready(5)
    seen: list[GenerateRequest] = []

    class Recording(EngineTransport):
        async def open(self, request: GenerateRequest) -> StepStream:
            seen.append(request)
            return await super().open(request)

    transports = {name: Recording(e) for name, e in engines.items()}
    dispatcher = Dispatcher(backend.router, lambda: transports)
    try:
        first = await dispatcher.generate(
            GenerateRequest("t1", PROMPT, SamplingParams(max_tokens=20, ignore_eos=True)), route(PROMPT)
        )
        async for _ in first:
            pass
        predicted = [*PROMPT, *first.output_token_ids, *SUFFIX]
        if speculative:
            task = dispatcher.speculative_prefill(predicted, route(predicted))
            assert task is not None
            warmed = await task
            assert warmed is not None and warmed.worker == first.decision.worker
        await asyncio.sleep(0.02)  # stored events reach the router
        second_prompt = [*predicted, *TOOL_RESULT]
        second = await dispatcher.generate(
            GenerateRequest("t2", second_prompt, SamplingParams(max_tokens=4)), route(second_prompt)
        )
        async for _ in second:
            pass
        assert second.decision.worker == first.decision.worker
        assert second.cached_tokens is not None
        return second.cached_tokens, seen
    finally:
        await dispatcher.aclose()
        await backend.aclose()
        for e in engines.values():
            await e.stop()


async def test_the_next_turn_finds_the_warmed_prefix_cached() -> None:
    plain, _ = await two_turns(speculative=False)
    warmed, seen = await two_turns(speculative=True)
    output_end = len(PROMPT) + 20
    assert plain == output_end // BS * BS  # prompt + output blocks: the sim keeps those anyway
    assert warmed == (output_end + len(SUFFIX)) // BS * BS  # + the template's tokens, warmed
    assert warmed > plain
    (warm,) = [r for r in seen if r.request_id.startswith("warm-")]
    assert warm.priority == WARM_PRIORITY and warm.sampling.max_tokens == 1


async def test_a_warm_up_with_nowhere_to_go_is_skipped_quietly() -> None:
    backend = await in_process({}, RouterConfig(block_size=BS))
    dispatcher = backend.dispatcher(max_attempts=1)
    assert await dispatcher.warm(PROMPT, route(PROMPT)) is None
    await backend.aclose()


async def test_speculative_prefills_in_flight_are_bounded_and_cancelled_on_close() -> None:
    engine = SimEngine(SimConfig(num_blocks=512, block_size=BS, speedup=1e-3))  # very slow: stays in flight
    await engine.start()
    backend = await in_process({"w": engine}, RouterConfig(block_size=BS))
    dispatcher = Dispatcher(backend.router, backend.workers, max_warming=2)
    assert dispatcher.speculative_prefill(PROMPT, route(PROMPT)) is not None
    assert dispatcher.speculative_prefill(PROMPT, route(PROMPT)) is not None
    assert dispatcher.speculative_prefill(PROMPT, route(PROMPT)) is None  # over the bound: skipped
    await asyncio.sleep(0.01)
    await dispatcher.aclose()
    await asyncio.sleep(0.01)
    assert engine.load().running + engine.load().waiting == 0  # cancelled warm-ups were aborted
    await backend.aclose()
    await engine.stop()
