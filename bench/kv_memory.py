"""Agent-aware KV memory on an agent trace, on the sim's clock (issue 13).

64 agent sessions × 20 turns share a 20K-token system+tools prefix; each turn extends the previous
prompt by the model's output and a tool result, after a tool-call gap drawn from a log-normal
(median ~8 s, seconds to minutes) plus a few long pauses (5-20 min). Sessions stay on their worker
(as the KV router keeps them). Each worker's GPU KV cache holds about half the live working set.

Four caches, same trace, same scheduler and timing model (`agentserve.worker.timing`), in one run:

- `lru`: today's engines: plain LRU over GPU blocks;
- `retention`: the frontend's agent retention policy (`agentserve.frontend.retention`) mapped onto
  the pool's priority classes (shared prefix pinned, sessions kept for their tool gaps);
- `retention+host`: the same plus a host tier (`--host-factor` × the GPU blocks) that evicted
  blocks spill to and come back from at PCIe cost;
- `oracle`: an infinite GPU cache (every prefix reusable: the hit-rate ceiling).

The loop is a discrete-event simulation: each worker's clock advances by the timing model's step
time, and idle time jumps to the next arrival, so nothing waits for real. Prints prefill tokens
recomputed, prefix hit rate, TTFT p50/p99 of returning turns (turn ≥ 2), and the acceptance ratios;
writes `bench/results/kv_memory.png`.

Runs once per engine profile (`--profiles`, default every shipped one: the B200 estimate and the
H200 measurement) in the same run; each block of results names its profile.

    PYTHONPATH=src python bench/kv_memory.py [--quick] [--profiles NAME,...]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentserve.frontend.retention import AGENT, RetentionInputs, RetentionPolicy, decide_retention
from agentserve.prompt.hashing import block_hashes
from agentserve.worker.kvpool import KvPool
from agentserve.worker.profiles import Profile, load_profile, shipped_profiles
from agentserve.worker.scheduler import Scheduler, SchedulerConfig, SimSequence
from agentserve.worker.timing import TimingModel

BLOCK = 32
VOCAB = 150_000


@dataclass(frozen=True, slots=True)
class Trace:
    sessions: int
    turns: int
    prefix_tokens: int
    first_tokens: int  # the first user message after the shared prefix
    output_tokens: int  # model output per turn
    tool_tokens: int  # tool result per turn (mean)
    workers: int
    seed: int
    chat_rate: float = 0.0  # one-off chat requests (no tools, no reuse) per second per worker
    chat_tokens: int = 4000


@dataclass(slots=True)
class Session:
    sid: int
    worker: int
    tokens: list[int]
    hashes: list[int]
    turn: int = 0
    last_end: float | None = None
    rng: random.Random = field(default_factory=random.Random)


@dataclass(slots=True)
class TurnResult:
    session: int
    turn: int
    prompt: int
    cached: int
    host: int
    ttft: float


def gap_seconds(rng: random.Random) -> float:
    """A tool call's duration: log-normal, median 8 s, clipped to 1-300 s; 4 % long pauses."""
    if rng.random() < 0.04:
        return rng.uniform(300.0, 1200.0)
    return min(300.0, max(1.0, rng.lognormvariate(math.log(8.0), 1.2)))


