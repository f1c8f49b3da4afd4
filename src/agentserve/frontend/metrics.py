"""The frontend's Prometheus metrics (a minimal set until `agentserve.telemetry` lands on main).

A private registry per app, so tests and several apps in one process each count on their own.
Labels are bounded enums only (API, status); session, request and tool ids never become labels.
Names match the telemetry layer's (`agentserve_frontend_…`), so dashboards survive the swap.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from agentserve.config import ApiName

PREFIX = "agentserve_frontend"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1800.0)


class FrontendMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            f"{PREFIX}_requests", "Requests by API and final status.", ["api", "status"], registry=r
        )
        self.inflight = Gauge(f"{PREFIX}_inflight_requests", "Requests in progress.", ["api"], registry=r)
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Time to first token.",
            ["api"],
            registry=r,
            buckets=TTFT_BUCKETS,
        )
        self.duration = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "Request duration.",
            ["api"],
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self.input_tokens = Counter(f"{PREFIX}_input_tokens", "Prompt tokens.", ["api"], registry=r)
        self.cached_tokens = Counter(
            f"{PREFIX}_cached_tokens", "Prompt tokens served from the prefix cache.", ["api"], registry=r
        )
        self.output_tokens = Counter(f"{PREFIX}_output_tokens", "Generated tokens.", ["api"], registry=r)
        self.reasoning_tokens = Counter(
            f"{PREFIX}_reasoning_tokens", "Generated reasoning tokens.", ["api"], registry=r
        )
        self.tool_calls = Counter(f"{PREFIX}_tool_calls", "Tool calls dispatched.", ["api"], registry=r)
        self.drift = Counter(
            f"{PREFIX}_prefix_drift_events",
            "Prompts that did not extend their session's previous turn (prefix cache lost from there).",
            ["api"],
            registry=r,
        )
        self.stripped = Counter(
            f"{PREFIX}_stripped_spans", "Volatile spans stripped from prompts, by rule.", ["rule"], registry=r
        )

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def started(self, api: ApiName) -> None:
        self.inflight.labels(api).inc()

    def finished(
        self,
        api: ApiName,
        status: str,
        *,
        seconds: float,
        ttft: float | None = None,
        input_tokens: int = 0,
        cached_tokens: int = 0,
        output_tokens: int = 0,
        reasoning_tokens: int = 0,
        tool_calls: int = 0,
    ) -> None:
        self.inflight.labels(api).dec()
        self.requests.labels(api, status).inc()
        self.duration.labels(api).observe(seconds)
        if ttft is not None:
            self.ttft.labels(api).observe(ttft)
        self.input_tokens.labels(api).inc(input_tokens)
        self.cached_tokens.labels(api).inc(cached_tokens)
        self.output_tokens.labels(api).inc(output_tokens)
        self.reasoning_tokens.labels(api).inc(reasoning_tokens)
        if tool_calls:
            self.tool_calls.labels(api).inc(tool_calls)
