"""The planner's decision: how many workers, and which to remove (pure, deterministic).

Every interval the I/O edge reads the fleet into a `Sample` and calls `decide` with the history. The
decision is the smallest worker count in [min, max] that

1. holds the KV the fleet holds — running requests' blocks *and* the blocks retained for agent
   sessions in a tool gap (scaling below that evicts exactly the sessions that come back), and
2. meets the TTFT and ITL targets with headroom, as `predict` computes them from the timing model,
   corrected by how far the observed values at the current count sit from the prediction, for the
   demand the agent sessions will bring: the observed turn rate, or new sessions per second × turns
   per session when that is higher (a wave of new sessions is a wave of tool loops minutes long).

Up is immediate; down only after every sample of the last `scale_down_delay_s` asked for fewer, and
then to the largest count any of them asked for (hysteresis: a burst between tool gaps keeps the
workers its sessions come back to). `choose_removals` picks the workers whose retained sessions are
cheapest to lose.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from agentserve.planner.predict import Demand, Prediction, predict
from agentserve.worker.timing import TimingModel

CORRECTION_BOUNDS = (0.5, 4.0)  # observed ÷ predicted, clamped: one bad reading cannot run away


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    min_workers: int
    max_workers: int
    ttft_target_s: float
    itl_target_s: float
    kv_blocks_per_worker: int
    scale_down_delay_s: float = 300.0
    headroom: float = 0.8  # plan to this share of each target
    kv_fill: float = 0.9  # plan KV to this share of a worker's blocks
    chunk: int = 8192  # the engines' prefill chunk (max_num_tokens)

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError(
                f"need 1 <= min_workers <= max_workers, got {self.min_workers}..{self.max_workers}"
            )
        if self.ttft_target_s <= 0 or self.itl_target_s <= 0 or self.kv_blocks_per_worker < 1:
            raise ValueError("targets and the KV size must be positive")
        if not 0 < self.headroom <= 1 or not 0 < self.kv_fill <= 1:
            raise ValueError("headroom and kv_fill are shares in (0, 1]")


@dataclass(frozen=True, slots=True)
class Sample:
    """One interval's reading of the fleet (the I/O edge derives it from metrics)."""

    at: float  # seconds, any monotonic clock
    ready_workers: int
    demand: Demand
    kv_active_blocks: int  # held by running requests, all workers
    kv_retained_blocks: int  # kept for agent sessions in a tool gap (retention, expiring), all workers
    waiting: int = 0  # requests queued at the routers or engines
    observed_ttft_s: float | None = None  # the window's TTFT (same quantile the target means)
    observed_itl_s: float | None = None
    # Agent sessions come back: new sessions per second, and how many turns a session has had on
    # average (None: none finished yet). Their product is the turn rate the sessions arriving now
    # will bring once they are all in their tool loops — ahead of the turn rate observed so far.
    session_rate: float = 0.0
    turns_per_session: float | None = None
    # Blocks one worker keeps without expiry (the shared system+tools prefix, the most any worker
    # pins): every worker holds its own copy, so it takes room on each, not once for the fleet.
    kv_pinned_blocks: int = 0

    def planning_demand(self) -> Demand:
        """The demand to plan for: the observed one, or the turn rate the sessions arriving now will
        bring, whichever is higher (so a wave of new sessions scales up before their turns pile up)."""
        if self.turns_per_session is None or self.session_rate <= 0:
            return self.demand
        coming = self.session_rate * self.turns_per_session
        if coming <= self.demand.request_rate:
            return self.demand
        return replace(self.demand, request_rate=coming)


@dataclass(frozen=True, slots=True)
class Decision:
    at: float
    desired: int
    reason: str  # why this count (one of REASONS, with detail)
    needed: int  # what this sample alone asks for (before hysteresis)
    kv_floor: int
    predicted: Prediction  # at `desired`, corrected
    observed_ttft_s: float | None
    observed_itl_s: float | None


def kv_floor(sample: Sample, config: PlannerConfig) -> int:
    """Workers needed to hold the active and the retained session blocks, each worker's room less the
    shared prefix it pins (at least one block: a prefix as large as the cache leaves a worker one)."""
    held = sample.kv_active_blocks + sample.kv_retained_blocks
    room = max(config.kv_blocks_per_worker * config.kv_fill - sample.kv_pinned_blocks, 1.0)
    return max(1, math.ceil(held / room))