def run(
    trace: Trace, gpu_blocks: int, host_blocks: int, policy: RetentionPolicy | None, timing: TimingModel
) -> tuple[list[TurnResult], int]:
    """The turns' results and the peak live working set of a worker, in blocks (the shared prefix
    plus the context of every session that has not finished its last turn)."""
    rng = random.Random(trace.seed)
    prefix = [rng.randrange(VOCAB) for _ in range(trace.prefix_tokens)]
    prefix_hashes = block_hashes(prefix, BLOCK)
    config = SchedulerConfig(max_batch_size=256, max_num_tokens=8192)
    pools = [KvPool(gpu_blocks, BLOCK, host_blocks) for _ in range(trace.workers)]
    scheds = [Scheduler(p, config) for p in pools]
    clocks = [0.0] * trace.workers
    sessions: list[Session] = []
    arrivals: list[tuple[float, int]] = []
    for sid in range(trace.sessions):
        srng = random.Random(trace.seed * 1_000_003 + sid)
        first = [srng.randrange(VOCAB) for _ in range(trace.first_tokens)]
        tokens = prefix + first
        s = Session(sid, sid % trace.workers, tokens, list(prefix_hashes), rng=srng)
        sessions.append(s)
        heapq.heappush(arrivals, (srng.uniform(0.0, 60.0), sid))
    # Background chats: arrival times per worker (a Poisson process), ids below zero in `arrivals`.
    crng = random.Random(trace.seed + 7)
    chats: list[int] = []  # chat id -> worker
    for w in range(trace.workers):
        t = 0.0
        while trace.chat_rate > 0 and t < 3600.0:
            t += crng.expovariate(trace.chat_rate)
            chats.append(w)
            heapq.heappush(arrivals, (t, -len(chats)))
    active = trace.sessions
    pending: dict[str, tuple[Session | None, float]] = {}
    first_token: dict[str, float] = {}
    results: list[TurnResult] = []
    live = [len(prefix_hashes)] * trace.workers
    peak = max(live)

    def submit(s: Session, at: float) -> None:
        s.turn += 1
        rid = f"s{s.sid}-t{s.turn}"
        nonlocal peak
        full = len(s.tokens) // BLOCK
        tail = s.hashes[-1] if s.hashes else None
        live[s.worker] += full - len(s.hashes)
        peak = max(peak, live[s.worker])
        s.hashes += block_hashes(s.tokens[len(s.hashes) * BLOCK : full * BLOCK], BLOCK, 0, tail)
        output = [s.rng.randrange(VOCAB) for _ in range(trace.output_tokens)]
        seq = SimSequence(rid, list(s.tokens), len(s.tokens), output, "tool_calls")
        seq.hashes = list(s.hashes)
        if policy is not None:
            idle = None if s.last_end is None else at - s.last_end
            inputs = RetentionInputs(len(s.tokens), trace.prefix_tokens, True, s.turn > 1, None, idle)
            seq.retention = decide_retention(policy, inputs)
        scheds[s.worker].add(seq)
        pending[rid] = (s, at)

    def submit_chat(cid: int, w: int, at: float) -> None:
        tokens = [crng.randrange(VOCAB) for _ in range(trace.chat_tokens)]
        seq = SimSequence(f"c{cid}", tokens, len(tokens), [1] * trace.output_tokens, "stop")
        if policy is not None:
            seq.retention = decide_retention(policy, RetentionInputs(len(tokens)))
        if not scheds[w].has_work:
            clocks[w] = max(clocks[w], at)
        scheds[w].add(seq)
        pending[seq.request_id] = (None, at)

    while True:
        busy = [w for w in range(trace.workers) if scheds[w].has_work]
        next_step = min(busy, key=lambda w: clocks[w]) if busy else None
        if arrivals and (next_step is None or arrivals[0][0] <= clocks[next_step]):
            at, sid = heapq.heappop(arrivals)
            if sid < 0:
                if active:
                    submit_chat(-sid, chats[-sid - 1], at)
                continue
            s = sessions[sid]
            if not scheds[s.worker].has_work:
                clocks[s.worker] = max(clocks[s.worker], at)
            submit(s, at)
            continue
        if next_step is None:
            break
        w = next_step
        pools[w].now = clocks[w]
        outcome = scheds[w].step()
        if outcome.work.empty and not scheds[w].running:
            raise RuntimeError(
                "a prompt larger than the GPU KV cache cannot be admitted: raise --gpu-fraction"
            )
        clocks[w] += timing.step_seconds(outcome.work)
        now = clocks[w]
        for seq in outcome.emitted:
            first_token.setdefault(seq.request_id, now)
        for seq, _reason in outcome.finished:
            owner, at = pending.pop(seq.request_id)
            if owner is None:  # a background chat
                first_token.pop(seq.request_id, None)
                continue
            s = owner
            results.append(
                TurnResult(
                    s.sid,
                    s.turn,
                    seq.prompt_len,
                    seq.cached_tokens or 0,
                    seq.host_tokens,
                    first_token.pop(seq.request_id) - at,
                )
            )
            s.last_end = now
            if s.turn < trace.turns:
                tool = [
                    s.rng.randrange(VOCAB) for _ in range(max(1, int(s.rng.gauss(trace.tool_tokens, 60))))
                ]
                s.tokens = s.tokens + list(seq.output) + tool
                heapq.heappush(arrivals, (now + gap_seconds(s.rng), s.sid))
            else:
                live[s.worker] -= len(s.hashes) - len(prefix_hashes)
                active -= 1
    return results, peak


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summarise(results: list[TurnResult], prefix_tokens: int) -> dict[str, float]:
    returning = [r for r in results if r.turn >= 2]
    prompt = sum(r.prompt for r in returning)
    cached = sum(r.cached for r in returning)
    # The session's own part (after the shared prefix, which every variant keeps hot).
    own = sum(r.prompt - prefix_tokens for r in returning)
    own_cached = sum(max(0, r.cached - prefix_tokens) for r in returning)
    return {
        "session_hit": own_cached / own if own else 0.0,
        "turns": float(len(results)),
        "recomputed": float(sum(r.prompt - r.cached for r in results)),
        "hit_rate": cached / prompt if prompt else 0.0,
        "host_share": sum(r.host for r in returning) / cached if cached else 0.0,
        "ttft_p50": pct([r.ttft for r in returning], 0.5),
        "ttft_p99": pct([r.ttft for r in returning], 0.99),
    }


