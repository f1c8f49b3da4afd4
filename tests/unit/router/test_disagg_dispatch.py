"""Disaggregated prefill end to end in one process: router decision → context-only request on a
prefill sim engine → KV pulled by the decode sim engine → decode there; and the fallbacks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest

from agentserve.config import RouterConfig
from agentserve.frontend.backend import EngineBackend
from agentserve.prompt.hashing import block_hashes
from agentserve.router.placement import RouteRequest
from agentserve.worker.engine import GenerateRequest, KvTransfer, SamplingParams, StepStream
from agentserve.worker.engines.sim import SimConfig, SimEngine

pytestmark = pytest.mark.anyio

BS = 32
THRESHOLD = 256


def engine(**config: object) -> SimEngine:
    return SimEngine(SimConfig(num_blocks=4096, block_size=BS, speedup=0, **config))  # type: ignore[arg-type]


def backend(prefill: SimEngine | None = None) -> EngineBackend:
    engines = {"d0": engine(), "d1": engine(), "p0": prefill or engine()}
    config = RouterConfig(block_size=BS, prefill_threshold_tokens=THRESHOLD)
    return EngineBackend(engines, config, roles={"p0": "prefill", "d0": "decode", "d1": "decode"})


def request(tokens: list[int], rid: str) -> tuple[GenerateRequest, RouteRequest]:
    return (
        GenerateRequest(rid, tokens, SamplingParams(max_tokens=8)),
        RouteRequest(block_hashes(tokens, BS), len(tokens), session_id="s", osl=8),
    )


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def run(b: EngineBackend, tokens: list[int], rid: str) -> tuple[object, list[int], int | None]:
    stream = await b.generate(*request(tokens, rid))
    out: list[int] = []
    cached: int | None = None
    async for step in stream:
        out += step.token_ids
        if step.cached_tokens is not None:
            cached = step.cached_tokens
    return stream, out, cached


async def test_cold_prompt_prefilled_remotely_then_decoded_where_the_kv_landed() -> None:
    b = backend()
    await b.start()
    try:
        cold = list(range(1, 2001))
        stream, out, cached = await run(b, cold, "r1")
        outcome = stream.prefill  # type: ignore[attr-defined]
        assert outcome.outcome == "remote" and outcome.plan.prefill_worker == "p0"
        assert outcome.received_tokens == 2000 // BS * BS
        assert cached == 0 and len(out) == 8
        decode = stream.decision.worker  # type: ignore[attr-defined]
        assert decode in ("d0", "d1")
        # The transferred blocks are in the decode engine's pool and its events told the router.
        hashes = block_hashes(cold, BS)
        assert b.engines[decode].pool.match(hashes) >= len(hashes)  # type: ignore[attr-defined]
        await until(lambda: b.router.index.overlaps(hashes).get(decode, 0) >= len(hashes))
        # The prefill engine keeps the prefix for the next cold session sharing it (released: not held).
        prefill = b.engines["p0"]
        assert prefill.pool.match(hashes) == len(hashes) and prefill.pool.used == 0  # type: ignore[attr-defined]
        # A warm turn on the same session (a few new tokens) prefills where it decodes.
        warm = [*cold, *out, *range(5000, 5100)]
        stream2, _, cached2 = await run(b, warm, "r2")
        assert stream2.prefill.outcome == "local"  # type: ignore[attr-defined]
        assert stream2.decision.worker == decode  # type: ignore[attr-defined]
        assert cached2 is not None and cached2 >= 2000 // BS * BS
        assert b.router.prefill_decisions == {"local": 1, "remote": 1}
        # Same output as an aggregated worker would give (the echo policy reads the prompt).
        ref = engine()
        await ref.start()
        ref_out = [t async for s in ref.generate(request(cold, "ref")[0]) for t in s.token_ids]
        await ref.stop()
        assert out == ref_out
    finally:
        await b.stop()


class DeadPrefill:
    """A prefill worker whose process is gone: connecting fails."""

    async def open(self, request: GenerateRequest) -> StepStream:
        raise ConnectionRefusedError("connection refused")


async def test_a_dead_prefill_worker_means_local_prefill_and_no_error() -> None:
    b = backend()
    await b.start()
    try:
        b._transports["p0"] = DeadPrefill()  # type: ignore[assignment]
        stream, out, cached = await run(b, list(range(1, 2001)), "r1")
        assert stream.prefill.outcome == "prefill-failed"  # type: ignore[attr-defined]
        assert len(out) == 8 and cached == 0
        assert "p0" not in b.router.workers  # reported failed: the router stops choosing it
    finally:
        await b.stop()


async def test_a_failed_pull_means_the_decode_worker_prefills_locally() -> None:
    b = backend(prefill=engine(kv_hold_s=0.0))  # the held KV is released before any pull
    await b.start()
    try:
        stream, out, _ = await run(b, list(range(1, 2001)), "r1")
        outcome = stream.prefill  # type: ignore[attr-defined]
        assert outcome.outcome == "transfer-failed" and outcome.received_tokens == 0
        assert len(out) == 8
    finally:
        await b.stop()


async def test_the_sim_holds_kv_until_pulled_once() -> None:
    e = engine()
    await e.start()
    try:
        prompt = list(range(1, 101))
        steps = [
            s
            async for s in e.generate(
                GenerateRequest("c", prompt, SamplingParams(max_tokens=50), context_only=True)
            )
        ]
        assert sum(len(s.token_ids) for s in steps) == 1  # context-only: one token
        held = steps[-1].kv_transfer
        assert held == KvTransfer("c", 96)
        assert e.pool.used == 3  # three full blocks referenced until pulled
        assert await e.kv_pull(held) == 96
        assert await e.kv_pull(held) is None and e.pool.used == 0
        assert await e.kv_pull(replace(held, handle="nope")) is None
    finally:
        await e.stop()


class HungPrefill:
    """A prefill worker that accepts the request and never answers."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def open(self, request: GenerateRequest) -> StepStream:
        self.opened.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_client_gone_during_remote_prefill_leaves_no_load_behind() -> None:
    b = backend()
    await b.start()
    try:
        hung = HungPrefill()
        b._transports["p0"] = hung  # type: ignore[assignment]
        task = asyncio.create_task(b.generate(*request(list(range(1, 2001)), "r1")))
        await asyncio.wait_for(hung.opened.wait(), 5)
        assert b.router.placement.inflight("p0") == 1 and b.router.backlog("p0") > 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for worker in ("d0", "d1", "p0"):
            assert b.router.placement.inflight(worker) == 0, worker
        assert b.router.backlog("p0") == 0
    finally:
        await b.stop()
