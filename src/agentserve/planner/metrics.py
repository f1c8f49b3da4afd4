"""The planner's Prometheus metrics (both loops): what it asks for, why, and what it predicted."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from agentserve.planner.decide import Decision


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "agentserve_planner"
        self.desired = Gauge(f"{p}_desired_workers", "Workers the planner asks for.", registry=registry)
        self.ready = Gauge(f"{p}_ready_workers", "Workers serving (loaded, not draining).", registry=registry)
        self.loading = Gauge(f"{p}_loading_workers", "Workers loading their model.", registry=registry)
        self.draining = Gauge(
            f"{p}_draining_workers", "Workers finishing their requests before they go.", registry=registry
        )
        self.kv_floor = Gauge(
            f"{p}_kv_floor_workers", "Workers the active and retained KV blocks need.", registry=registry
        )
        self.predicted = Gauge(
            f"{p}_predicted_seconds",
            "Predicted TTFT and ITL at the desired count.",
            ["latency"],
            registry=registry,
        )
        self.observed = Gauge(
            f"{p}_observed_seconds",
            "Observed p90 TTFT and ITL of the last interval's requests (NaN: too few).",
            ["latency"],
            registry=registry,
        )
        self.decisions = Counter(f"{p}_decisions", "Decisions by reason.", ["reason"], registry=registry)

    def export(self, decision: Decision, *, ready: int, loading: int, draining: int) -> None:
        self.desired.set(decision.desired)
        self.ready.set(ready)
        self.loading.set(loading)
        self.draining.set(draining)
        self.kv_floor.set(decision.kv_floor)
        self.predicted.labels("ttft").set(decision.predicted.ttft_s)
        self.predicted.labels("itl").set(decision.predicted.itl_s)
        nan = float("nan")
        ttft, itl = decision.observed_ttft_s, decision.observed_itl_s
        self.observed.labels("ttft").set(nan if ttft is None else ttft)
        self.observed.labels("itl").set(nan if itl is None else itl)
        self.decisions.labels(decision.reason.split(":")[0]).inc()
