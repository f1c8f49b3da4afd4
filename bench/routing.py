"""Routing policies on an agent trace, and the router's own costs (a script, not a test).

    PYTHONPATH=src python bench/routing.py            # full run (~2–3 min)
    PYTHONPATH=src python bench/routing.py --quick    # smoke run (~15 s)
    PYTHONPATH=src python bench/routing.py --profiles h200-qwen3-30b-a3b-pytorch   # one engine profile

1. **Agent trace** (64 sessions × 20 turns): every session starts with a shared system prefix
   (tools + instructions), then its own task; each turn's prompt is the previous prompt + the
   model's output + a tool result, after a tool-execution pause. Run on 4 and 8 sim workers with
   limited KV capacity, once per policy (kv, round-robin, random, least-loaded), through the same
   path `agentserve up` uses: `in_process` engines, their KV events into the router, `Dispatcher`.
   Time is simulated: the asyncio loop's clock jumps to the next timer instead of sleeping, so
   the sim engines' timing model alone decides TTFT, however busy this machine is. The trace runs
   once per engine profile (`--profiles`, default every shipped one: the B200 estimate and the H200
   measurement), in the same run. Per policy: prefix hit rate (cached / prompt tokens) against an oracle
   with one infinite cache, TTFT p50/p99, and load spread (max/mean of requests and of prefill
   tokens computed per worker).
2. **Decision latency** at 100k indexed blocks (real clock): `RouterCore.decide` for 20K-token
   prompts against an index of 100k distinct blocks on 8 workers.
3. **Ingest**: KV event messages the trace's engines really published, decoded and applied to a
   fresh index (the router's ingestion path minus the socket): events/s and block events/s.
4. **Route API wire cost**: encode + decode of a 20K-token route request and its reply, JSON vs
   msgpack, and the round trip through the router service on loopback (`RouterClient`).

Writes `bench/results/routing.png` (TTFT distributions per policy) and prints the tables.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import selectors
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentserve.config import RouterConfig  # noqa: E402
from agentserve.prompt.hashing import block_hashes  # noqa: E402
from agentserve.router.core import RouterCore  # noqa: E402
from agentserve.router.dispatch import Dispatcher  # noqa: E402
from agentserve.router.index import target  # noqa: E402
from agentserve.router.placement import RouteRequest  # noqa: E402
from agentserve.router.remote import in_process  # noqa: E402
from agentserve.router.sync import WorkerSync  # noqa: E402
from agentserve.router.wire import decode_decision, decode_route, encode_decision, encode_route  # noqa: E402
from agentserve.worker.engine import GenerateRequest, Hints, KvEvent, SamplingParams  # noqa: E402
from agentserve.worker.engines.sim import SimConfig, SimEngine  # noqa: E402
from agentserve.worker.kvwire import decode_message, encode_batch  # noqa: E402
from agentserve.worker.profiles import load_profile, shipped_profiles  # noqa: E402
from agentserve.worker.timing import TimingModel  # noqa: E402

POLICIES = ("kv", "round-robin", "random", "least-loaded")
BS = 32
T = TypeVar("T")


# -- simulated time --------------------------------------------------------------------------------


class _JumpSelector(selectors.DefaultSelector):
    """Never waits: a select with a timeout moves the loop's clock forward by that timeout."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)  # the loop's own wake-up pipe; nothing else is registered
        if ready:
            return ready
        if timeout is None:
            raise RuntimeError("simulation deadlock: nothing is scheduled and nothing can wake the loop")
        self._loop.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is simulated: idle time costs nothing, CPU time counts zero."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpSelector(self))

    def time(self) -> float:
        return self.now


