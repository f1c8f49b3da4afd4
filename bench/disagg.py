"""Disaggregated prefill on an agent trace at equal GPU count (a script, not a test).

    PYTHONPATH=src python bench/disagg.py            # full run (several minutes)
    PYTHONPATH=src python bench/disagg.py --quick    # smoke run (~1 min)

**Trace**: closed-loop agent sessions (a new session takes a finished one's slot). A session opens
cold: the shared system prefix plus its own 50–150K-token context (a repository, a long document),
prefilled from scratch. Then `turns − 1` warm turns: the previous prompt + the model's output + a tool
result of a few hundred tokens, after a tool pause. With 8 turns one request in 8 (12.5 %) is cold.

**Deployments**, on the same number of simulated GPUs (one sim worker = one GPU):

- `aggregated`: every worker prefills and decodes (today's behaviour);
- `always`: `--prefill-gpus` prefill workers, the rest decode; every prompt is prefilled remotely
  (policy threshold, threshold 0) and its KV shipped;
- `conditional`: the same pools; the router prefills remotely only the prompts whose uncached span on
  the decode worker exceeds the threshold derived from the timing model, and only while that costs
  less than local prefill (policy cost, router/disagg.py).

All three run the real path of `agentserve up`: `EngineBackend` (router core with roles, dispatcher
with remote prefill, sim engines that hold and pull KV) on a simulated clock (the event loop's clock
jumps to the next timer, bench/routing.py), so the timing model alone decides every latency however
busy this machine is. KV transfer: `--kv-link` (default rdma: NDR 400 Gb/s) at 96 KiB per token.

Per deployment: TTFT p50/p99 (all turns, cold turns, warm turns), ITL p50/p99 (every output token after
the first), output throughput, and ratios against `aggregated` from the same run. Writes
`bench/results/disagg.png` (ITL and warm-turn TTFT distributions).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from agentserve.config import RouterConfig  # noqa: E402
from agentserve.frontend.backend import EngineBackend  # noqa: E402
from agentserve.prompt.hashing import block_hashes  # noqa: E402
from agentserve.router.core import Role  # noqa: E402
from agentserve.router.disagg import default_threshold  # noqa: E402
from agentserve.router.placement import RouteRequest  # noqa: E402
from agentserve.worker.engine import Engine, GenerateRequest, Hints, SamplingParams  # noqa: E402
from agentserve.worker.engines.sim import SimConfig, SimEngine  # noqa: E402
from agentserve.worker.profiles import DEFAULT_PROFILE, load_profile  # noqa: E402
from routing import pct, simulate  # noqa: E402

BS = 32
VOCAB = 256  # small token ids: Python caches them, so 100K-token prompts stay cheap to hold
DEPLOYMENTS = ("aggregated", "always", "conditional")


@dataclass(frozen=True)
class Trace:
    slots: int = 120  # concurrent sessions (about 64-80 of them decoding at any time)
    turns: int = 8  # the first cold, the rest warm
    system_tokens: int = 4096  # shared by every session
    cold_tokens: tuple[int, int] = (50_000, 150_000)  # each session's own context
    tool_tokens: tuple[int, int] = (100, 500)  # each tool result
    output_tokens: tuple[int, int] = (300, 700)  # each model turn (reasoning + a tool call)
    pause_s: tuple[float, float] = (5.0, 15.0)  # tool execution between turns
    start_spread_s: float = 120.0  # the first sessions start uniformly over this window
    duration_s: float = 600.0  # simulated seconds of traffic
    warmup_s: float = 150.0  # turns starting before this are not measured
    seed: int = 11


@dataclass
class Turn:
    cold: bool
    start: float
    ttft: float
    itls: list[float]
    tokens: int
    where: str  # local | remote | prefill-failed | transfer-failed | aggregated


@dataclass
class Result:
    deployment: str
    turns: list[Turn] = field(default_factory=list)
    sim_seconds: float = 0.0
    wall_seconds: float = 0.0
    threshold: int | None = None

    def measured(self, warmup: float) -> list[Turn]:
        return [t for t in self.turns if t.start >= warmup]


async def run(
    trace: Trace, deployment: str, gpus: int, prefill_gpus: int, args: argparse.Namespace
) -> Result:
    loop = asyncio.get_running_loop()
    timing = load_profile(args.profile).timing
    sim = SimConfig(num_blocks=args.kv_blocks, block_size=BS, speedup=1.0, timing=timing)
    roles: dict[str, Role] = {}
    engines: dict[str, Engine] = {}
    if deployment == "aggregated":
        engines = {f"w{i}": SimEngine(sim) for i in range(gpus)}
    else:
        engines = {f"p{i}": SimEngine(sim) for i in range(prefill_gpus)}
        engines |= {f"d{i}": SimEngine(sim) for i in range(gpus - prefill_gpus)}
        roles = {w: ("prefill" if w.startswith("p") else "decode") for w in engines}
    threshold = 0 if deployment == "always" else args.threshold
    config = RouterConfig.model_validate(
        {
            "block_size": BS,
            "profile": args.profile,
            "kv_link": args.kv_link,
            "prefill_threshold_tokens": threshold,
            "prefill_policy": "threshold" if deployment == "always" else "cost",
        }
    )
    backend = EngineBackend(engines, config, roles=roles)
    await backend.start()
    result = Result(deployment, threshold=backend.router.prefill_threshold if roles else None)
    rng0 = random.Random(trace.seed)
    system = rng0.choices(range(VOCAB), k=trace.system_tokens)
    next_id = iter(range(10**9))
    done_turns = 0

    async def one_turn(sid: int, turn: int, prompt: list[int], rng: random.Random) -> list[int]:
        nonlocal done_turns
        max_tokens = rng.randint(*trace.output_tokens)
        hints = Hints(turn=turn, last_user_message="go on", last_message="ok")  # no prompt decoding
        request = GenerateRequest(
            f"s{sid}-t{turn}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), hints=hints
        )
        t0 = loop.time()
        route = RouteRequest(block_hashes(prompt, BS), len(prompt), f"s{sid}", osl=max_tokens)
        stream = await backend.generate(request, route)
        ttft: float | None = None
        last = t0
        itls: list[float] = []
        async for step in stream:
            if not step.token_ids:
                continue
            now = loop.time()
            if ttft is None:
                ttft = now - t0
                itls += [0.0] * (len(step.token_ids) - 1)
            else:
                gap = (now - last) / len(step.token_ids)  # a merged step: its tokens share the gap
                itls += [gap] * len(step.token_ids)
            last = now
        where = stream.prefill.outcome if stream.prefill is not None else "aggregated"
        result.turns.append(Turn(turn == 1, t0, ttft or 0.0, itls, len(stream.output_token_ids), where))
        done_turns += 1
        return list(stream.output_token_ids)

    async def slot(index: int) -> None:
        rng = random.Random(trace.seed * 1000 + index)
        await asyncio.sleep(rng.uniform(0, trace.start_spread_s))
        while loop.time() < trace.duration_s:
            sid = next(next_id)
            prompt = [*system, *rng.choices(range(VOCAB), k=rng.randint(*trace.cold_tokens))]
            for turn in range(1, trace.turns + 1):
                if loop.time() >= trace.duration_s:
                    return
                output = await one_turn(sid, turn, prompt, rng)
                await asyncio.sleep(rng.uniform(*trace.pause_s))
                prompt = [*prompt, *output, *rng.choices(range(VOCAB), k=rng.randint(*trace.tool_tokens))]

    async def progress() -> None:
        while True:
            await asyncio.sleep(60.0)
            print(f"    {deployment}: sim {loop.time():5.0f} s, {done_turns} turns done", flush=True)

    wall = time.perf_counter()
    ticker = asyncio.create_task(progress())
    await asyncio.gather(*(slot(i) for i in range(trace.slots)))
    ticker.cancel()
    result.wall_seconds = time.perf_counter() - wall
    result.sim_seconds = loop.time()
    await backend.stop()
    return result


@dataclass(frozen=True)
class Summary:
    ttft50: float
    ttft99: float
    cold50: float
    warm50: float
    warm99: float
    itl50: float
    itl99: float
    throughput: float  # output tokens per simulated second (measured window)
    remote: float  # share of turns prefilled remotely


def summarise(r: Result, trace: Trace) -> Summary:
    turns = r.measured(trace.warmup_s)
    ttfts = [t.ttft for t in turns]
    cold = [t.ttft for t in turns if t.cold] or [math.nan]  # none measured: shown as nan
    warm = [t.ttft for t in turns if not t.cold] or [math.nan]
    itls = [g for t in turns for g in t.itls]
    window = max(1e-9, r.sim_seconds - trace.warmup_s)
    return Summary(
        pct(ttfts, 0.5),
        pct(ttfts, 0.99),
        pct(cold, 0.5),
        pct(warm, 0.5),
        pct(warm, 0.99),
        pct(itls, 0.5),
        pct(itls, 0.99),
        sum(t.tokens for t in turns) / window,
        sum(1 for t in turns if t.where == "remote") / max(1, len(turns)),
    )


def _s(seconds: float, width: int, digits: int) -> str:
    """Seconds for the table; a class with no measured turn shows a dash."""
    return f"{'-':>{width}} " if math.isnan(seconds) else f"{seconds:>{width}.{digits}f}s"


def plot(results: list[Result], trace: Trace, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    qs = [i / 400 for i in range(401)]
    for r in results:
        turns = r.measured(trace.warmup_s)
        itls = sorted(g for t in turns for g in t.itls)
        warm = sorted(t.ttft for t in turns if not t.cold)
        axes[0].plot([max(pct(itls, q), 1e-4) for q in qs], qs, label=r.deployment)
        axes[1].plot([max(pct(warm, q), 1e-4) for q in qs], qs, label=r.deployment)
    for ax, what in zip(axes, ("ITL (s)", "TTFT of warm turns (s)"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel(f"{what}, simulated time")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("fraction")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller fleet, shorter trace")
    parser.add_argument("--gpus", type=int, default=None, help="simulated GPUs per deployment (default 8)")
    parser.add_argument(
        "--prefill-gpus", type=int, default=None, help="of those, prefill workers (default half)"
    )
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="engine profile of the sim's timing")
    parser.add_argument("--kv-link", default="rdma", choices=("nvlink", "nvlink-b200", "rdma", "rdma-xdr"))
    parser.add_argument(
        "--threshold", type=int, default=None, help="conditional threshold (default: derived)"
    )
    # A replica's KV: 100K blocks = 3.2M tokens, so sessions of 50-150K tokens are not evicted under
    # any deployment (the comparison is about interference, not capacity).
    parser.add_argument("--kv-blocks", type=int, default=100_000, help="KV cache per worker, in blocks")
    parser.add_argument("--slots", type=int, default=None, help="concurrent sessions (default 120; quick 60)")
    parser.add_argument("--deployments", nargs="+", default=list(DEPLOYMENTS), choices=DEPLOYMENTS)
    parser.add_argument("--plot", type=Path, default=ROOT / "bench" / "results" / "disagg.png")
    args = parser.parse_args()
    if args.quick:
        trace = Trace(slots=60, duration_s=300.0, warmup_s=90.0, start_spread_s=60.0)
        gpus, prefill = args.gpus or 4, args.prefill_gpus or 2
    else:
        trace = Trace()
        gpus, prefill = args.gpus or 8, args.prefill_gpus or 4
    if args.slots is not None:
        trace = replace(trace, slots=args.slots)
    timing = load_profile(args.profile).timing
    derived = default_threshold(timing)
    print(
        f"trace: {trace.slots} concurrent agent sessions x {trace.turns} turns (1 cold of "
        f"{trace.cold_tokens[0] // 1000}-{trace.cold_tokens[1] // 1000}K tokens + {trace.system_tokens} "
        f"shared, then tool results {trace.tool_tokens[0]}-{trace.tool_tokens[1]} tokens), outputs "
        f"{trace.output_tokens[0]}-{trace.output_tokens[1]} tokens, "
        f"pauses {trace.pause_s[0]:g}-{trace.pause_s[1]:g} s; "
        f"{trace.duration_s:.0f} simulated s, first {trace.warmup_s:.0f} s not measured"
    )
    print(
        f"fleet: {gpus} GPUs (disaggregated: {prefill} prefill + {gpus - prefill} decode); "
        f"profile {args.profile}; KV link {args.kv_link}; derived threshold {derived} tokens"
    )
    results: list[Result] = []
    for deployment in args.deployments:
        print(f"  running {deployment} ...", flush=True)
        r = simulate(run(trace, deployment, gpus, prefill, args))
        print(f"  {deployment}: {len(r.turns)} turns in {r.wall_seconds:.0f} s wall", flush=True)
        results.append(r)
    summaries = {r.deployment: summarise(r, trace) for r in results}
    print()
    header = (
        f"{'deployment':<12} {'TTFT p50':>9} {'p99':>8} {'cold p50':>9} {'warm p50':>9} {'warm p99':>9} "
        f"{'ITL p50':>8} {'ITL p99':>8} {'tok/s':>7} {'remote':>7}"
    )
    print(header)
    for name, s in summaries.items():
        print(
            f"{name:<12} {s.ttft50:>8.3f}s {s.ttft99:>7.2f}s {_s(s.cold50, 8, 2)} {_s(s.warm50, 8, 3)} "
            f"{_s(s.warm99, 8, 2)} {s.itl50 * 1e3:>6.1f}ms {s.itl99 * 1e3:>6.0f}ms "
            f"{s.throughput:>7.0f} {s.remote:>6.0%}"
        )
    base = summaries.get("aggregated")
    if base is not None:
        print("\nagainst aggregated (same run; ITL/TTFT: aggregated ÷ deployment, >1 is better):")
        for name, s in summaries.items():
            if name == "aggregated":
                continue
            print(
                f"  {name:<12} ITL p99 {base.itl99 / s.itl99:5.2f}x  ITL p50 {base.itl50 / s.itl50:5.2f}x  "
                f"TTFT p50 {base.ttft50 / s.ttft50:5.2f}x  warm TTFT p50 {base.warm50 / s.warm50:5.2f}x  "
                f"throughput {s.throughput / base.throughput:5.2f}x"
            )
    if "always" in summaries and "conditional" in summaries:
        a, c = summaries["always"], summaries["conditional"]
        print(
            f"\nconditional vs always: warm-turn TTFT p50 {a.warm50 / c.warm50:.2f}x, "
            f"p99 {a.warm99 / c.warm99:.2f}x better (always ÷ conditional)"
        )
    title = (
        f"{trace.slots} agent sessions, {gpus} GPUs ({prefill}P+{gpus - prefill}D when split), "
        f"{args.profile}, KV over {args.kv_link}"
    )
    plot(results, trace, args.plot, title)
    shown = args.plot.relative_to(ROOT) if args.plot.is_relative_to(ROOT) else args.plot
    print(f"plot: {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
