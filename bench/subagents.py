"""Subagent trees under KV pressure, on the sim's clock (issue 29).

Agent sessions whose turns sometimes end in a burst of 1-4 parallel subagents (one of three types,
each with its own system prompt and tools, shared by siblings of that type); every child runs 2-4
turns with short tool gaps, then answers; the parent resumes once all its children answered, with
their results appended. One worker (as a new user tries it: `agentserve up`) whose GPU KV cache holds
a fraction of the live working set (parents + children + prefixes).

Three caches, same trace, same scheduler, pool and timing model (`agentserve.worker`), in one run:

- `lru`: plain LRU over GPU blocks (engines without retention);
- `retention`: today's agent retention (`frontend.retention`, `tree_aware=False`): every agent
  session, parent or child, in the session class for its tool gap; each type's prefix pinned like
  the deployment's shared prefix (as the frontend's tracker learns it);
- `tree`: tree-aware retention (`tree_aware=True`, the default, docs/subagents.md): a parent whose
  turn spawned children is held above every session in a tool gap until it resumes, an answered
  child's own blocks drop to the lowest class, a type's prefix is kept while siblings run. Hold and
  release are one-token requests over cached blocks, as the frontend sends them;
  their prefill counts in "recomputed".

Placement plays no part with one worker. With `--workers N` a parent stays on its worker (as the KV
router keeps a session) and a child's first turn is placed by the router's own `Placement` (the
`kv` policy over each pool's cached prefix and the in-flight load); `tree` adds the parent's id to
the child's route, so the router also weighs the room each worker has without evicting retained KV
(docs/subagents.md, Placement).

The loop is a discrete-event simulation: each worker's clock advances by the timing model's step
time and idle time jumps to the next arrival, so nothing waits for real and no number depends on
the machine. Prints the parent-resume prefix hit rate, TTFT p50/p99 of parent resumes and of
children's turns, prefill tokens recomputed, and the ratios against today's retention (measured in
this run); writes `bench/results/subagents.png` (another profile: `subagents-<profile>.png`) when
matplotlib is importable.

    PYTHONPATH=src python bench/subagents.py [--quick] [--gpu-fraction F] [--profile NAME]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentserve.config import RouterConfig
from agentserve.frontend.retention import (
    RetentionInputs,
    RetentionPolicy,
    child_release,
    decide_retention,
    parent_hold,
)
from agentserve.prompt.hashing import block_hashes
from agentserve.router.placement import Placement, RouteRequest
from agentserve.worker.engine import Retention
from agentserve.worker.kvpool import KvPool
from agentserve.worker.profiles import load_profile, shipped_profiles
from agentserve.worker.scheduler import Scheduler, SchedulerConfig, SimSequence
from agentserve.worker.timing import TimingModel

BLOCK = 32
VOCAB = 150_000
TODAY = RetentionPolicy(tree_aware=False)
TREE = RetentionPolicy()


@dataclass(frozen=True, slots=True)
class Trace:
    parents: int = 24
    parent_turns: int = 16
    main_prefix: int = 3_000  # the harness's system prompt + tools, shared by every parent
    first_tokens: int = 900  # the parent's first user message (with its context files)
    output_tokens: int = 150  # model output per turn
    tool_tokens: int = 600  # a tool result (mean)
    spawn_share: float = 0.4  # parent turns that end in a burst of subagents
    type_prefixes: tuple[int, ...] = (2_400, 1_800, 3_000)  # Explore, general-purpose, Plan
    child_task: tuple[int, int] = (150, 400)  # the spawn call's prompt
    child_turns: tuple[int, int] = (2, 4)
    child_answer: int = 400  # a child's final answer, handed back to the parent
    workers: int = 1
    seed: int = 1


@dataclass(slots=True)
class Conv:
    """One conversation: a parent session or a child."""

    cid: int
    kind: str  # "parent" | "child"
    prefix_tokens: int  # its shared prefix (the main prompt, or its type's)
    tokens: list[int]
    turns: int
    rng: random.Random
    worker: int = 0
    parent: int | None = None
    hashes: list[int] = field(default_factory=list)
    turn: int = 0
    waiting_on: int = 0  # children not yet answered (a parent in a subagent gap)
    results: list[int] = field(default_factory=list)  # answers gathered for the parent's resume
    resuming: bool = False  # the next turn is a resume after children answered
    last_end: float | None = None
    done: bool = False


@dataclass(frozen=True, slots=True)
class Turn:
    kind: str  # "parent" | "resume" | "child"
    cid: int
    turn: int
    prompt: int
    cached: int
    ttft: float


def gap_seconds(rng: random.Random, median: float, longest: float) -> float:
    return min(longest, max(0.2, rng.lognormvariate(math.log(median), 1.0)))


def run(
    trace: Trace,
    gpu_blocks: int,
    policy: RetentionPolicy | None,
    timing: TimingModel,
    *,
    tree_placement: bool = True,
) -> tuple[list[Turn], int]:
    """Every turn's result and the peak live working set (blocks: prefixes plus the context of every
    conversation that has not finished)."""
    rng = random.Random(trace.seed)
    main = [rng.randrange(VOCAB) for _ in range(trace.main_prefix)]
    types = [[rng.randrange(VOCAB) for _ in range(n)] for n in trace.type_prefixes]
    config = SchedulerConfig(max_batch_size=256, max_num_tokens=8192)
    pools = [KvPool(gpu_blocks, BLOCK) for _ in range(trace.workers)]
    scheds = [Scheduler(p, config) for p in pools]
    clocks = [0.0] * trace.workers
    convs: list[Conv] = []
    arrivals: list[tuple[float, int, int]] = []  # (time, order, conversation)
    order = 0
    live_own = 0  # blocks of unfinished conversations beyond their shared prefix
    prefix_blocks = (len(main) + sum(len(t) for t in types)) // BLOCK
    peak = prefix_blocks

    def arrive(c: Conv, at: float) -> None:
        nonlocal order
        order += 1
        heapq.heappush(arrivals, (at, order, c.cid))

    for pid in range(trace.parents):
        prng = random.Random(trace.seed * 1_000_003 + pid)
        first = [prng.randrange(VOCAB) for _ in range(trace.first_tokens)]
        c = Conv(pid, "parent", len(main), main + first, trace.parent_turns, prng, worker=pid % trace.workers)
        convs.append(c)
        arrive(c, prng.uniform(0.0, 60.0))

    pending: dict[str, tuple[Conv, float, str]] = {}
    updates = 0
    tree_aware = policy is not None and policy.tree_aware
    first_token: dict[str, float] = {}
    results: list[Turn] = []

    # The router's placement, on the sim's clock; a ticket per request counts its load until it ends.
    sim_now = [0.0]
    placement = Placement(
        RouterConfig(block_size=BLOCK), rng=random.Random(trace.seed), clock=lambda: sim_now[0]
    )
    tickets: dict[str, int] = {}
    names = [str(w) for w in range(trace.workers)]

    def place_child(c: Conv, parent: Conv) -> int:
        if trace.workers == 1:
            return 0
        hashes = block_hashes(c.tokens, BLOCK)
        for w, pool in enumerate(pools):  # what the workers' load reports say (`Placement.observe`)
            placement.observe(names[w], 0, 0, (0, 0), room=pool.num_blocks - pool.used - pool.retained)
        route = RouteRequest(
            hashes,
            len(c.tokens),
            f"c{c.cid}",
            osl=trace.output_tokens,
            parent_session_id=f"p{parent.cid}" if tree_aware and tree_placement else None,
        )
        decision = placement.choose(
            route, names, {names[w]: pools[w].match(hashes) for w in range(trace.workers)}
        )
        placement.finish(decision.ticket)  # counted again, as every turn is, when it is submitted
        return int(decision.worker)

    def submit(c: Conv, at: float) -> None:
        nonlocal live_own, peak
        c.turn += 1
        kind = "resume" if c.resuming else c.kind
        c.resuming = False
        rid = f"{c.kind[0]}{c.cid}-t{c.turn}"
        full = len(c.tokens) // BLOCK
        tail = c.hashes[-1] if c.hashes else None
        grown = full - max(len(c.hashes), c.prefix_tokens // BLOCK)
        live_own += max(0, grown)
        peak = max(peak, prefix_blocks + live_own)
        c.hashes += block_hashes(c.tokens[len(c.hashes) * BLOCK : full * BLOCK], BLOCK, 0, tail)
        answer = c.kind == "child" and c.turn == c.turns
        n_out = trace.child_answer if answer else trace.output_tokens
        output = [c.rng.randrange(VOCAB) for _ in range(n_out)]
        seq = SimSequence(rid, list(c.tokens), len(c.tokens), output, "stop" if answer else "tool_calls")
        seq.hashes = list(c.hashes)
        if policy is not None:
            idle = None if c.last_end is None else at - c.last_end
            inputs = RetentionInputs(
                len(c.tokens),
                c.prefix_tokens,
                has_tools=True,
                after_tool_result=c.turn > 1,
                idle_s=idle,
                subagent=c.kind == "child",
            )
            seq.retention = decide_retention(policy, inputs)
        w = c.worker
        if not scheds[w].has_work:
            clocks[w] = max(clocks[w], at)
        scheds[w].add(seq)
        pending[rid] = (c, at, kind)
        if trace.workers > 1:  # its load on the worker it is pinned to, and its session's affinity
            session = f"{c.kind[0]}{c.cid}"
            route = RouteRequest(seq.hashes, len(c.tokens), session, osl=n_out)
            tickets[rid] = placement.choose(route, [names[w]], {}).ticket

    def update(c: Conv, retention: Retention | None, at: float) -> None:
        """A retention update as the frontend sends it: the conversation's prompt and output, cached,
        re-released under `retention` by a one-token request that yields to every real one."""
        nonlocal updates
        if retention is None:
            return
        updates += 1
        full = len(c.tokens) // BLOCK
        tail = c.hashes[-1] if c.hashes else None
        c.hashes += block_hashes(c.tokens[len(c.hashes) * BLOCK : full * BLOCK], BLOCK, 0, tail)
        seq = SimSequence(f"u{updates}", list(c.tokens), len(c.tokens), [1], "length")
        seq.hashes = list(c.hashes)
        seq.retention = retention
        if not scheds[c.worker].has_work:
            clocks[c.worker] = max(clocks[c.worker], at)
        scheds[c.worker].add(seq)
        pending[seq.request_id] = (c, at, "update")

    def spawn(parent: Conv, now: float) -> None:
        k = parent.rng.randint(1, 4)
        kind = parent.rng.randrange(len(types))
        parent.waiting_on = k
        for i in range(k):
            crng = random.Random(hash((trace.seed, parent.cid, parent.turn, i)) & 0xFFFFFFFF)
            task = [crng.randrange(VOCAB) for _ in range(crng.randint(*trace.child_task))]
            child = Conv(
                len(convs),
                "child",
                len(types[kind]),
                types[kind] + task,
                crng.randint(*trace.child_turns),
                crng,
                parent=parent.cid,
            )
            child.worker = place_child(child, parent)
            convs.append(child)
            arrive(child, now + 0.05 * i)  # one message with several tool uses: a burst

    def turn_done(c: Conv, seq: SimSequence, now: float) -> None:
        nonlocal live_own
        c.last_end = now
        c.tokens = c.tokens + list(seq.output)
        if c.kind == "child":
            if c.turn < c.turns:
                tool = [c.rng.randrange(VOCAB) for _ in range(c.rng.randint(300, 1500))]
                c.tokens += tool
                arrive(c, now + gap_seconds(c.rng, 2.0, 60.0))
                return
            c.done = True
            live_own -= len(c.hashes) - c.prefix_tokens // BLOCK
            if tree_aware:
                assert policy is not None
                update(c, child_release(policy, len(c.tokens), c.prefix_tokens), now)
            parent = convs[c.parent or 0]
            parent.results += list(seq.output)
            parent.waiting_on -= 1
            if parent.waiting_on == 0:
                parent.tokens += parent.results
                parent.results = []
                parent.resuming = True
                arrive(parent, now + 0.3)
            return
        if c.turn >= c.turns:
            c.done = True
            live_own -= len(c.hashes) - c.prefix_tokens // BLOCK
            return
        if c.rng.random() < trace.spawn_share:
            spawn(c, now)
            if tree_aware:
                assert policy is not None
                update(c, parent_hold(policy, len(c.tokens), c.prefix_tokens), now)
            return
        tool = [c.rng.randrange(VOCAB) for _ in range(max(1, int(c.rng.gauss(trace.tool_tokens, 150))))]
        c.tokens += tool
        arrive(c, now + gap_seconds(c.rng, 8.0, 300.0))

    while True:
        busy = [w for w in range(trace.workers) if scheds[w].has_work]
        next_step = min(busy, key=lambda w: clocks[w]) if busy else None
        if arrivals and (next_step is None or arrivals[0][0] <= clocks[next_step]):
            at, _, cid = heapq.heappop(arrivals)
            sim_now[0] = at
            submit(convs[cid], at)
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
        now = sim_now[0] = clocks[w]
        for seq in outcome.emitted:
            first_token.setdefault(seq.request_id, now)
        for seq, _reason in outcome.finished:
            c, at, kind = pending.pop(seq.request_id)
            ticket = tickets.pop(seq.request_id, None)
            if ticket is not None:
                placement.finish(ticket)
            ttft = first_token.pop(seq.request_id) - at
            results.append(Turn(kind, c.cid, c.turn, seq.prompt_len, seq.cached_tokens or 0, ttft))
            if kind == "update":
                continue
            turn_done(c, seq, now)
    return results, peak


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summarise(turns: list[Turn]) -> dict[str, float]:
    resumes = [t for t in turns if t.kind == "resume"]
    updates = [t for t in turns if t.kind == "update"]
    children = [t for t in turns if t.kind == "child"]
    prompt = sum(t.prompt for t in resumes)
    return {
        "resumes": float(len(resumes)),
        "children": float(len(children)),
        "resume_hit": sum(t.cached for t in resumes) / prompt if prompt else 0.0,
        "resume_p50": pct([t.ttft for t in resumes], 0.5),
        "resume_p99": pct([t.ttft for t in resumes], 0.99),
        "child_p50": pct([t.ttft for t in children], 0.5),
        "child_p99": pct([t.ttft for t in children], 0.99),
        "recomputed": float(sum(t.prompt - t.cached for t in turns)),
        "updates": float(len(updates)),
    }


def plot(results: dict[str, list[Turn]], summary: dict[str, dict[str, float]], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), dpi=100)
    names = list(summary)
    axes[0].bar(names, [summary[n]["resume_hit"] * 100 for n in names], color="#4c72b0")
    axes[0].set_ylabel("parent-resume prefix hit rate (%)")
    axes[0].set_ylim(0, 100)
    for ax, kind, title in ((axes[1], "resume", "parent resumes"), (axes[2], "child", "children's turns")):
        for name in names:
            ttfts = sorted(t.ttft for t in results[name] if t.kind == kind)
            ax.plot(ttfts, [i / len(ttfts) for i in range(len(ttfts))], label=name)
        ax.set_xscale("log")
        ax.set_xlabel(f"TTFT of {title} (s, sim clock)")
        ax.set_ylabel("CDF")
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(f"plot: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="12 sessions x 8 turns (smoke run)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--parents", type=int, default=Trace().parents, help="agent sessions")
    ap.add_argument("--gpu-fraction", type=float, default=0.8, help="GPU KV / peak live working set")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--profile", default=shipped_profiles()[0], help="engine profile whose timing the sim follows"
    )
    args = ap.parse_args()
    trace = Trace(parents=args.parents, workers=args.workers, seed=args.seed)
    if args.quick:
        trace = Trace(parents=12, parent_turns=8, workers=args.workers, seed=args.seed)
    profile = load_profile(args.profile)
    timing = profile.timing
    t0 = time.perf_counter()
    oracle, live = run(trace, 10**9, None, timing)
    longest = (trace.main_prefix + trace.first_tokens) // BLOCK + trace.parent_turns * 120
    gpu = max(int(live * args.gpu_fraction / trace.workers), 2 * longest)
    print(
        f"engine profile: {profile.label}\n{trace.parents} sessions x {trace.parent_turns} turns, "
        f"{trace.spawn_share:.0%} of turns spawn 1-4 subagents of {len(trace.type_prefixes)} types, "
        f"{trace.workers} worker(s); peak live working set {live} blocks; GPU {gpu} blocks/worker "
        f"({gpu * trace.workers / live:.0%})   [oracle {time.perf_counter() - t0:.1f} s]"
    )
    variants: dict[str, tuple[RetentionPolicy | None, bool]] = {
        "lru": (None, False),
        "retention": (TODAY, False),
        "tree": (TREE, True),
    }
    if trace.workers > 1:  # what placement adds: tree-aware retention under the plain KV router
        variants["tree-kv-place"] = (TREE, False)
    results: dict[str, list[Turn]] = {}
    summary: dict[str, dict[str, float]] = {}
    best = summarise(oracle)
    print(
        f"{'oracle':13s} resumes {int(best['resumes']):4d} hit {best['resume_hit']:6.1%}  TTFT p50 "
        f"{best['resume_p50'] * 1e3:7.1f} p99 {best['resume_p99'] * 1e3:8.1f} ms | children "
        f"{int(best['children']):4d} TTFT p50 {best['child_p50'] * 1e3:7.1f} p99 "
        f"{best['child_p99'] * 1e3:8.1f} ms (an infinite cache: the ceiling)"
    )
    for name, (policy, tree_placement) in variants.items():
        t0 = time.perf_counter()
        results[name] = run(trace, gpu, policy, timing, tree_placement=tree_placement)[0]
        summary[name] = s = summarise(results[name])
        print(
            f"{name:13s} resumes {int(s['resumes']):4d} hit {s['resume_hit']:6.1%}  "
            f"TTFT p50 {s['resume_p50'] * 1e3:7.1f} p99 {s['resume_p99'] * 1e3:8.1f} ms | "
            f"children {int(s['children']):4d} TTFT p50 {s['child_p50'] * 1e3:7.1f} p99 "
            f"{s['child_p99'] * 1e3:8.1f} ms | recomputed {s['recomputed'] / 1e6:6.2f}M tok "
            f"(retention updates {int(s['updates'])})  [{time.perf_counter() - t0:.1f} s]"
        )
    base, tree = summary["retention"], summary["tree"]
    p99 = base["resume_p99"] / tree["resume_p99"] if tree["resume_p99"] else math.inf
    child = tree["child_p50"] / base["child_p50"] if base["child_p50"] else math.inf
    print(
        f"tree vs today's retention: parent-resume TTFT p99 {p99:.2f}x lower (target >= 2x: "
        f"{'met' if p99 >= 2 else 'MISSED'}), p50 {base['resume_p50'] / tree['resume_p50']:.2f}x; "
        f"children TTFT p50 {child:.2f}x of today's "
        f"(target <= 1.10: {'met' if child <= 1.10 else 'MISSED'}); "
        f"recomputed {tree['recomputed'] / base['recomputed']:.2f}x; "
        f"resume hit {base['resume_hit']:.1%} -> {tree['resume_hit']:.1%}"
    )
    name = "subagents.png" if args.profile == shipped_profiles()[0] else f"subagents-{args.profile}.png"
    plot(results, summary, Path(__file__).parent / "results" / name)


if __name__ == "__main__":
    main()
