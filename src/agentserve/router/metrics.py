"""The router's Prometheus metrics: decisions, overlap, queue, index, ingestion, workers.

Per-decision values are histograms observed on the route path; state (index size, queue depth,
ingestion counters, per-worker load) is read from the core and the fleet at scrape time, so the
route path pays only for the histograms. Names start with `agentserve_router_`; the embedded
router registers the same collector in the frontend's registry.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentserve.router.core import RouterCore
from agentserve.router.ingest import Fleet, State
from agentserve.router.placement import Decision

P = "agentserve_router_"
_BLOCK_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0)
_DECISION_BUCKETS = (10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3)


class EventRate:
    """KV events (and block events) per second over the last sampling interval."""

    def __init__(self) -> None:
        self.events_per_s = 0.0
        self.blocks_per_s = 0.0
        self._last: tuple[float, int, int] | None = None

    def sample(self, now: float, events: int, blocks: int) -> None:
        if self._last is not None and now > self._last[0]:
            dt = now - self._last[0]
            self.events_per_s = (events - self._last[1]) / dt
            self.blocks_per_s = (blocks - self._last[2]) / dt
        self._last = (now, events, blocks)


class RouterMetrics:
    def __init__(self, core: RouterCore, fleet: Fleet, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rate = EventRate()
        self.decisions = Counter(P + "decisions", "Routing decisions", ["policy"], registry=r)
        self.route_errors = Counter(
            P + "route_errors", "Requests the router could not place", ["type"], registry=r
        )

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(P + name, doc, buckets=buckets, registry=r)

        self.overlap_blocks = histogram(
            "overlap_blocks", "Prompt blocks cached on the chosen worker", _BLOCK_BUCKETS
        )
        self.overlap_ratio = histogram(
            "overlap_ratio", "Share of the prompt's blocks cached on the chosen worker", _RATIO_BUCKETS
        )
        self.queue_wait = histogram(
            "queue_wait_seconds",
            "Time requests waited in the priority queue (all workers saturated)",
            _WAIT_BUCKETS,
        )
        self.decision_seconds = histogram(
            "decision_seconds",
            "Time to place one request (index lookup + cost), queue wait excluded",
            _DECISION_BUCKETS,
        )
        r.register(_StateCollector(core, fleet, self.rate))

    def observe(self, decision: Decision, decide_s: float, wait_s: float | None) -> None:
        self.decisions.labels(decision.policy).inc()
        self.overlap_blocks.observe(decision.overlap_blocks)
        if decision.prompt_blocks:
            self.overlap_ratio.observe(decision.overlap_blocks / decision.prompt_blocks)
        self.decision_seconds.observe(decide_s)
        self.queue_wait.observe(wait_s or 0.0)


def prefill_decisions(core: RouterCore) -> CounterMetricFamily:
    """`agentserve_router_prefill_decisions_total{where="local|remote"}`: where prompts were
    prefilled once prefill workers exist (router/disagg.py)."""
    family = CounterMetricFamily(
        P + "prefill_decisions",
        "Prefill decisions: on the decode worker (local) or on a prefill worker (remote)",
        labels=["where"],
    )
    for where, count in sorted(core.prefill_decisions.items()):
        family.add_metric([where], count)
    return family


class PrefillDecisionsCollector(Collector):
    """The prefill decisions counter of an embedded router (`agentserve up --prefill-workers`)."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core

    def collect(self) -> Iterator[Metric]:
        yield prefill_decisions(self.core)


class _StateCollector(Collector):
    def __init__(self, core: RouterCore, fleet: Fleet, rate: EventRate) -> None:
        self.core = core
        self.fleet = fleet
        self.rate = rate

    def collect(self) -> Iterator[Metric]:
        core, fleet, c = self.core, self.fleet, self.fleet.counters
        stats = core.stats()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(P + name, doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(P + name, doc, value=value)

        yield gauge("queue_depth", "Requests waiting for a worker with room", stats.queued)
        yield gauge("index_blocks", "Distinct KV block hashes indexed", stats.index.blocks)
        yield gauge(
            "index_entries", "(worker, block) pairs indexed (memory is bounded by this)", stats.index.entries
        )
        yield counter(
            "index_dropped_blocks", "Stored blocks refused because the index was full", stats.index.dropped
        )
        yield counter("kv_messages", "KV event messages received (heartbeats included)", c.messages)
        yield counter("kv_events", "KV events applied to the index", c.events)
        yield counter("kv_block_events", "Block hashes stored or removed by applied events", c.blocks)
        yield gauge(
            "kv_events_per_second", "KV events applied per second (last interval)", self.rate.events_per_s
        )
        yield gauge(
            "kv_block_events_per_second",
            "Block hashes applied per second (last interval)",
            self.rate.blocks_per_s,
        )
        yield counter("resyncs", "Workers resynced from their KV snapshot", c.resyncs)
        yield counter("kv_gaps", "Lost KV events detected (each leads to a resync)", c.gaps)
        yield counter("kv_stale_events", "KV events already covered by a snapshot", c.stale)
        yield counter("kv_restarts", "Worker engine restarts seen in the KV events", c.restarts)
        removals = CounterMetricFamily(
            P + "worker_removals", "Workers removed from routing", labels=["reason"]
        )
        for reason, count in sorted(fleet.removals.items()):
            removals.add_metric([reason], count)
        yield removals
        yield prefill_decisions(core)
        states = GaugeMetricFamily(P + "workers", "Known workers by state", labels=["state"])
        members = fleet.members()
        for state in State:
            states.add_metric([state.value], sum(1 for m in members if m.state is state))
        yield states
        inflight = GaugeMetricFamily(
            P + "worker_inflight_requests", "Requests routed and not finished", labels=["worker"]
        )
        load = GaugeMetricFamily(
            P + "worker_load_blocks",
            "Blocks in-flight requests occupy (prompt + expected output)",
            labels=["worker"],
        )
        cached = GaugeMetricFamily(
            P + "worker_cached_blocks", "KV blocks the worker reports holding", labels=["worker"]
        )
        placement = core.placement
        for worker in core.workers:
            inflight.add_metric([worker], placement.inflight(worker))
            load.add_metric([worker], placement.load(worker))
            cached.add_metric([worker], core.held_count(worker))
        yield inflight
        yield load
        yield cached