Outcome = tuple[dict[str, list[TurnResult]], dict[str, dict[str, float]]]


def plot(outcomes: dict[str, Outcome], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(outcomes), 2, figsize=(10, 3.6 * len(outcomes)), dpi=100, squeeze=False)
    for (ax1, ax2), (label, (results, summary)) in zip(axes, outcomes.items(), strict=True):
        _panels(ax1, ax2, label, results, summary)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(f"plot: {path}")


def _panels(
    ax1: Any, ax2: Any, label: str, results: dict[str, list[TurnResult]], summary: dict[str, dict[str, float]]
) -> None:
    names = list(summary)
    ax1.bar(names, [summary[n]["hit_rate"] * 100 for n in names], color="#4c72b0")
    ax1.set_ylabel("prefix hit rate, returning turns (%)")
    ax1.set_ylim(0, 100)
    for name in names:
        ttfts = sorted(r.ttft for r in results[name] if r.turn >= 2)
        ax2.plot(ttfts, [i / len(ttfts) for i in range(len(ttfts))], label=name)
    ax2.set_xscale("log")
    ax2.set_xlabel("TTFT of returning turns (s, sim clock)")
    ax2.set_ylabel("CDF")
    ax2.set_title(label, fontsize=9)
    ax2.legend()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 sessions x 8 turns (smoke run)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gpu-fraction", type=float, default=0.5, help="GPU KV / live working set")
    ap.add_argument("--host-factor", type=float, default=2.0, help="host blocks / GPU blocks")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--chat-rate",
        type=float,
        default=0.0,
        help="background one-off chats (4K tokens) per second per worker",
    )
    ap.add_argument(
        "--profiles",
        default=",".join(shipped_profiles()),
        help="engine profiles whose timing the sim follows, comma-separated (default: every shipped one)",
    )
    args = ap.parse_args()
    outcomes = {}
    for name in args.profiles.split(","):
        profile = load_profile(name)
        outcomes[profile.label] = run_profile(profile, args)
    plot(outcomes, Path(__file__).parent / "results" / "kv_memory.png")