def needed(
    sample: Sample, config: PlannerConfig, timing: TimingModel, fix: tuple[float, float]
) -> tuple[int, str, Prediction]:
    """The smallest count meeting the targets and the KV floor for this sample alone (corrected by
    `fix`, observed ÷ predicted TTFT and ITL), why, and its prediction."""
    floor = kv_floor(sample, config)
    lowest = max(config.min_workers, min(floor, config.max_workers))
    ttft_goal = config.headroom * config.ttft_target_s
    itl_goal = config.headroom * config.itl_target_s
    prediction: Prediction | None = None
    for n in range(lowest, config.max_workers + 1):
        prediction = _corrected(predict(sample.planning_demand(), n, timing, chunk=config.chunk), fix)
        if prediction.ttft_s > ttft_goal or prediction.itl_s > itl_goal:
            continue
        if n > lowest:
            ms = f"TTFT {prediction.ttft_s * 1e3:.0f} ms, ITL {prediction.itl_s * 1e3:.0f} ms"
            return n, f"targets: {n} workers predict {ms}", prediction
        if floor > config.min_workers:
            return n, f"kv: {floor} workers hold the active and retained blocks", prediction
        return n, "min: the targets hold at the minimum", prediction
    assert prediction is not None  # lowest <= max_workers: the loop ran
    return config.max_workers, "max: the targets are not met even at max_workers", prediction


def corrections(history: Sequence[Sample], config: PlannerConfig, timing: TimingModel) -> tuple[float, float]:
    """Observed ÷ predicted TTFT and ITL at the count that served each sample (median over the
    history's samples that observed any), clamped to `CORRECTION_BOUNDS`; 1 without observations."""
    ttft: list[float] = []
    itl: list[float] = []
    for s in history:
        if s.ready_workers < 1 or (s.observed_ttft_s is None and s.observed_itl_s is None):
            continue
        p = predict(s.demand, s.ready_workers, timing, chunk=config.chunk)
        if s.observed_ttft_s is not None and math.isfinite(p.ttft_s) and p.ttft_s > 0:
            ttft.append(s.observed_ttft_s / p.ttft_s)
        if s.observed_itl_s is not None and p.itl_s > 0:
            itl.append(s.observed_itl_s / p.itl_s)
    lo, hi = CORRECTION_BOUNDS
    return (
        min(max(statistics.median(ttft), lo), hi) if ttft else 1.0,
        min(max(statistics.median(itl), lo), hi) if itl else 1.0,
    )


def decide(
    history: Sequence[Sample],
    config: PlannerConfig,
    timing: TimingModel,
    current: int | None = None,
    previous: Sequence[Decision] = (),
) -> Decision:
    """The worker count to run now (module docstring). `current`: the count last asked for
    (default: the latest sample's ready workers). `previous`: the decisions made so far; the
    scale-down delay compares with what each of them needed when it was made (without them, each
    sample of the window is judged again with today's correction)."""
    if not history:
        raise ValueError("no samples")
    latest = history[-1]
    now = latest.at
    window = [s for s in history if s.at >= now - config.scale_down_delay_s]
    fix = corrections(window, config, timing)
    need, reason, prediction = needed(latest, config, timing, fix)
    # A queue in one reading is often a moment (a burst admitted a step later); one that outlasts an
    # interval says the count is short even where the model says it is not.
    queued = latest.waiting > 0 and (len(history) < 2 or history[-2].waiting > 0)
    if queued and latest.ready_workers >= need and need < config.max_workers:
        need, reason = latest.ready_workers + 1, f"queue: {latest.waiting} requests waiting"
        prediction = _corrected(predict(latest.planning_demand(), need, timing, chunk=config.chunk), fix)
    have = latest.ready_workers if current is None else current
    desired = need
    if need < have:
        covered = history[0].at <= now - config.scale_down_delay_s
        recent = [d.needed for d in previous if d.at >= now - config.scale_down_delay_s]
        past = max(recent) if recent else max(needed(s, config, timing, fix)[0] for s in window)
        if not covered or past >= have:
            desired = have
            reason = (
                f"hold: {need} would do, waiting out the {config.scale_down_delay_s:.0f} s scale-down delay"
            )
        else:
            desired = max(past, need)
            reason = (
                f"down: every sample of the last {config.scale_down_delay_s:.0f} s needed at most {desired}"
            )
        prediction = _corrected(predict(latest.planning_demand(), desired, timing, chunk=config.chunk), fix)
    desired = min(max(desired, config.min_workers), config.max_workers)
    return Decision(
        now,
        desired,
        reason,
        need,
        kv_floor(latest, config),
        prediction,
        latest.observed_ttft_s,
        latest.observed_itl_s,
    )


def _corrected(p: Prediction, fix: tuple[float, float]) -> Prediction:
    c_ttft, c_itl = fix
    return Prediction(p.workers, p.ttft_s * c_ttft, p.itl_s * c_itl, p.mean_step_s, p.decoding, p.mixed_share)


@dataclass(frozen=True, slots=True)
class WorkerState:
    name: str
    retained_blocks: int  # KV kept for sessions in a tool gap
    active_requests: int
    ready: bool = True


def choose_removals(workers: Sequence[WorkerState], count: int) -> list[str]:
    """The `count` workers cheapest to remove: not ready first, then the fewest retained session
    blocks (the prefixes that would have to be recomputed), then the fewest running requests (to
    drain or migrate); ties by name, so the choice is deterministic."""
    ranked = sorted(workers, key=lambda w: (w.ready, w.retained_blocks, w.active_requests, w.name))
    return [w.name for w in ranked[: max(count, 0)]]
