"""Disaggregated prefill with real processes: 1 prefill + 2 decode `agentserve worker --engine sim`,
an `agentserve router --prefill-workers`, and the frontend's dispatcher (`connect`).

A cold prompt is prefilled on the prefill worker and its KV pulled by the decode worker over HTTP;
a short uncached span stays local. Faults: the prefill worker SIGKILLed mid-prefill, a KV pull that
finds nothing held, a decode worker SIGKILLed mid-decode; every request completes without error.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
from procs import Processes, wait_ready

from agentserve.config import FrontendConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.router.dispatch import DispatchedStream, Dispatcher
from agentserve.router.placement import RouteRequest
from agentserve.router.remote import Backend, connect
from agentserve.worker.engine import GenerateRequest, Hints, SamplingParams

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BS = 16
HINTS = Hints(turn=1, last_user_message="hi", last_message="hi")  # the sim need not decode prompts
FLAGS = ("--block-size", str(BS), "--sim-kv-blocks", "4096")
COLD = 6000  # tokens: well above the threshold below
THRESHOLD = 1000


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + t * 31) % 5000 + 10 for t in range(n)]


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.05)
    return False


class Stack:
    def __init__(self, procs: Processes, prefill_flags: tuple[str, ...] = ("--sim-speedup", "1")) -> None:
        self.procs = procs
        self.prefill_url, self.prefill = procs.worker(*FLAGS, "--role", "prefill", *prefill_flags)
        self.decode = [procs.worker(*FLAGS, "--role", "decode", "--sim-speedup", "1") for _ in range(2)]
        self.router_url, _ = procs.router(
            [url for url, _ in self.decode],
            "--prefill-workers", self.prefill_url, "--block-size", str(BS),
            "--prefill-threshold-tokens", str(THRESHOLD),
            "--health-interval-s", "0.2", "--kv-events-timeout-s", "1.5",
        )  # fmt: skip

    async def connect(self) -> Backend:
        await asyncio.to_thread(wait_ready, self.router_url)
        async with httpx.AsyncClient(base_url=self.router_url) as http:

            async def all_live() -> bool:
                return (await http.get("/workers")).json().get("routable") == 3

            assert await until(all_live, 30), self.procs.logs()
        backend = await connect(
            FrontendConfig.model_validate({"router_url": self.router_url, "block_size": BS})
        )
        assert await backend.wait_ready(5)
        return backend


async def run(
    dispatcher: Dispatcher, name: str, tokens: list[int], max_tokens: int = 16
) -> tuple[DispatchedStream, int]:
    route = RouteRequest(block_hashes(tokens, BS), len(tokens), session_id=name, osl=max_tokens)
    request = GenerateRequest(
        name, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True), hints=HINTS
    )
    stream = await dispatcher.generate(request, route)
    n = 0
    async for step in stream:
        n += len(step.token_ids)
    return stream, n


async def test_cold_prompts_go_to_the_prefill_worker_and_their_kv_lands_on_the_decode_worker() -> None:
    with Processes() as procs:
        stack = Stack(procs)
        backend = await stack.connect()
        try:
            dispatcher = backend.dispatcher()
            cold = prompt(1, COLD)
            stream, n = await run(dispatcher, "s1", cold)
            outcome = stream.prefill
            assert n == 16 and outcome is not None, procs.logs()
            assert outcome.outcome == "remote" and outcome.plan.prefill_worker == stack.prefill_url
            assert outcome.received_tokens == COLD // BS * BS
            decode = stream.decision.worker
            hashes = set(block_hashes(cold, BS))
            async with httpx.AsyncClient() as http:
                snap = (await http.get(decode + "/kv/snapshot")).json()
                assert hashes <= set(snap["block_hashes"])  # the transferred blocks are in its pool
                # ... and the prefill worker keeps the prefix for the next cold session sharing it.
                kept = (await http.get(stack.prefill_url + "/kv/snapshot")).json()
                assert hashes <= set(kept["block_hashes"])

                async def indexed() -> bool:  # the decode worker's KV events reached the router
                    workers = (await http.get(stack.router_url + "/workers")).json()["workers"]
                    return any(w["id"] == decode and w["cached_blocks"] >= len(hashes) for w in workers)

                assert await until(indexed, 10)
            # The next turn adds a few tokens: prefilled where it decodes.
            stream2, _ = await run(dispatcher, "s1", [*cold, *range(100, 300)])
            assert stream2.prefill is not None and stream2.prefill.outcome == "local"
            assert stream2.decision.worker == decode
            async with httpx.AsyncClient() as http:
                metrics = (await http.get(stack.router_url + "/metrics")).text
            assert 'agentserve_router_prefill_decisions_total{where="remote"} 1.0' in metrics
            assert 'agentserve_router_prefill_decisions_total{where="local"} 1.0' in metrics
        finally:
            await backend.aclose()


async def test_a_prefill_worker_killed_mid_prefill_leaves_the_request_to_the_decode_worker() -> None:
    with Processes() as procs:
        # A slow prefill worker (a twentieth of real time: ~2 s), so the kill lands inside its prefill.
        stack = Stack(procs, ("--sim-speedup", "0.05"))
        backend = await stack.connect()
        try:
            task = asyncio.create_task(run(backend.dispatcher(), "s1", prompt(2, COLD)))
            async with httpx.AsyncClient() as http:

                async def prefilling() -> bool:  # the prompt reached its scheduler (counted on arrival)
                    return bool((await http.get(stack.prefill_url + "/load")).json()["prompt_tokens"])

                assert await until(prefilling, 20), procs.logs()
            os.kill(stack.prefill.pid, signal.SIGKILL)
            stream, n = await asyncio.wait_for(task, 30)
            assert n == 16
            assert stream.prefill is not None and stream.prefill.outcome == "prefill-failed"
            assert stream.decision.worker != stack.prefill_url
        finally:
            await backend.aclose()


async def test_a_failed_kv_pull_is_prefilled_on_the_decode_worker() -> None:
    with Processes() as procs:
        stack = Stack(procs, ("--sim-speedup", "1", "--sim-kv-hold-s", "0"))  # nothing stays held
        backend = await stack.connect()
        try:
            stream, n = await run(backend.dispatcher(), "s1", prompt(3, COLD))
            assert n == 16
            assert stream.prefill is not None and stream.prefill.outcome == "transfer-failed"
            assert stream.prefill.received_tokens == 0
        finally:
            await backend.aclose()


async def test_a_decode_worker_killed_mid_decode_migrates_the_stream() -> None:
    with Processes() as procs:
        stack = Stack(procs)
        backend = await stack.connect()
        try:
            dispatcher = backend.dispatcher()
            tokens = prompt(4, COLD)
            route = RouteRequest(block_hashes(tokens, BS), len(tokens), session_id="s", osl=400)
            request = GenerateRequest(
                "s", tokens, SamplingParams(max_tokens=400, ignore_eos=True), hints=HINTS
            )
            stream = await dispatcher.generate(request, route)
            assert stream.prefill is not None and stream.prefill.outcome == "remote", stream.prefill
            pids = {url: proc.pid for url, proc in stack.decode}
            n = 0
            killed = False
            async for step in stream:
                n += len(step.token_ids)
                if n >= 20 and not killed:
                    os.kill(pids[stream.decision.worker], signal.SIGKILL)
                    killed = True
            assert n == 400 and len(stream.migrations) == 1, (
                n,
                stream.migrations,
                stream.attempts,
                procs.logs(),
            )
        finally:
            await backend.aclose()


async def test_the_frontend_embedded_router_sends_cold_prompts_to_its_prefill_workers() -> None:
    with Processes() as procs:
        prefill_url, _ = procs.worker(*FLAGS, "--role", "prefill", "--sim-speedup", "1")
        decode_url, _ = procs.worker(*FLAGS, "--role", "decode", "--sim-speedup", "1")
        for url in (prefill_url, decode_url):
            await asyncio.to_thread(wait_ready, url)
        config = FrontendConfig.model_validate(
            {"worker_urls": [decode_url], "prefill_worker_urls": [prefill_url], "block_size": BS}
        )
        backend = await connect(config)
        try:
            assert await until(lambda: _live(backend, 2), 30), procs.logs()
            stream, n = await run(backend.dispatcher(), "s1", prompt(5, COLD))
            assert n == 16 and stream.decision.worker == decode_url
            assert stream.prefill is not None and stream.prefill.outcome == "remote"
            assert stream.prefill.plan.prefill_worker == prefill_url
        finally:
            await backend.aclose()


async def _live(backend: Backend, n: int) -> bool:
    return len(backend.workers()) >= n
