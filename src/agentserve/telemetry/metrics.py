"""The frontend's Prometheus metrics, on a registry of its own.

A private `CollectorRegistry` (never the process-global one) so tests, and several apps in one
process, each get their own counters. Every label is a bounded enum: API, a served model name (any
other model string is `other`), status, finish reason, drift cause, strip rule (configured names,
else `other`), tool event type and status. Session, request, trajectory, worker and tool-call ids
and tool names are untrusted or unbounded and never become labels; they live in the trace records.

Names follow Dynamo's frontend set where the meaning is the same (`..._time_to_first_token_seconds`,
`..._inter_token_latency_seconds`, `..._inflight_requests`, `..._request_duration_seconds`) under the
`agentserve_frontend_` prefix. Inter-token latency is observed once per request (its mean), so a
request's weight does not grow with its length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from agentserve.config import ALL_APIS
from agentserve.prompt.strip import BILLING_RULE
from agentserve.telemetry.sink import SinkStats
from agentserve.telemetry.tool_events import ToolEventRecord
from agentserve.telemetry.trace import STATUSES, TraceRecord

PREFIX = "agentserve_frontend"
OTHER = "other"

# Agent-scale buckets: prompts of 10K-200K tokens make a cold TTFT seconds to minutes; a turn that
# writes a file can decode for minutes; tools run from milliseconds (read) to many minutes (tests).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1800.0)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
LEAD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOOL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)

ToolEventSource = Literal["http", "zmq"]

# The harness a request came from, read from where its session id came from (`AgentIdentity.source`,
# api/identity.py): a bounded enum, never the id itself.
HARNESSES = ("claude-code", "codex", "opencode", "agentserve", "other", "none")
_HARNESS_BY_SOURCE = {
    "header:x-claude-code-session-id": "claude-code",
    "header:x-claude-code-agent-id": "claude-code",
    "metadata.user_id": "claude-code",
    "header:session-id": "codex",
    "header:thread-id": "codex",
    "header:session_id": "codex",
    "prompt_cache_key": "codex",
    "header:x-session-id": "opencode",
}


# How a subagent's request was linked to its parent (`TraceRecord.parent_source`,
# frontend/subagents.py): a bounded enum.
SUBAGENT_LINKS = ("header", "nvext", "billing", "inferred", "tree", "other")


def link_of(parent_source: str | None) -> str:
    """`header`, `nvext`, `billing` (Claude Code's `cc_is_subagent`), `inferred` (a spawn call's
    prompt), `tree` (a later turn of a child linked before), `other`."""
    if parent_source is None:
        return "other"
    kind = parent_source.split(":", 1)[0].split(".", 1)[0]
    return kind if kind in SUBAGENT_LINKS else "other"


def harness_of(source: str | None) -> str:
    """`claude-code`, `codex`, `opencode`; `agentserve` for our own and Dynamo's headers and
    `nvext.agent_context` (any harness can send them); `other` for any other source (a conversation
    key); `none` without a session id."""
    if source is None:
        return "none"
    harness = _HARNESS_BY_SOURCE.get(source)
    if harness is not None:
        return harness
    if source.startswith(("header:x-agentserve-", "header:x-dynamo-", "nvext.")):
        return "agentserve"
    return "other"


class _SinkCollector(Collector):
    """Trace sink counters, read from the sink at scrape time (the sink counts on its own thread)."""

    def __init__(self, stats: Callable[[], SinkStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        family = CounterMetricFamily(
            f"{PREFIX}_trace_records",
            "Trace records by outcome (dropped: sink queue full).",
            labels=["result"],
        )
        family.add_metric(["written"], s.written)
        family.add_metric(["dropped"], s.dropped)
        family.add_metric(["error"], s.errors)
        yield family
        yield CounterMetricFamily(f"{PREFIX}_trace_rotations", "Trace file rotations.", value=s.rotations)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # names are fixed; no need to collect at registration


@dataclass(frozen=True, slots=True)
class _Series:
    """The per-(api, model) children, bound once: `.labels()` costs more than the observation."""

    duration: Histogram
    ttft: Histogram
    itl: Histogram
    queue: Histogram
    input_tokens: Counter
    cached_tokens: Counter
    output_tokens: Counter
    reasoning_tokens: Counter
    cached_ratio: Histogram
    dispatch_lead: Histogram
    inflight: Gauge


class FrontendMetrics:
    def __init__(
        self,
        models: Iterable[str],
        *,
        strip_rules: Iterable[str] = (BILLING_RULE,),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._models = frozenset(models)
        self._rules = frozenset(strip_rules)
        self._bound: dict[tuple[str, str], _Series] = {}
        r = self.registry
        am = ("api", "model")
        self.requests = Counter(
            f"{PREFIX}_requests", "Requests by API, model and final status.", [*am, "status"], registry=r
        )
        self.subagent_requests = Counter(
            f"{PREFIX}_subagent_requests",
            "Requests of subagents, by how they were linked to their parent session (docs/subagents.md).",
            ["link"],
            registry=r,
        )
        self.harness_requests = Counter(
            f"{PREFIX}_harness_requests",
            "Requests by API and the harness that sent them (from its session headers).",
            ["api", "harness"],
            registry=r,
        )
        self.inflight = Gauge(f"{PREFIX}_inflight_requests", "Requests in progress.", am, registry=r)
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Time to first token.",
            am,
            registry=r,
            buckets=TTFT_BUCKETS,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Mean inter-token latency of a request (one observation per request).",
            am,
            registry=r,
            buckets=ITL_BUCKETS,
        )
        self.duration = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "Request duration.",
            am,
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self.queue = Histogram(
            f"{PREFIX}_queue_time_seconds",
            "Time from arrival to prefill start (render, tokenize, routing and queueing).",
            am,
            registry=r,
            buckets=QUEUE_BUCKETS,
        )
        self.input_tokens = Counter(f"{PREFIX}_input_tokens", "Prompt tokens.", am, registry=r)
        self.cached_tokens = Counter(
            f"{PREFIX}_cached_tokens", "Prompt tokens served from the prefix cache.", am, registry=r
        )
        self.output_tokens = Counter(f"{PREFIX}_output_tokens", "Generated tokens.", am, registry=r)
        self.reasoning_tokens = Counter(
            f"{PREFIX}_reasoning_tokens", "Generated reasoning tokens.", am, registry=r
        )
        # A returning turn: its session had a turn before (the drift detector compared the two). Its
        # prompt should extend that turn, so its cache hit share should be high; a new volatile span
        # in the prompt makes it collapse (alert AgentServeCacheHitShareCollapsed).
        self.returning_input_tokens = Counter(
            f"{PREFIX}_returning_input_tokens",
            "Prompt tokens of returning turns (a session's second turn on).",
            am,
            registry=r,
        )
        # Requests whose session had no turn before (a new conversation): with the requests counter,
        # the planner's sessions per second and turns per session.
        self.session_starts = Counter(
            f"{PREFIX}_session_starts", "Requests that start a session (no turn before).", am, registry=r
        )
        self.returning_cached_tokens = Counter(
            f"{PREFIX}_returning_cached_tokens",
            "Prompt tokens of returning turns served from the prefix cache.",
            am,
            registry=r,
        )
        self.cached_ratio = Histogram(
            f"{PREFIX}_cached_token_ratio",
            "Per request: cached / input tokens (the fleet ratio is rate(cached) / rate(input)).",
            am,
            registry=r,
            buckets=RATIO_BUCKETS,
        )
        self.tool_calls = Counter(
            f"{PREFIX}_tool_calls", "Tool calls in model output by outcome.", [*am, "status"], registry=r
        )
        self.dispatch_lead = Histogram(
            f"{PREFIX}_tool_dispatch_lead_time_seconds",
            "Time from a tool call's dispatch to the end of its turn (what streaming dispatch saves).",
            am,
            registry=r,
            buckets=LEAD_BUCKETS,
        )
        self.drift = Counter(
            f"{PREFIX}_prefix_drift_events",
            "Prompts that did not extend their session's previous turn, by cause.",
            ["model", "cause"],
            registry=r,
        )
        self.stripped = Counter(
            f"{PREFIX}_stripped_spans", "Volatile spans stripped from prompts, by rule.", ["rule"], registry=r
        )
        self.tool_events = Counter(
            f"{PREFIX}_tool_events", "Harness tool events accepted.", ["event_type", "status"], registry=r
        )
        self.tool_events_joined = Counter(
            f"{PREFIX}_tool_events_joined",
            "Harness tool events joined to the request that dispatched the call.",
            registry=r,
        )
        self.tool_events_rejected = Counter(
            f"{PREFIX}_tool_events_rejected",
            "Harness tool events that failed validation.",
            ["source"],
            registry=r,
        )
        self.tool_duration = Histogram(
            f"{PREFIX}_tool_duration_seconds",
            "Harness-reported tool execution time.",
            ["status"],
            registry=r,
            buckets=TOOL_BUCKETS,
        )

    # ------------------------------------------------------------------ labels

    def _labels(self, api: str, model: str) -> tuple[str, str]:
        if api not in ALL_APIS:
            raise ValueError(f"unknown api {api!r}")  # a programming error: APIs are route constants
        return api, model if model in self._models else OTHER

    def _rule(self, rule: str) -> str:
        return rule if rule in self._rules else OTHER

    # ------------------------------------------------------------------ observations

    def request_started(self, api: str, model: str) -> None:
        self._series(api, model).inflight.inc()

    def _series(self, api: str, model: str) -> _Series:
        key = self._labels(api, model)
        series = self._bound.get(key)
        if series is None:  # label values are bounded, so this cache is too
            a, m = key
            series = _Series(
                duration=self.duration.labels(a, m),
                ttft=self.ttft.labels(a, m),
                itl=self.itl.labels(a, m),
                queue=self.queue.labels(a, m),
                input_tokens=self.input_tokens.labels(a, m),
                cached_tokens=self.cached_tokens.labels(a, m),
                output_tokens=self.output_tokens.labels(a, m),
                reasoning_tokens=self.reasoning_tokens.labels(a, m),
                cached_ratio=self.cached_ratio.labels(a, m),
                dispatch_lead=self.dispatch_lead.labels(a, m),
                inflight=self.inflight.labels(a, m),
            )
            self._bound[key] = series
        return series

    def request_finished(self, record: TraceRecord, *, was_started: bool = True) -> None:
        """Everything a finished request contributes (`was_started`: it was counted in flight)."""
        api, model = self._labels(record.api, record.model)
        if record.status not in STATUSES:
            raise ValueError(f"unknown status {record.status!r}")
        s = self._series(api, model)
        if was_started:
            s.inflight.dec()
        self.requests.labels(api, model, record.status).inc()
        self.harness_requests.labels(api, harness_of(record.identity_source)).inc()
        if record.parent_session_id is not None:
            self.subagent_requests.labels(link_of(record.parent_source)).inc()
        s.duration.observe(record.total_ms / 1000.0)
        if record.ttft_ms is not None:
            s.ttft.observe(record.ttft_ms / 1000.0)
        if record.avg_itl_ms is not None:
            s.itl.observe(record.avg_itl_ms / 1000.0)
        if record.prefill_wait_ms is not None:
            s.queue.observe(record.prefill_wait_ms / 1000.0)
        s.input_tokens.inc(record.input_tokens)
        s.cached_tokens.inc(record.cached_tokens)
        s.output_tokens.inc(record.output_tokens)
        s.reasoning_tokens.inc(record.reasoning_tokens)
        if record.drift is None:
            self.session_starts.labels(api, model).inc()
        if record.drift is not None:  # a returning turn
            self.returning_input_tokens.labels(api, model).inc(record.input_tokens)
            self.returning_cached_tokens.labels(api, model).inc(record.cached_tokens)
        if record.input_tokens > 0:
            s.cached_ratio.observe(min(1.0, record.cached_tokens / record.input_tokens))
        for call in record.tool_calls:
            self.tool_calls.labels(api, model, call.status).inc()
            if call.lead_ms is not None:
                s.dispatch_lead.observe(call.lead_ms / 1000.0)
        if record.drift is not None and record.drift.cause != "none":
            self.drift.labels(model, record.drift.cause).inc()
        for rule, count in record.stripped.items():
            self.stripped.labels(self._rule(rule)).inc(count)

    def tool_event(self, record: ToolEventRecord) -> None:
        e = record.event
        self.tool_events.labels(e.event_type, e.status).inc()
        if record.dispatch is not None:
            self.tool_events_joined.inc()
        if e.terminal and e.duration_ms is not None:
            self.tool_duration.labels(e.status).observe(e.duration_ms / 1000.0)

    def tool_event_rejected(self, source: ToolEventSource) -> None:
        self.tool_events_rejected.labels(source).inc()

    def watch_sink(self, stats: Callable[[], SinkStats]) -> None:
        """Expose a trace sink's written/dropped/error counts (read at scrape time)."""
        self.registry.register(_SinkCollector(stats))

    def exposition(self) -> tuple[bytes, str]:
        """The `/metrics` body and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
