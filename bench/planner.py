"""Elastic capacity on an agent trace, on the sim's clock (issue 25): the planner against static fleets.

Agent sessions arrive in waves (a base rate and two waves at 12× it); each session has a shared
system+tools prefix (one of three agent types), a first message, then 6-16 turns separated by tool
gaps of seconds to minutes (log-normal, median 8 s), each turn adding the model's output and a tool
result, so prompts grow from ~15K to ~40K tokens. Every worker is the sim's scheduler and KV pool
under one engine profile (default: the measured H200 one), with the agent retention policy; a new
session goes to the ready worker with the fewest uncached prefix blocks plus a load term, a returning
turn to the worker that holds its session (if it still exists).

Three fleets, same trace, in one run:

- `static-max`: `--max` workers all the time (the SLA at peak, paid for all day);
- `static-min`: `--min` workers;
- `planner`: `agentserve.planner.decide` every `--interval` sim seconds over the fleet's own readings
  (demand in the last minute, active and retained KV blocks, queue, observed TTFT/ITL p90); new
  workers take the profile's model-load time before they serve; removed workers are chosen by
  `choose_removals`, drained (no new sessions), and gone when their last request ends.

Per fleet: SLA attainment (turns with TTFT ≤ target and mean ITL ≤ target), TTFT p50/p90/p99,
worker-hours (loading and draining included), scale events, and sessions whose next turn found
their worker gone (their prefix lost to a scale-down). Writes bench/results/planner.png (load,
desired vs ready workers, TTFT p90 per minute).

    PYTHONPATH=src python bench/planner.py [--quick] [--profile NAME] [--min 1] [--max 8]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentserve.frontend.retention import AGENT, RetentionInputs, RetentionPolicy, decide_retention  # noqa: E402
from agentserve.planner.decide import (  # noqa: E402
    Decision,
    PlannerConfig,
    Sample,
    WorkerState,
    choose_removals,
    decide,
)
from agentserve.planner.predict import Demand  # noqa: E402
from agentserve.prompt.hashing import block_hashes  # noqa: E402
from agentserve.worker.kvpool import KvPool  # noqa: E402
from agentserve.worker.profiles import Profile, load_profile  # noqa: E402
from agentserve.worker.scheduler import Scheduler, SchedulerConfig, SimSequence  # noqa: E402

BLOCK = 32
VOCAB = 150_000
CHUNK = 8192
WINDOW_S = 60.0  # the planner's demand window


@dataclass(frozen=True, slots=True)
class Trace:
    minutes: float = 40.0
    base_rate: float = 4.0  # new sessions per minute
    peak_rate: float = 48.0  # during a wave (12×)
    waves: tuple[tuple[float, float], ...] = ((8.0, 6.0), (24.0, 6.0))  # (start, length) in minutes
    prefixes: tuple[int, ...] = (12_000, 16_000, 20_000)  # agent types: system + tools tokens
    first_tokens: int = 1500
    output_tokens: int = 150
    tool_tokens: int = 1200  # median tool result
    turns: tuple[int, int] = (6, 16)
    seed: int = 1

    def rate(self, minute: float) -> float:
        inside = any(start <= minute < start + length for start, length in self.waves)
        return self.peak_rate if inside else self.base_rate


@dataclass(slots=True)
class Worker:
    index: int
    sched: Scheduler
    pool: KvPool
    started: float
    ready_at: float
    clock: float = 0.0
    draining: bool = False
    removed_at: float | None = None

    def alive(self) -> bool:
        return self.removed_at is None

    def serving(self, now: float) -> bool:
        return self.removed_at is None and not self.draining and self.ready_at <= now


@dataclass(slots=True)
class Session:
    sid: int
    kind: int
    tokens: list[int]
    hashes: list[int]
    turns: int
    rng: random.Random
    worker: int | None = None
    turn: int = 0
    last_end: float | None = None


@dataclass(slots=True)
class TurnResult:
    session: int
    turn: int
    start: float
    ttft: float
    itl: float
    prompt: int
    cached: int
    lost_prefix: bool


@dataclass(slots=True)
class Run:
    name: str
    results: list[TurnResult] = field(default_factory=list)
    worker_seconds: float = 0.0
    scale_events: int = 0
    lost_sessions: int = 0
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, desired, ready)
    decisions: list[Decision] = field(default_factory=list)


def gap_seconds(rng: random.Random) -> float:
    if rng.random() < 0.04:
        return rng.uniform(120.0, 600.0)
    return min(240.0, max(1.0, rng.lognormvariate(math.log(8.0), 1.1)))


def session_arrivals(trace: Trace) -> list[float]:
    """Session start times: a Poisson process whose rate follows the waves (thinning)."""
    rng = random.Random(trace.seed)
    top = max(trace.peak_rate, trace.base_rate) / 60.0
    t, out = 0.0, []
    while True:
        t += rng.expovariate(top)
        if t >= trace.minutes * 60:
            return out
        if rng.random() < trace.rate(t / 60.0) / 60.0 / top:
            out.append(t)


def simulate(
    trace: Trace,
    profile: Profile,
    *,
    name: str,
    fixed: int | None,
    config: PlannerConfig,
    interval: float,
    progress: Callable[[str], None],
    forecast: bool = True,
    policy: RetentionPolicy = AGENT,
) -> Run:
    timing = profile.timing
    load_s = timing.model_load_s
    sched_config = SchedulerConfig(max_batch_size=256, max_num_tokens=CHUNK)
    workers: list[Worker] = []
    run = Run(name)

    def add_worker(now: float, ready_at: float) -> None:
        pool = KvPool(config.kv_blocks_per_worker, BLOCK)
        w = Worker(len(workers), Scheduler(pool, sched_config), pool, now, ready_at, clock=now)
        workers.append(w)

    for _ in range(fixed if fixed is not None else config.min_workers):
        add_worker(0.0, 0.0)
    desired = len(workers)
    rng = random.Random(trace.seed + 1)
    prefixes = [[rng.randrange(VOCAB) for _ in range(n)] for n in trace.prefixes]
    prefix_hashes = [block_hashes(p, BLOCK) for p in prefixes]
    events: list[tuple[float, int, int]] = []  # (time, kind, id): kind 0 = turn, 1 = planner tick
    sessions: list[Session] = []
    for sid, at in enumerate(session_arrivals(trace)):
        srng = random.Random(trace.seed * 1_000_003 + sid)
        kind = srng.randrange(len(prefixes))
        tokens = prefixes[kind] + [srng.randrange(VOCAB) for _ in range(trace.first_tokens)]
        sessions.append(
            Session(sid, kind, tokens, list(prefix_hashes[kind]), srng.randint(*trace.turns), srng)
        )
        heapq.heappush(events, (at, 0, sid))
    if fixed is None:
        heapq.heappush(events, (interval, 1, 0))
    pending: dict[str, tuple[Session, float, bool]] = {}
    first_token: dict[str, float] = {}
    turn_log: list[tuple[float, int, int, int]] = []  # (start, prompt, cached, output) for demand
    session_starts: list[float] = []
    session_turns: list[int] = []  # turns of the sessions that ended
    history: list[Sample] = []
    end = trace.minutes * 60

    def route(s: Session, now: float) -> tuple[Worker, bool]:
        """The KV router's choice: fewest uncached prefix blocks plus a load term (a returning turn
        usually stays where its prefix is, and moves when that worker is swamped)."""
        candidates = [w for w in workers if w.serving(now)] or [w for w in workers if w.alive()]

        def cost(w: Worker) -> float:
            hit = w.pool.match(s.hashes)
            return (len(s.hashes) - hit) + 0.1 * (w.pool.used + 64 * w.sched.num_waiting)

        best = min(candidates, key=lambda w: (cost(w), w.index))
        # Its worker was removed while it was in a tool gap: its prefix went with it.
        lost = s.worker is not None and not workers[s.worker].alive()
        s.worker = best.index
        return best, lost

    def submit(s: Session, now: float) -> None:
        s.turn += 1
        if s.turn == 1:
            session_starts.append(now)
        w, lost = route(s, now)
        if lost:
            run.lost_sessions += 1
        full = len(s.tokens) // BLOCK
        tail = s.hashes[-1] if s.hashes else None
        s.hashes += block_hashes(s.tokens[len(s.hashes) * BLOCK : full * BLOCK], BLOCK, 0, tail)
        rid = f"s{s.sid}-t{s.turn}"
        output = [s.rng.randrange(VOCAB) for _ in range(trace.output_tokens)]
        seq = SimSequence(rid, list(s.tokens), len(s.tokens), output, "tool_calls")
        seq.hashes = list(s.hashes)
        idle = None if s.last_end is None else now - s.last_end
        inputs = RetentionInputs(len(s.tokens), trace.prefixes[s.kind], True, s.turn > 1, None, idle)
        seq.retention = decide_retention(policy, inputs)
        if not w.sched.has_work:
            w.clock = max(w.clock, now, w.ready_at)
        w.sched.add(seq)
        pending[rid] = (s, now, lost)

    def tick(now: float) -> None:
        nonlocal desired
        for w in workers:  # drained workers with nothing left go away
            if w.alive() and w.draining and not w.sched.has_work:
                w.removed_at = now
        recent = [t for t in turn_log if t[0] >= now - WINDOW_S]
        done = [r for r in run.results if r.start + r.ttft >= now - WINDOW_S]
        if recent:
            demand = Demand(
                request_rate=len(recent) / WINDOW_S,
                uncached_tokens=statistics.fmean(p - c for _, p, c, _ in recent),
                cached_tokens=statistics.fmean(c for _, _, c, _ in recent),
                output_tokens=statistics.fmean(o for *_, o in recent),
                context_tokens=statistics.fmean(p for _, p, _, _ in recent),
            )
        else:
            demand = Demand(0.0, 1.0, 0.0, 1.0, 1.0)
        alive = [w for w in workers if w.alive()]
        for w in alive:
            w.pool.now = now
        sample = Sample(
            at=now,
            ready_workers=sum(w.serving(now) for w in alive),
            demand=demand,
            kv_active_blocks=sum(w.pool.used for w in alive),
            kv_retained_blocks=sum(w.pool.retained - w.pool.pinned for w in alive),
            kv_pinned_blocks=max((w.pool.pinned for w in alive), default=0),
            waiting=sum(w.sched.num_waiting for w in alive),
            observed_ttft_s=_pct([r.ttft for r in done], 0.9) if len(done) >= 5 else None,
            observed_itl_s=_pct([r.itl for r in done], 0.9) if len(done) >= 5 else None,
            session_rate=sum(1 for t in session_starts if t >= now - WINDOW_S) / WINDOW_S
            if forecast
            else 0.0,
            turns_per_session=statistics.fmean(session_turns) if session_turns else None,
        )
        history.append(sample)
        decision = decide(history[-200:], config, timing, current=desired, previous=run.decisions[-200:])
        run.decisions.append(decision)
        active = [w for w in alive if not w.draining]
        if decision.desired > len(active):
            run.scale_events += 1
            for w in [w for w in alive if w.draining][: decision.desired - len(active)]:
                w.draining = False  # cheaper than a new worker: it still holds its KV
            for _ in range(decision.desired - len([w for w in alive if not w.draining])):
                add_worker(now, now + load_s)
        elif decision.desired < len(active):
            run.scale_events += 1
            states = [
                WorkerState(
                    str(w.index),
                    w.pool.retained - w.pool.pinned,
                    len(w.sched.running) + w.sched.num_waiting,
                    w.serving(now),
                )
                for w in active
            ]
            for victim in choose_removals(states, len(active) - decision.desired):
                workers[int(victim)].draining = True
        desired = decision.desired
        run.timeline.append((now, desired, sum(w.serving(now) for w in workers)))
        if now + interval < end + 600:
            heapq.heappush(events, (now + interval, 1, 0))

    steps = 0
    while True:
        busy = [w for w in workers if w.alive() and w.sched.has_work]
        nxt = min(busy, key=lambda w: max(w.clock, w.ready_at)) if busy else None
        due = max(nxt.clock, nxt.ready_at) if nxt is not None else math.inf
        if events and events[0][0] <= due:
            at, kind, sid = heapq.heappop(events)
            if kind == 1:
                if pending or any(e[1] == 0 for e in events):
                    tick(at)
            else:
                submit(sessions[sid], at)
            continue
        if nxt is None:
            break
        w = nxt
        w.clock = max(w.clock, w.ready_at)
        w.pool.now = w.clock
        outcome = w.sched.step()
        w.clock += timing.step_seconds(outcome.work)
        steps += 1
        if steps % 200_000 == 0:
            progress(f"  {name}: sim {w.clock / 60:.1f} min, {len(run.results)} turns done")
        for seq in outcome.emitted:
            first_token.setdefault(seq.request_id, w.clock)
        for seq, _reason in outcome.finished:
            s, at, lost = pending.pop(seq.request_id)
            first = first_token.pop(seq.request_id)
            itl = (w.clock - first) / max(seq.emitted - 1, 1)
            cached = seq.cached_tokens or 0
            run.results.append(TurnResult(s.sid, s.turn, at, first - at, itl, seq.prompt_len, cached, lost))
            turn_log.append((at, seq.prompt_len, cached, seq.emitted))
            s.last_end = w.clock
            if s.turn == s.turns:
                session_turns.append(s.turn)
            else:
                tool = min(8 * trace.tool_tokens, int(s.rng.lognormvariate(math.log(trace.tool_tokens), 0.8)))
                s.tokens += list(seq.output) + [s.rng.randrange(VOCAB) for _ in range(tool)]
                heapq.heappush(events, (w.clock + gap_seconds(s.rng), 0, s.sid))
    finish = max([w.clock for w in workers] + [end])
    run.worker_seconds = sum(
        (w.removed_at if w.removed_at is not None else finish) - w.started for w in workers
    )
    return run


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(run: Run, targets: tuple[float, float]) -> dict[str, float]:
    ttft_t, itl_t = targets
    ok = sum(r.ttft <= ttft_t and r.itl <= itl_t for r in run.results)
    ttfts = [r.ttft for r in run.results]
    return {
        "turns": len(run.results),
        "attainment": ok / len(run.results),
        "ttft_p50": _pct(ttfts, 0.5),
        "ttft_p90": _pct(ttfts, 0.9),
        "ttft_p99": _pct(ttfts, 0.99),
        "itl_p90": _pct([r.itl for r in run.results], 0.9),
        "worker_hours": run.worker_seconds / 3600,
        "scale_events": run.scale_events,
        "lost_sessions": run.lost_sessions,
    }


def plot(runs: list[Run], trace: Trace, path: Path, targets: tuple[float, float]) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (load, fleet, ttft) = plt.subplots(3, 1, figsize=(10, 8), dpi=100, sharex=True)
    minutes = int(trace.minutes) + 10
    for run in runs:
        per_min: dict[int, list[float]] = {}
        for r in run.results:
            per_min.setdefault(int(r.start // 60), []).append(r.ttft)
        xs = sorted(per_min)
        ttft.plot(xs, [_pct(per_min[x], 0.9) for x in xs], label=run.name)
        if run.name == "planner":
            counts = [sum(1 for r in run.results if int(r.start // 60) == m) for m in range(minutes)]
            load.bar(range(minutes), counts, color="#999999")
            fleet.step([t / 60 for t, _, _ in run.timeline], [d for _, d, _ in run.timeline], label="desired")
            fleet.step([t / 60 for t, _, _ in run.timeline], [r for _, _, r in run.timeline], label="ready")
    load.set_ylabel("turns started / min")
    fleet.set_ylabel("planner workers")
    fleet.legend(fontsize=8)
    ttft.axhline(targets[0], color="red", linestyle="--", linewidth=1, label="TTFT target")
    ttft.set_yscale("log")
    ttft.set_ylabel("TTFT p90 (s)")
    ttft.set_xlabel("minute (sim clock)")
    ttft.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(f"plot: {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a 20-minute trace with one wave")
    ap.add_argument("--profile", default="h200-qwen3-30b-a3b-pytorch", help="engine profile of the sim")
    ap.add_argument("--min", type=int, default=1, dest="min_workers")
    ap.add_argument("--max", type=int, default=8, dest="max_workers")
    ap.add_argument("--ttft-target", type=float, default=3.0, help="seconds (p90 is planned)")
    ap.add_argument("--itl-target", type=float, default=0.1, help="seconds, mean per turn")
    ap.add_argument("--interval", type=float, default=10.0, help="planner interval, sim seconds")
    ap.add_argument("--scale-down-delay", type=float, default=60.0, help="sim seconds")
    ap.add_argument("--kv-blocks", type=int, default=20_000, help="KV blocks per worker (H200: ~20K)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--session-retention",
        type=float,
        default=AGENT.session_duration_s,
        help="seconds an agent session's KV is kept after its turn (kvCache.retention.sessionSeconds)",
    )
    ap.add_argument(
        "--ablation",
        action="store_true",
        help="also the planner without the session forecast (turn rate only)",
    )
    ap.add_argument("--base-rate", type=float, default=Trace().base_rate, help="new sessions per minute")
    ap.add_argument(
        "--peak-rate", type=float, default=Trace().peak_rate, help="new sessions per minute in a wave"
    )
    args = ap.parse_args()
    trace = Trace(base_rate=args.base_rate, peak_rate=args.peak_rate, seed=args.seed)
    if args.quick:
        trace = Trace(20.0, args.base_rate, args.peak_rate, ((6.0, 5.0),), seed=args.seed)
    profile = load_profile(args.profile)
    targets = (args.ttft_target, args.itl_target)
    config = PlannerConfig(
        min_workers=args.min_workers,
        max_workers=args.max_workers,
        ttft_target_s=args.ttft_target,
        itl_target_s=args.itl_target,
        kv_blocks_per_worker=args.kv_blocks,
        scale_down_delay_s=args.scale_down_delay,
        chunk=CHUNK,
    )
    print(
        f"engine profile: {profile.label}; model load {profile.timing.model_load_s:.0f} s; trace "
        f"{trace.minutes:.0f} min, {len(session_arrivals(trace))} sessions, base {trace.base_rate}/min, "
        f"waves {trace.peak_rate}/min at {[w[0] for w in trace.waves]} min; targets TTFT {targets[0]} s, "
        f"ITL {targets[1] * 1e3:.0f} ms"
    )
    fleets: dict[str, int | None] = {
        "static-max": args.max_workers,
        "static-min": args.min_workers,
        "planner": None,
    }
    if args.ablation:
        fleets["planner-no-forecast"] = None
    runs: list[Run] = []
    rows: dict[str, dict[str, float]] = {}
    for name, fixed in fleets.items():
        t0 = time.perf_counter()
        forecast = name != "planner-no-forecast"
        run = simulate(
            trace,
            profile,
            name=name,
            fixed=fixed,
            config=config,
            interval=args.interval,
            progress=print,
            forecast=forecast,
            policy=replace(AGENT, session_duration_s=args.session_retention),
        )
        runs.append(run)
        rows[name] = r = report(run, targets)
        print(
            f"{name:11s} SLA {r['attainment']:6.1%}  TTFT p50 {r['ttft_p50']:6.2f} p90 {r['ttft_p90']:6.2f} "
            f"p99 {r['ttft_p99']:6.2f} s  ITL p90 {r['itl_p90'] * 1e3:5.0f} ms  worker-hours "
            f"{r['worker_hours']:5.2f}  scale events {r['scale_events']:3.0f}  sessions that lost their "
            f"worker {r['lost_sessions']:3.0f}  turns {r['turns']:.0f}  [{time.perf_counter() - t0:.0f} s]",
            flush=True,
        )
    for run in runs:
        if run.decisions:
            reasons: dict[str, int] = {}
            for d in run.decisions:
                key = d.reason.split(":")[0]
                reasons[key] = reasons.get(key, 0) + 1
            print(f"{run.name} decisions by reason: {dict(sorted(reasons.items()))}")
    plan, top, low = rows["planner"], rows["static-max"], rows["static-min"]
    share = plan["worker_hours"] / top["worker_hours"]
    gain = plan["attainment"] - low["attainment"]
    held = "ok" if plan["attainment"] >= 0.95 else "MISSED"
    print(
        f"planner: SLA {plan['attainment']:.1%} (target >= 95 %: {held}), "
        f"{share:.0%} of static-max worker-hours (target <= 60 %: {'ok' if share <= 0.6 else 'MISSED'}), "
        f"{100 * gain:+.0f} points over static-min (target >= 30: {'ok' if gain >= 0.30 else 'MISSED'})"
    )
    plot(runs, trace, ROOT / "bench" / "results" / "planner.png", targets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
