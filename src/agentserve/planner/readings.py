"""From what the fleet reports to the planner's `Sample` (pure: no clock, no I/O).

Both planner loops read the same things — each worker's `Load` (its `GET /load`, or the in-process
engine's), the frontends' TTFT/ITL histograms, request and session-start counters, the routers' queue
depth — and turn the growth of the counters between two readings into the demand of the window.
`SampleBuilder` keeps the previous reading; `parse_frontend_metrics` / `parse_router_queue` read the
Prometheus text the frontend and router serve on `/metrics` (what the cluster planner fetches).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from prometheus_client.parser import text_string_to_metric_families

from agentserve.planner.decide import Sample
from agentserve.planner.predict import Demand
from agentserve.worker.engine import Load

Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), ascending, +Inf last
MIN_OBSERVATIONS = 5  # fewer finished requests in a window: no observed latency
QUANTILE = 0.9  # the quantile the TTFT and ITL targets mean

# The frontend's series the planner reads (agentserve.telemetry.metrics.FrontendMetrics).
TTFT_SERIES = "agentserve_frontend_time_to_first_token_seconds"
ITL_SERIES = "agentserve_frontend_inter_token_latency_seconds"
REQUESTS_SERIES = "agentserve_frontend_requests"
SESSION_STARTS_SERIES = "agentserve_frontend_session_starts"
ROUTER_QUEUE_SERIES = "agentserve_router_queue_depth"


def window_quantile(q: float, before: Buckets, after: Buckets) -> float | None:
    """The q-quantile of the observations a histogram gained between two readings (linear within a
    bucket, as PromQL's histogram_quantile); None with fewer than `MIN_OBSERVATIONS`."""
    old = dict(before)
    grown = [(le, count - old.get(le, 0.0)) for le, count in after]
    total = grown[-1][1] if grown else 0.0
    if total < MIN_OBSERVATIONS:
        return None
    rank = q * total
    low, below = 0.0, 0.0
    for le, cumulative in grown:
        if cumulative >= rank:
            if le == float("inf"):
                return low  # beyond the last finite bound: its lower edge
            inside = cumulative - below
            return low + (le - low) * ((rank - below) / inside if inside else 0.0)
        low, below = le, cumulative
    return low


@dataclass(frozen=True, slots=True)
class Reading:
    """The frontends' latency histograms and counters at one moment (summed over replicas)."""

    ttft: Buckets
    itl: Buckets
    requests: float
    session_starts: float

    @staticmethod
    def total(readings: Iterable[Reading]) -> Reading | None:
        """Several frontends' readings as one (buckets summed by bound); None when there are none."""
        items = list(readings)
        if not items:
            return None
        return Reading(
            _sum_buckets(r.ttft for r in items),
            _sum_buckets(r.itl for r in items),
            sum(r.requests for r in items),
            sum(r.session_starts for r in items),
        )


def _sum_buckets(many: Iterable[Buckets]) -> Buckets:
    summed: dict[float, float] = {}
    for buckets in many:
        for le, count in buckets:
            summed[le] = summed.get(le, 0.0) + count
    return sorted(summed.items())


def parse_frontend_metrics(text: str) -> Reading:
    """A frontend's `/metrics` text → its `Reading` (label sets summed). Raises ValueError on text
    that is not the Prometheus exposition format."""
    ttft: dict[float, float] = {}
    itl: dict[float, float] = {}
    requests = sessions = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == TTFT_SERIES + "_bucket":
                le = float(sample.labels["le"])
                ttft[le] = ttft.get(le, 0.0) + sample.value
            elif sample.name == ITL_SERIES + "_bucket":
                le = float(sample.labels["le"])
                itl[le] = itl.get(le, 0.0) + sample.value
            elif sample.name == REQUESTS_SERIES + "_total":
                requests += sample.value
            elif sample.name == SESSION_STARTS_SERIES + "_total":
                sessions += sample.value
    return Reading(sorted(ttft.items()), sorted(itl.items()), requests, sessions)


def parse_router_queue(text: str) -> int:
    """A router's `/metrics` text → requests waiting in its priority queue."""
    waiting = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ROUTER_QUEUE_SERIES:
                waiting += sample.value
    return int(waiting)


def session_blocks(load: Load) -> int:
    """A worker's retained blocks that belong to sessions (expiring), not the prefix it pins."""
    return max(load.kv_blocks_retained - load.kv_blocks_pinned, 0)


@dataclass(slots=True)
class Totals:
    """A worker's cumulative counters (what `Load` reports since the worker started)."""

    finished: int = 0
    prompt: int = 0
    cached: int = 0
    generated: int = 0

    @classmethod
    def of(cls, load: Load) -> Totals:
        return cls(
            load.requests_finished, load.prompt_tokens, load.cached_prompt_tokens, load.generated_tokens
        )


def demand(grown: Totals, elapsed: float) -> Demand:
    """The window's demand from the counters' growth over `elapsed` seconds."""
    if grown.finished == 0 or elapsed <= 0:
        return Demand(0.0, 1.0, 0.0, 1.0, 1.0)
    n = grown.finished
    output = grown.generated / n
    return Demand(
        request_rate=n / elapsed,
        uncached_tokens=max((grown.prompt - grown.cached) / n, 1.0),
        cached_tokens=grown.cached / n,
        output_tokens=max(output, 1.0),
        context_tokens=grown.prompt / n + output / 2,
    )


@dataclass
class SampleBuilder:
    """Turns successive readings of the fleet into `Sample`s: the counters' growth since the previous
    reading is the window's demand. A worker seen for the first time counts from zero (it started in
    the window); a worker whose counters went back (restarted) counts from its new values."""

    interval_s: float  # the window assumed for the first reading
    time_scale: float = 1.0  # engine seconds per wall second (the frontend's histograms are wall)
    _seen: dict[str, Totals] = field(default_factory=dict)
    _last_at: float | None = None
    _reading: Reading | None = None

    def prime(self, reading: Reading | None) -> None:
        """The frontends' reading before the first window (its growth is what the window observed)."""
        self._reading = reading

    def build(
        self,
        at: float,
        loads: Mapping[str, Load],
        ready_workers: int,
        *,
        frontend: Reading | None = None,
        queued: int = 0,
    ) -> Sample:
        grown = Totals()
        for worker, load in loads.items():
            now = Totals.of(load)
            before = self._seen.get(worker, Totals())
            if now.finished < before.finished:  # a restarted worker: its counters began again
                before = Totals()
            grown.finished += now.finished - before.finished
            grown.prompt += max(now.prompt - before.prompt, 0)
            grown.cached += max(now.cached - before.cached, 0)
            grown.generated += max(now.generated - before.generated, 0)
            self._seen[worker] = now
        for gone in set(self._seen) - set(loads):
            del self._seen[gone]
        elapsed = at - self._last_at if self._last_at is not None else self.interval_s
        self._last_at = at
        sample = Sample(
            at=at,
            ready_workers=ready_workers,
            demand=demand(grown, elapsed),
            kv_active_blocks=sum(load.kv_blocks_used for load in loads.values()),
            kv_retained_blocks=sum(session_blocks(load) for load in loads.values()),
            kv_pinned_blocks=max((load.kv_blocks_pinned for load in loads.values()), default=0),
            waiting=queued + sum(load.waiting for load in loads.values()),
        )
        earlier, self._reading = self._reading, frontend if frontend is not None else self._reading
        if frontend is None or earlier is None:
            return sample
        ttft = window_quantile(QUANTILE, earlier.ttft, frontend.ttft)
        itl = window_quantile(QUANTILE, earlier.itl, frontend.itl)
        started = frontend.session_starts - earlier.session_starts
        turns = frontend.requests / frontend.session_starts if frontend.session_starts else None
        return replace(
            sample,
            observed_ttft_s=None if ttft is None else ttft * self.time_scale,
            observed_itl_s=None if itl is None else itl * self.time_scale,
            session_rate=max(started, 0.0) / elapsed if elapsed > 0 else 0.0,
            turns_per_session=turns,
        )