def simulate(main: Coroutine[Any, Any, T]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()


# -- the trace -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    sessions: int = 64
    turns: int = 20
    system_tokens: int = 4096  # shared by every session (tools, instructions)
    task_tokens: tuple[int, int] = (200, 800)  # each session's first message
    tool_tokens: tuple[int, int] = (300, 1500)  # each tool result
    output_tokens: tuple[int, int] = (60, 300)  # each model turn
    pause_s: tuple[float, float] = (0.5, 4.0)  # tool execution between turns
    start_spread_s: float = 20.0  # sessions start uniformly over this window
    seed: int = 7


@dataclass
class Record:
    worker: str
    prompt: int
    cached: int
    oracle: int
    ttft: float
    computed: int  # prompt tokens prefilled (not cached)


@dataclass
class RunResult:
    policy: str
    workers: int
    records: list[Record] = field(default_factory=list)
    events: list[list[bytes]] = field(default_factory=list)  # KV messages published (for the ingest bench)
    sim_seconds: float = 0.0
    wall_seconds: float = 0.0

    def hit_rate(self) -> float:
        return sum(r.cached for r in self.records) / sum(r.prompt for r in self.records)

    def oracle_rate(self) -> float:
        return sum(r.oracle for r in self.records) / sum(r.prompt for r in self.records)

    def ttfts(self) -> list[float]:
        return sorted(r.ttft for r in self.records)

    def spread(self, value: Callable[[Record], float]) -> float:
        per: dict[str, float] = {}
        for r in self.records:
            per[r.worker] = per.get(r.worker, 0.0) + value(r)
        totals = [per.get(f"w{i}", 0.0) for i in range(self.workers)]
        return max(totals) / statistics.fmean(totals)


class Oracle:
    """One infinite cache that has seen every block any worker computed."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def cached(self, hashes: Sequence[int], prompt_len: int) -> int:
        n = 0
        for h in hashes:
            if h not in self.seen:
                break
            n += 1
        return min(n * BS, prompt_len - 1)  # at least one token is always computed (as the sim)

    def add(self, hashes: Sequence[int]) -> None:
        self.seen.update(hashes)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_trace(
    trace: Trace,
    policy: str,
    n_workers: int,
    kv_blocks: int,
    *,
    record_events: bool,
    weights: dict[str, float],
    timing: TimingModel,
) -> RunResult:
    loop = asyncio.get_running_loop()
    engines = {
        f"w{i}": SimEngine(SimConfig(num_blocks=kv_blocks, block_size=BS, speedup=1.0, timing=timing))
        for i in range(n_workers)
    }
    for e in engines.values():
        await e.start()
    config = RouterConfig.model_validate({"policy": policy, "block_size": BS, **weights})
    backend = await in_process(engines, config)
    dispatcher = Dispatcher(backend.router, backend.workers)
    result = RunResult(policy, n_workers)
    oracle = Oracle()
    taps: list[asyncio.Task[None]] = []
    if record_events:

        async def tap(engine: SimEngine) -> None:
            async for batch in engine.kv_events():
                result.events.append(encode_batch(batch))

        taps = [asyncio.create_task(tap(e)) for e in engines.values()]
    system = random.Random(trace.seed).choices(range(50_000), k=trace.system_tokens)

    async def session(index: int) -> None:
        rng = random.Random(trace.seed * 1000 + index)
        await asyncio.sleep(rng.uniform(0, trace.start_spread_s))
        prompt = [*system, *rng.choices(range(50_000), k=rng.randint(*trace.task_tokens))]
        for turn in range(1, trace.turns + 1):
            hashes = block_hashes(prompt, BS)
            oracle_cached = oracle.cached(hashes, len(prompt))
            max_tokens = rng.randint(*trace.output_tokens)
            hints = Hints(turn=turn, last_user_message="run the tests", last_message="ok")
            request = GenerateRequest(
                f"s{index}-t{turn}",
                prompt,
                SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                hints=hints,
            )
            t0 = loop.time()
            stream = await dispatcher.generate(request, RouteRequest(hashes, len(prompt), f"s{index}"))
            ttft = None
            async for step in stream:
                if ttft is None and step.token_ids:
                    ttft = loop.time() - t0
            cached = stream.cached_tokens or 0
            result.records.append(
                Record(
                    stream.decision.worker,
                    len(prompt),
                    cached,
                    oracle_cached,
                    ttft or 0.0,
                    len(prompt) - cached,
                )
            )
            prompt = [*prompt, *stream.output_token_ids]
            oracle.add(block_hashes(prompt, BS))
            await asyncio.sleep(rng.uniform(*trace.pause_s))
            prompt += rng.choices(range(50_000), k=rng.randint(*trace.tool_tokens))

    wall = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(trace.sessions)))
    result.wall_seconds = time.perf_counter() - wall
    result.sim_seconds = loop.time()
    for t in taps:
        t.cancel()
    await backend.aclose()
    for e in engines.values():
        await e.stop()
    return result


# -- router costs (real clock) ---------------------------------------------------------------------


def decision_latency(
    n_blocks: int = 100_000, workers: int = 8, samples: int = 3000, dp_ranks: int = 1
) -> tuple[float, float, int]:
    """p50, p99 seconds of `RouterCore.decide` for 20K-token prompts; and the index size. With
    `dp_ranks` > 1 every worker has that many attention-DP ranks, each indexed and placed apart."""
    rng = random.Random(3)
    core = RouterCore(RouterConfig.model_validate({"block_size": BS}))
    ranks: list[int | None] = list(range(dp_ranks)) if dp_ranks > 1 else [None]
    for w in range(workers):
        for r in ranks:
            core.add_worker(f"w{w}", r)
    targets = [target(f"w{w}", r) for w in range(workers) for r in ranks]
    sessions: list[list[int]] = []
    system = block_hashes(rng.choices(range(50_000), k=4096), BS)
    while core.index.stats().blocks < n_blocks:
        tokens = rng.choices(range(50_000), k=20_000)
        hashes = [*system, *block_hashes(tokens, BS, parent=system[-1])]
        sessions.append(hashes)
        for t in rng.sample(targets, rng.choice((1, 1, 2))):
            core.index.stored(t, hashes)
    blocks = core.index.stats().blocks
    rounds = []
    for _ in range(3):  # best of 3 rounds: other tenants of this shared machine only add noise
        times = []
        for i in range(samples):
            hashes = sessions[i % len(sessions)]
            request = RouteRequest(hashes, len(hashes) * BS, f"s{i % 64}")
            t0 = time.perf_counter()
            decision = core.decide(request)
            times.append(time.perf_counter() - t0)
            core.placement.finish(decision.ticket)
        rounds.append((pct(times, 0.99), pct(times, 0.5)))
    p99, p50 = min(rounds)
    return p50, p99, blocks


def ingest_rate(messages: list[list[bytes]], repeat: int = 3) -> tuple[float, float, int, int]:
    """(events/s, block events/s, events, block events) decoding + applying `messages`."""
    best = float("inf")
    events = blocks = 0
    for _ in range(repeat):
        core = RouterCore(RouterConfig.model_validate({"block_size": BS}))
        sync = WorkerSync(core, "w")
        sync.on_snapshot(_empty_snapshot())
        t0 = time.perf_counter()
        for frames in messages:
            first, batch = decode_message(frames)
            sync.on_message(first, batch)
        best = min(best, time.perf_counter() - t0)
        events, blocks = sync.counters.events, sync.counters.blocks
    return events / best, blocks / best, events, blocks


def _empty_snapshot() -> Any:
    from agentserve.worker.engine import KvSnapshot

    return KvSnapshot(0, BS, ())


def renumbered(messages: list[list[bytes]]) -> list[list[bytes]]:
    """The trace's messages (from several engines) as one worker's gap-free stream."""
    out: list[list[bytes]] = []
    seq = 1
    for frames in messages:
        _, batch = decode_message(frames)
        if not batch:
            continue
        fixed: list[KvEvent] = []
        for e in batch:
            fixed.append(type(e)(seq, *[getattr(e, f) for f in e.__dataclass_fields__ if f != "seq"]))  # type: ignore[arg-type]
            seq += 1
        out.append(encode_batch(fixed))
    return out


def wire_cost(samples: int = 2000) -> dict[str, tuple[float, int]]:
    """µs per route call (request encode + decode, reply encode + decode) and request bytes."""
    rng = random.Random(5)
    hashes = block_hashes(rng.choices(range(50_000), k=20_000), BS)
    request = RouteRequest(hashes, 20_000, "session-1", 0, None)
    from agentserve.router.placement import Decision

    decision = Decision("w3", 600, 625, 1234.0, "kv", 99)
    out: dict[str, tuple[float, int]] = {}
    for encoding in ("json", "msgpack"):
        enc: Literal["json", "msgpack"] = encoding  # type: ignore[assignment]
        best = float("inf")
        size = 0
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(samples):
                body = encode_route(request, frozenset(), enc)
                call = decode_route(body, enc)
                reply = encode_decision(decision, "http://10.0.0.3:8200", enc)
                decode_decision(reply, enc)
            best = min(best, (time.perf_counter() - t0) / samples)
            size = len(body)
            assert len(call.request.block_hashes) == len(hashes)
        out[encoding] = (best * 1e6, size)
    return out


async def route_round_trip(samples: int = 1000) -> dict[str, tuple[float, float]]:
    """p50/p99 µs of `RouterClient.route` + `finish` against the router service on loopback."""
    import uvicorn

    from agentserve.router.local import LocalRouter
    from agentserve.router.remote import RouterClient
    from agentserve.router.service import create_app

    router = LocalRouter(RouterConfig.model_validate({"block_size": BS}))
    rng = random.Random(9)
    sessions = [block_hashes(rng.choices(range(50_000), k=20_000), BS) for _ in range(16)]
    for w in range(8):
        router.core.add_worker(f"w{w}")
        for s in sessions[w::8]:
            router.core.index.stored(f"w{w}", s)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(router, manage_router=False),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="on",
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    out: dict[str, tuple[float, float]] = {}
    try:
        for encoding in ("json", "msgpack"):
            async with RouterClient(url, encoding=encoding) as client:  # type: ignore[arg-type]
                times = []
                for i in range(samples + 100):
                    hashes = sessions[i % len(sessions)]
                    t0 = time.perf_counter()
                    decision = await client.route(RouteRequest(hashes, len(hashes) * BS))
                    await client.finish(decision)
                    if i >= 100:  # warm-up excluded
                        times.append(time.perf_counter() - t0)
                out[encoding] = (pct(times, 0.5) * 1e6, pct(times, 0.99) * 1e6)
    finally:
        server.should_exit = True
        await task
    return out


# -- report ----------------------------------------------------------------------------------------


def plot(results: list[RunResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r.workers for r in results})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.6 * len(sizes), 3.4), sharey=True)
    if len(sizes) == 1:
        axes = [axes]
    for ax, n in zip(axes, sizes, strict=True):
        for r in (r for r in results if r.workers == n):
            ttfts = r.ttfts()
            qs = [i / 200 for i in range(201)]  # 201 quantiles draw the same curve in a small file
            ax.plot([pct(ttfts, q) for q in qs], qs, label=f"{r.policy} (p50 {pct(ttfts, 0.5) * 1e3:.0f} ms)")
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s, simulated B200 time)")
        ax.set_title(f"{n} sim workers")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("fraction of turns")
    fig.suptitle("TTFT per routing policy: 64 agent sessions x 20 turns", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small trace, fewer samples")
    parser.add_argument("--kv-blocks", type=int, default=12_288, help="KV cache per worker, in blocks")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--workers", nargs="+", type=int, default=None, help="worker counts (default 4 8)")
    parser.add_argument("--load-weight", type=float, default=None, help="override RouterConfig.load_weight")
    parser.add_argument(
        "--overlap-weight", type=float, default=None, help="override RouterConfig.overlap_weight"
    )
    parser.add_argument("--plot", type=Path, default=ROOT / "bench" / "results" / "routing.png")
    parser.add_argument(
        "--profiles",
        default=",".join(shipped_profiles()),
        help="engine profiles whose timing the sim follows, comma-separated (default: every shipped one)",
    )
    args = parser.parse_args()
    trace = Trace(sessions=16, turns=6) if args.quick else Trace()
    sizes = tuple(args.workers or ((4,) if args.quick else (4, 8)))
    weights = {
        k: v
        for k, v in (("load_weight", args.load_weight), ("overlap_weight", args.overlap_weight))
        if v is not None
    }
    print(
        f"trace: {trace.sessions} sessions x {trace.turns} turns, "
        f"shared prefix {trace.system_tokens} tokens, "
        f"tool results {trace.tool_tokens[0]}-{trace.tool_tokens[1]}, "
        f"outputs {trace.output_tokens[0]}-{trace.output_tokens[1]} tokens; "
        f"KV cache {args.kv_blocks} blocks x {BS} tokens per worker"
    )
    defaults = RouterConfig.model_validate({**weights})
    print(f"kv cost weights: overlap {defaults.overlap_weight:g}, load {defaults.load_weight:g}")
    first_results: list[RunResult] = []
    for k, name in enumerate(args.profiles.split(",")):
        profile = load_profile(name)
        print(f"\nengine profile: {profile.label}")
        results = trace_table(trace, sizes, args, weights, profile.timing)
        plot_path = args.plot if k == 0 else args.plot.with_name(f"{args.plot.stem}-{name}{args.plot.suffix}")
        plot(results, plot_path)
        print(f"plot: {plot_path.relative_to(ROOT) if plot_path.is_relative_to(ROOT) else plot_path}")
        first_results = first_results or results
    print()

    for dp_ranks in (1, 8):
        d50, d99, blocks = decision_latency(samples=500 if args.quick else 3000, dp_ranks=dp_ranks)
        ranked = f" x {dp_ranks} attention-DP ranks" if dp_ranks > 1 else ""
        print(
            f"decision latency (RouterCore.decide, 24K-token prompts = 753 blocks, {blocks:,} indexed "
            f"blocks, 8 workers{ranked}, best of 3 rounds): p50 {d50 * 1e6:.0f} us, p99 {d99 * 1e6:.0f} us "
            f"(target p99 <= 1 ms: {'ok' if d99 <= 1e-3 else 'MISSED'})"
        )
    messages = renumbered(first_results[0].events)
    ev_s, bl_s, events, blocks_n = ingest_rate(messages)
    print(
        f"ingest (decode + apply {len(messages):,} messages the trace's engines published: "
        f"{events:,} events, {blocks_n:,} block events): {ev_s:,.0f} events/s, {bl_s:,.0f} block events/s "
        f"(target >= 500k block events/s: {'ok' if bl_s >= 5e5 else 'MISSED'})"
    )
    cost = wire_cost(samples=300 if args.quick else 2000)
    trip = asyncio.run(route_round_trip(samples=200 if args.quick else 1000))
    print("route API, 20K-token prompt (625 hashes):")
    for encoding in ("json", "msgpack"):
        us, size = cost[encoding]
        p50_rt, p99_rt = trip[encoding]
        print(
            f"  {encoding:<8} request {size:>6,} B, encode+decode both ways {us:>6.0f} us; "
            f"loopback round trip (route + finish) p50 {p50_rt:.0f} us, p99 {p99_rt:.0f} us"
        )
    return 0


def trace_table(
    trace: Trace,
    sizes: tuple[int, ...],
    args: argparse.Namespace,
    weights: dict[str, float],
    timing: TimingModel,
) -> list[RunResult]:
    """Part 1 under one timing model: the policies' table and the acceptance lines."""
    results: list[RunResult] = []
    header = (
        f"{'workers':>7} {'policy':<13} {'hit rate':>8} {'oracle':>7} {'% oracle':>8} {'TTFT p50':>9} "
        f"{'TTFT p99':>9} {'req spread':>10} {'prefill spread':>14} {'sim s':>6} {'wall s':>6}"
    )
    print(header)
    print("-" * len(header))
    for n in sizes:
        for policy in args.policies:
            first = n == sizes[0] and policy == args.policies[0]
            run = run_trace(
                trace, policy, n, args.kv_blocks, record_events=first, weights=weights, timing=timing
            )
            r = simulate(run)
            results.append(r)
            ttfts = r.ttfts()
            p50, p99 = pct(ttfts, 0.5) * 1e3, pct(ttfts, 0.99) * 1e3
            print(
                f"{n:>7} {policy:<13} {r.hit_rate():>8.1%} {r.oracle_rate():>7.1%} "
                f"{r.hit_rate() / r.oracle_rate():>8.1%} {p50:>7.0f}ms {p99:>7.0f}ms "
                f"{r.spread(lambda rec: 1):>10.2f} {r.spread(lambda rec: rec.computed):>14.2f} "
                f"{r.sim_seconds:>6.0f} {r.wall_seconds:>6.1f}",
                flush=True,
            )
    for n in sizes:
        by = {r.policy: r for r in results if r.workers == n}
        if "kv" not in by or "round-robin" not in by:
            continue
        kv, rr = by["kv"], by["round-robin"]
        ratio = pct(rr.ttfts(), 0.5) / pct(kv.ttfts(), 0.5)
        share = kv.hit_rate() / kv.oracle_rate()
        print(
            f"{n} workers: kv hit rate {share:.1%} of oracle "
            f"(target >= 90%: {'ok' if share >= 0.9 else 'MISSED'}); "
            f"TTFT p50 round-robin/kv = {ratio:.1f}x (target >= 2x: {'ok' if ratio >= 2 else 'MISSED'})"
        )
    return results


if __name__ == "__main__":
    raise SystemExit(main())
