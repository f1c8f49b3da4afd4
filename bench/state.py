"""The shared state store on the request path, and request migration's cost (issue 12).

Store: what one request adds, as the frontend does it — before decode, the lookup of what this
replica lacks (a Chat turn's call ids: one MGET; a Responses `previous_response_id`: one GET), and
after the turn one pipelined write (the assistant turn / the whole stored response). Measured for
the Redis store (a real redis-server on loopback, started here) against the in-process store in the
same run: p50/p99 µs per request and the ratio. Nothing runs per token.

Migration: streams on 3 sim workers, one dying after a few steps. Per migrated stream: the extra
prefill (output tokens re-sent as prompt) and the gap from the failure to the first migrated token,
against a fresh request's time to first token measured in the same run.

    PYTHONPATH=src python bench/state.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agentserve.api.memory import CallMemory
from agentserve.api.responses import ResponseStore
from agentserve.config import RouterConfig
from agentserve.conversation import Message, Reasoning, Text, ToolCall
from agentserve.prompt.hashing import block_hashes
from agentserve.router.core import RouterCore
from agentserve.router.dispatch import Dispatcher, EngineTransport, WorkerTransport
from agentserve.router.placement import RouteRequest
from agentserve.state import InProcessStore, RedisStore, StateStore
from agentserve.state.shared import SharedState
from agentserve.worker.engine import GenerateRequest, Hints, SamplingParams, Step, StepStream
from agentserve.worker.engines.sim import SimConfig, SimEngine


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server not found (scripts/install-redis installs it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(500):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
                break
            time.sleep(0.01)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()


def turn(i: int) -> Message:
    return Message(
        "assistant",
        (
            Reasoning("I should look at the file first. " * 8),
            Text("Let me check."),
            ToolCall(f"call_{i:024x}", "Bash", '{"command": "ls -la src/agentserve"}'),
        ),
    )


def history(n: int) -> tuple[Message, ...]:
    out: list[Message] = []
    for i in range(n):
        out.append(Message("user", (Text("please continue with the next step " * 10),)))
        out.append(turn(i))
    return tuple(out)


async def timed(op: Callable[[int], Awaitable[None]], n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        await op(i)
        out.append((time.perf_counter() - t) * 1e6)
    return out


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


async def store_case(store: StateStore, n: int, turns_in_history: int) -> dict[str, list[float]]:
    """Per-request µs: a Chat turn whose history's call ids this replica never saw (another replica
    made them), and a Responses turn continuing a stored response this replica does not hold."""
    # Another replica wrote the turns / responses this one will be asked about.
    writer = SharedState(store, CallMemory(), ResponseStore(), response_ttl_s=3600, turn_ttl_s=3600)
    for i in range(n):
        await writer.save_turns("scope", [turn(i * 1000 + k) for k in range(turns_in_history)])
        await writer.save_response("scope", f"resp_{i}", (), history(turns_in_history), {"id": f"resp_{i}"})
    results: dict[str, list[float]] = {}

    reader = SharedState(store, CallMemory(), ResponseStore(), response_ttl_s=3600, turn_ttl_s=3600)

    async def chat(i: int) -> None:
        body: dict[str, Any] = {
            "messages": [
                {"role": "assistant", "tool_calls": [{"id": f"call_{i * 1000 + k:024x}"}]}
                for k in range(turns_in_history)
            ]
        }
        await reader.prefetch("chat", body, "scope")
        await reader.save_turns("scope", [turn(10**6 + i)])

    async def responses(i: int) -> None:
        await reader.prefetch("responses", {"previous_response_id": f"resp_{i}"}, "scope")
        held = reader.responses.get(f"resp_{i}", "scope")
        assert held is not None
        await reader.save_response("scope", f"next_{i}", (), (*held, turn(i)), {"id": f"next_{i}"})

    results["chat"] = await timed(chat, n)
    results["responses"] = await timed(responses, n)
    return results


async def bench_store(n: int, turns_in_history: int) -> None:
    with redis_server() as url:
        redis = RedisStore(url)
        for _ in range(2):  # warm both once, then measure each in turn (same run, interleaved)
            local = await store_case(InProcessStore(10**6), n, turns_in_history)
            remote = await store_case(redis, n, turns_in_history)
        await redis.close()
    print(f"store per request ({n} requests, {turns_in_history} turns of history; µs)")
    print(f"{'request':<11}{'in-process p50':>16}{'p99':>9}{'redis p50':>12}{'p99':>9}{'ratio p50':>11}")
    for kind in ("chat", "responses"):
        a, b = local[kind], remote[kind]
        print(
            f"{kind:<11}{pct(a, 0.5):>16.1f}{pct(a, 0.99):>9.1f}{pct(b, 0.5):>12.1f}{pct(b, 0.99):>9.1f}"
            f"{pct(b, 0.5) / pct(a, 0.5):>11.1f}"
        )


class DiesAfter:
    """A worker whose connection resets after `n` steps of a real engine."""

    def __init__(self, engine: SimEngine, n: int) -> None:
        self.engine, self.n = engine, n

    async def open(self, request: GenerateRequest) -> StepStream:
        inner = self.engine.generate(request)
        n = self.n

        async def steps() -> AsyncIterator[Step]:
            for _ in range(n):
                step = await inner.__anext__()
                yield Step(step.token_ids, step.text, step.cached_tokens)
            await inner.aclose()
            raise ConnectionResetError("connection reset by peer")

        return steps()  # type: ignore[return-value]


PROMPT = [(t * 31) % 5000 + 10 for t in range(4096)]
HINTS = Hints(turn=1, last_user_message="hi", last_message="hi")


async def bench_migration(streams: int) -> None:
    engines = [SimEngine(SimConfig(num_blocks=8192, block_size=32, speedup=20)) for _ in range(3)]
    for e in engines:
        await e.start()
    ttft: list[float] = []
    gaps: list[float] = []
    resumed: list[int] = []
    for i in range(streams):
        core = RouterCore(RouterConfig(block_size=32, policy="round-robin"))
        transports: dict[str, WorkerTransport] = {
            "dying": DiesAfter(engines[0], 4),
            "a": EngineTransport(engines[1]),
            "b": EngineTransport(engines[2]),
        }
        for name in transports:
            core.add_worker(name)
        dispatcher = Dispatcher(core, lambda t=transports: t)  # type: ignore[misc]
        prompt = [i + 1, *PROMPT]
        route = RouteRequest(block_hashes(prompt, 32), len(prompt))
        # A fresh request's TTFT on a healthy worker (the baseline), then one on the dying worker.
        request = GenerateRequest(
            f"fresh-{i}", prompt, SamplingParams(max_tokens=64, ignore_eos=True), hints=HINTS
        )
        core.placement._rr = 1  # type: ignore[attr-defined]
        t = time.perf_counter()
        stream = await dispatcher.generate(request, route)
        async for step in stream:
            if step.token_ids:
                ttft.append(time.perf_counter() - t)
                break
        await stream.aclose()
        core.placement._rr = 0  # type: ignore[attr-defined]
        request = GenerateRequest(
            f"mig-{i}", prompt, SamplingParams(max_tokens=256, ignore_eos=True), hints=HINTS
        )
        stream = await dispatcher.generate(request, route)
        total = sum([len(s.token_ids) async for s in stream])
        assert total == 256 and stream.migrations, "the stream must migrate and finish whole"
        m = stream.migrations[0]
        assert m.gap_s is not None
        gaps.append(m.gap_s)
        resumed.append(m.resumed_tokens)
    for e in engines:
        await e.stop()
    print(
        f"\nmigration ({streams} streams, {len(PROMPT)}-token prompt, worker dies after 4 steps; "
        f"engine profile {engines[0].config.timing.name} at speed-up 20)"
    )
    print(
        f"extra prefill per migrated stream: {statistics.mean(resumed):.0f} tokens re-sent as prompt (mean)"
    )
    g50, t50 = statistics.median(gaps) * 1e3, statistics.median(ttft) * 1e3
    print(f"failure → first migrated token p50 {g50:.2f} ms; a fresh request's TTFT p50 {t50:.2f} ms")
    print(
        f"ratio (gap / fresh TTFT): {g50 / t50:.2f}  (a migration costs about one prefill of prompt + output)"
    )


def main() -> None:
    logging.getLogger("agentserve.router.dispatch").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 300 if args.quick else 3000
    asyncio.run(bench_store(n, 8))
    asyncio.run(bench_migration(5 if args.quick else 20))


if __name__ == "__main__":
    main()
