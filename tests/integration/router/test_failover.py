"""Failover with real processes: 3 `agentserve worker --engine sim` and an `agentserve router`.

The frontend side is `connect(FrontendConfig)` → `Dispatcher`, as the frontend builds it. A worker
is SIGKILLed while requests stream from it. Every request must complete: retried on another worker
if it had not streamed a token yet, migrated (prompt + tokens so far re-dispatched) if it had; the
router must purge the dead worker's blocks and keep placing requests by cache.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field

import httpx
import pytest
from procs import Processes, wait_ready

from agentserve.config import FrontendConfig, RouterConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.router.dispatch import Dispatcher, WorkerLostError
from agentserve.router.placement import RouteRequest
from agentserve.router.remote import Backend, connect, embedded
from agentserve.worker.engine import GenerateRequest, Hints, SamplingParams

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BS = 16
HINTS = Hints(turn=1, last_user_message="hi", last_message="hi")  # the sim need not decode prompts
WORKER_FLAGS = ("--block-size", str(BS), "--sim-kv-blocks", "4096", "--sim-speedup", "1")


def prompt(session: int, n: int) -> list[int]:
    return [(session * 7919 + t * 31) % 5000 + 10 for t in range(n)]


@dataclass
class Outcome:
    name: str
    worker: str = ""
    tokens: int = 0
    finish: str | None = None
    lost: bool = False
    migrated: int = 0
    ended_at: float = 0.0
    attempts: list[str] = field(default_factory=list)


async def run(dispatcher: Dispatcher, out: Outcome, tokens: list[int], max_tokens: int) -> Outcome:
    route = RouteRequest(block_hashes(tokens, BS), len(tokens), session_id=out.name)
    request = GenerateRequest(
        out.name, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True), hints=HINTS
    )
    stream = await dispatcher.generate(request, route)
    out.worker = stream.decision.worker
    try:
        async for step in stream:
            out.worker = stream.decision.worker
            out.tokens += len(step.token_ids)
            out.finish = step.finish_reason or out.finish
    except WorkerLostError:
        out.lost = True
    out.attempts = [a.worker for a in stream.attempts]
    out.migrated = len(stream.migrations)
    out.ended_at = time.monotonic()
    return out


async def until(check, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.05)
    return False


async def kill_mid_run(
    backend: Backend, pids: dict[str, int]
) -> tuple[str, list[Outcome], list[Outcome], float]:
    """Warm prompts on every worker, start long requests, SIGKILL the busiest worker while they
    stream, then send the warmed prompts again. Returns (victim, long outcomes, probe outcomes)."""
    dispatcher = backend.dispatcher()
    # Probes: long prompts (100 blocks), so a repeat goes to whoever holds them whatever the load.
    probes = [await run(dispatcher, Outcome(f"probe-{i}"), prompt(i, 100 * BS), 1) for i in range(6)]
    await asyncio.sleep(0.3)  # their stored events reach the router
    long = [Outcome(f"long-{i}") for i in range(18)]
    tasks = [
        asyncio.create_task(run(dispatcher, o, prompt(100 + i, 12 * BS), 300)) for i, o in enumerate(long)
    ]

    async def streaming() -> bool:
        per: dict[str, int] = {}
        for o in long:
            if o.tokens and o.worker in {p.worker for p in probes}:
                per[o.worker] = per.get(o.worker, 0) + 1
        return any(n >= 2 for n in per.values())

    assert await until(streaming)
    counts: dict[str, int] = {}
    for o in long:
        if o.tokens and o.finish is None:
            counts[o.worker] = counts.get(o.worker, 0) + 1
    victim = max((w for w in counts if w in {p.worker for p in probes}), key=lambda w: counts[w])
    os.kill(pids[victim], signal.SIGKILL)
    killed_at = time.monotonic()
    # Right away, before the router noticed: the victim's prompts are routed to it, fail to
    # connect, and must be retried elsewhere.
    again = [Outcome(f"again-{p.name}") for p in probes if p.worker == victim]
    retried = [
        asyncio.create_task(run(dispatcher, o, prompt(int(o.name.rsplit("-", 1)[1]), 100 * BS), 4))
        for o in again
    ]
    await asyncio.wait_for(asyncio.gather(*tasks, *retried), 20)
    return victim, long, again, killed_at


def check_outcomes(victim: str, long: list[Outcome], again: list[Outcome], killed_at: float) -> None:
    migrated = [o for o in long if o.migrated]
    assert migrated, "the victim had streaming requests: they must have migrated"
    for o in long:
        assert not o.lost
        assert o.finish == "length" and o.tokens == 300  # every token once, none lost
        assert o.worker != victim or o.ended_at < killed_at
    for o in migrated:
        assert o.attempts == [victim] and o.migrated == 1
    assert again
    for o in again:
        assert o.finish == "length" and o.worker != victim
    assert any(o.attempts == [victim] for o in again), "a retry before the first token was exercised"


async def test_a_worker_killed_mid_run_through_the_router_service() -> None:
    with Processes() as procs:
        workers = [procs.worker(*WORKER_FLAGS) for _ in range(3)]
        router_url, _ = procs.router(
            [url for url, _ in workers],
            "--block-size", str(BS), "--health-interval-s", "0.2", "--kv-events-timeout-s", "1.5",
        )  # fmt: skip
        await asyncio.to_thread(wait_ready, router_url)
        async with httpx.AsyncClient(base_url=router_url) as http:

            async def all_live() -> bool:
                return (await http.get("/workers")).json().get("routable") == 3

            assert await until(all_live, 30), procs.logs()
            backend = await connect(
                FrontendConfig.model_validate({"router_url": router_url, "block_size": BS})
            )
            try:
                assert await backend.wait_ready(5)
                pids = {url: proc.pid for url, proc in workers}
                victim, long, again, killed_at = await kill_mid_run(backend, pids)
                check_outcomes(victim, long, again, killed_at)

                async def purged() -> bool:
                    listed = {w["id"]: w for w in (await http.get("/workers")).json()["workers"]}
                    return listed[victim]["state"] != "live" and listed[victim]["cached_blocks"] == 0

                assert await until(purged, 5)
                metrics = (await http.get("/metrics")).text
                assert "agentserve_router_worker_removals_total" in metrics
                # The index keeps serving: a survivor's cached prompt goes back to it.
                survivor = next(o for o in long if o.worker != victim and o.finish)
                decision = await backend.router.route(
                    RouteRequest(block_hashes(prompt(100 + int(survivor.name[5:]), 12 * BS), BS), 12 * BS)
                )
                assert decision.worker == survivor.worker and decision.overlap_blocks == 12
                await backend.router.finish(decision)
                assert victim not in backend.workers()
            finally:
                await backend.aclose()


async def test_a_worker_killed_mid_run_with_the_router_embedded_in_the_frontend() -> None:
    with Processes() as procs:
        workers = [procs.worker(*WORKER_FLAGS) for _ in range(3)]
        for url, _ in workers:
            await asyncio.to_thread(wait_ready, url)
        config = FrontendConfig.model_validate({"worker_urls": [url for url, _ in workers], "block_size": BS})
        backend = await connect(config)
        try:
            assert await until(lambda: _live(backend, 3), 30)
            pids = {url: proc.pid for url, proc in workers}
            victim, long, again, killed_at = await kill_mid_run(backend, pids)
            check_outcomes(victim, long, again, killed_at)
            core = backend.router.core  # type: ignore[attr-defined]
            assert victim not in core.workers and core.index.held_count(victim) == 0
            assert victim not in backend.workers()
        finally:
            await backend.aclose()


async def _live(backend: Backend, n: int) -> bool:
    return len(backend.workers()) >= n


async def test_a_hung_worker_is_declared_dead_and_its_streams_end() -> None:
    """SIGSTOP: the worker's sockets stay open and silent, so only the router's verdict (failed
    /ready probes, no heartbeat) can end what is waiting on it."""
    with Processes() as procs:
        workers = [procs.worker(*WORKER_FLAGS) for _ in range(2)]
        for url, _ in workers:
            await asyncio.to_thread(wait_ready, url)
        pids = {url: proc.pid for url, proc in workers}
        config = RouterConfig.model_validate(
            {"block_size": BS, "workers": list(pids), "health_interval_s": 0.2, "kv_events_timeout_s": 1.5}
        )
        backend = await embedded(config)
        stopped: int | None = None
        try:
            assert await until(lambda: _live(backend, 2), 30)
            dispatcher = backend.dispatcher()
            probes = [await run(dispatcher, Outcome(f"probe-{i}"), prompt(i, 100 * BS), 1) for i in range(4)]
            await asyncio.sleep(0.3)
            long = [Outcome(f"long-{i}") for i in range(8)]
            tasks = [
                asyncio.create_task(run(dispatcher, o, prompt(100 + i, 12 * BS), 600))
                for i, o in enumerate(long)
            ]

            async def streaming_on_a_probe_holder() -> bool:
                return any(o.tokens and o.worker in {p.worker for p in probes} for o in long)

            assert await until(streaming_on_a_probe_holder)
            victim = next(o.worker for o in long if o.tokens and o.worker in {p.worker for p in probes})
            os.kill(pids[victim], signal.SIGSTOP)
            stopped = pids[victim]
            stopped_at = time.monotonic()
            # Its cached prompts are routed to it before the router notices: the open hangs.
            again = [Outcome(f"again-{p.name}") for p in probes if p.worker == victim]
            retried = [
                asyncio.create_task(run(dispatcher, o, prompt(int(o.name.rsplit("-", 1)[1]), 100 * BS), 4))
                for o in again
            ]
            await asyncio.wait_for(asyncio.gather(*tasks, *retried), 20)
            for o in long:  # the hung worker's streams moved to the other one once it was declared dead
                assert not o.lost and o.finish == "length" and o.tokens == 600 and o.worker != victim
                if o.migrated:
                    assert o.attempts == [victim] and o.ended_at - stopped_at < 20.0
            assert any(o.migrated for o in long)
            assert again and all(o.finish == "length" and o.worker != victim for o in again)
            assert any(o.attempts == [victim] for o in again)  # a hung open was interrupted, retried
            fleet = backend.router.fleet  # type: ignore[attr-defined]
            assert fleet.removals["unhealthy"] + fleet.removals["silent"] == 1
            assert victim not in backend.workers()
        finally:
            if stopped is not None:
                os.kill(stopped, signal.SIGKILL)  # a stopped process still takes SIGKILL
            await backend.aclose()