def run_profile(profile: Profile, args: argparse.Namespace) -> Outcome:
    sessions, turns = (16, 8) if args.quick else (64, 20)
    trace = Trace(sessions, turns, 20_000, 2_000, 120, 400, args.workers, args.seed, args.chat_rate)
    timing = profile.timing
    print(f"\nengine profile: {profile.label}")
    # The oracle runs first: its trace (no eviction) measures the live working set to size the rest.
    t0 = time.perf_counter()
    oracle_results, live = run(trace, 10**9, 0, None, timing)
    oracle_s = time.perf_counter() - t0
    # Never below what the longest prompt needs (a session's last turn) with room for a second one.
    longest = (
        trace.prefix_tokens + trace.first_tokens + turns * (trace.output_tokens + trace.tool_tokens + 180)
    ) // BLOCK
    gpu = max(int(live * args.gpu_fraction), 2 * longest)
    host = int(gpu * args.host_factor)
    print(
        f"{sessions} sessions x {turns} turns, {args.workers} workers, chats {args.chat_rate}/s/worker; "
        f"peak live working set {live} blocks/worker; "
        f"GPU {gpu} blocks/worker ({gpu / live:.0%}), host {host}"
    )
    variants: dict[str, tuple[int, int, RetentionPolicy | None]] = {
        "lru": (gpu, 0, None),
        "retention": (gpu, 0, AGENT),
        "retention+host": (gpu, host, AGENT),
    }
    results: dict[str, list[TurnResult]] = {}
    summary: dict[str, dict[str, float]] = {}
    for name, (g, h, policy) in variants.items():
        t0 = time.perf_counter()
        results[name] = run(trace, g, h, policy, timing)[0]
        summary[name] = summarise(results[name], trace.prefix_tokens)
        # Returning turns that lost some of their prefix (cached less than the oracle did).
        best_case = {(r.session, r.turn): r.cached for r in oracle_results}
        back = [r for r in results[name] if r.turn >= 2]
        summary[name]["lost_turns"] = sum(r.cached < best_case[(r.session, r.turn)] for r in back) / len(back)
        s = summary[name]
        print(
            f"{name:15s} recomputed {s['recomputed'] / 1e6:7.2f}M tok  hit {s['hit_rate']:6.1%} "
            f"session part {s['session_hit']:6.1%}  "
            f"(host {s['host_share']:5.1%})  TTFT p50 {s['ttft_p50'] * 1e3:7.1f} ms  "
            f"p99 {s['ttft_p99'] * 1e3:8.1f} ms  turns that lost prefix {s['lost_turns']:5.1%}  "
            f"[{time.perf_counter() - t0:.1f} s]"
        )
    results["oracle"] = oracle_results
    summary["oracle"] = o = summarise(oracle_results, trace.prefix_tokens)
    print(
        f"{'oracle':15s} recomputed {o['recomputed'] / 1e6:7.2f}M tok  hit {o['hit_rate']:6.1%} session part "
        f"{o['session_hit']:6.1%}  (host {o['host_share']:5.1%})  TTFT p50 {o['ttft_p50'] * 1e3:7.1f} ms  "
        f"p99 {o['ttft_p99'] * 1e3:8.1f} ms   [{oracle_s:.1f} s]"
    )
    oracle, lru, best = summary["oracle"], summary["lru"], summary["retention+host"]
    print(
        f"hit rate vs oracle: lru {lru['hit_rate'] / oracle['hit_rate']:.1%}, "
        f"retention {summary['retention']['hit_rate'] / oracle['hit_rate']:.1%}, "
        f"retention+host {best['hit_rate'] / oracle['hit_rate']:.1%} (target >= 90%); session part: "
        f"lru {lru['session_hit'] / oracle['session_hit']:.1%}, "
        f"retention+host {best['session_hit'] / oracle['session_hit']:.1%}"
    )
    print(
        f"returning-turn TTFT p50 lru / retention+host: {lru['ttft_p50'] / best['ttft_p50']:.2f}x "
        "(target >= 2x); "
        f"p99 {lru['ttft_p99'] / best['ttft_p99']:.2f}x"
    )
    return results, summary


if __name__ == "__main__":
    main()
