"""The Grafana dashboard for agent serving (`agentserve dashboard`; the chart ships it as a ConfigMap).

Each panel answers a question an agent platform asks — are returning turns hitting the cache, is the
billing preamble still stripped, are tool calls dispatched before the stream ends, are sessions losing
their prefix, is the state store up, how often do streams migrate — with PromQL over the series the
code exports (`agentserve.ops.catalog`; tests/unit/ops checks every name and label, tests/ops evaluates
every panel with promtool over a real scrape). Every selector filters on the dashboard's variables
`namespace` and `deployment` (the ServiceMonitor's labels, `agentserve.operator.build.SCRAPE_TARGET_LABELS`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentserve.ops.slo import ITL, TTFT, SloTarget

UID = "agentserve-agents"
TITLE = "agentserve: agent serving"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
SELECTOR = 'namespace=~"$namespace", deployment=~"$deployment"'


def sel(metric: str, matchers: str = "") -> str:
    """`metric{namespace=~"$namespace", deployment=~"$deployment"[, matchers]}`."""
    return f"{metric}{{{SELECTOR}{', ' + matchers if matchers else ''}}}"


def rate(metric: str, matchers: str = "", by: str = "") -> str:
    inner = f"rate({sel(metric, matchers)}[{RATE}])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def quantile(q: float, histogram: str, by: str = "") -> str:
    labels = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({labels}) (rate({sel(histogram + '_bucket')}[{RATE}])))"


def ratio(numerator: str, denominator: str, by: str = "") -> str:
    return f"{rate(numerator, by=by)} / {rate(denominator, by=by)}"


def within_target(slo: SloTarget) -> str:
    """Share of requests whose latency was within the target (the bucket at the target)."""
    good = rate(slo.histogram + "_bucket", f'le=~"{slo.le_regex}"')
    return f"{good} / {rate(slo.histogram + '_count')}"


@dataclass(frozen=True, slots=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    description: str
    targets: Sequence[Target]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    threshold: float | None = None  # a red line at the target (latency panels)
    max: float | None = None
    stack: bool = False


@dataclass(frozen=True, slots=True)
class Row:
    title: str
    panels: Sequence[Panel] = field(default_factory=tuple)


def _latency_panel(slo: SloTarget, title: str, description: str) -> Panel:
    return Panel(
        title,
        description
        + f" The red line is the target ({slo.target_s * 1000:g} ms at p{slo.objective * 100:g}).",
        [Target(quantile(q, slo.histogram), f"p{round(q * 100)}") for q in (0.5, 0.95, 0.99)],
        unit="s",
        threshold=slo.target_s,
    )


F = "agentserve_frontend_"
W = "agentserve_worker_"
R = "agentserve_router_"
S = "agentserve_state_"
P = "agentserve_planner_"

ROWS: tuple[Row, ...] = (
    Row(
        "Traffic",
        (
            Panel(
                "Requests by API",
                "Requests per second by API (Anthropic Messages, Chat Completions, Responses).",
                [Target(rate(F + "requests_total", by="api"), "{{api}}")],
                unit="reqps",
            ),
            Panel(
                "Requests by harness",
                "Requests per second by the harness that sent them, told by its session headers "
                "(none: no session id, so no cache affinity either).",
                [Target(rate(F + "harness_requests_total", by="harness"), "{{harness}}")],
                unit="reqps",
            ),
            Panel(
                "Errors by API and status",
                "Requests answered with an error (client_error: the caller's; server_error, error: ours).",
                [
                    Target(
                        rate(
                            F + "requests_total", 'status=~"client_error|server_error|error"', "api, status"
                        ),
                        "{{api}} {{status}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Tokens",
                "Prompt, cached prompt, output and reasoning tokens per second.",
                [
                    Target(rate(F + "input_tokens_total"), "prompt"),
                    Target(rate(F + "cached_tokens_total"), "cached"),
                    Target(rate(F + "output_tokens_total"), "output"),
                    Target(rate(F + "reasoning_tokens_total"), "reasoning"),
                ],
                unit="short",
            ),
            Panel(
                "Requests in flight",
                "Requests being served now, by API.",
                [Target(f"sum by (api) ({sel(F + 'inflight_requests')})", "{{api}}")],
            ),
            Panel(
                "Targets up",
                "Scrape targets answering, by component.",
                [Target(f"sum by (component) ({sel('up')})", "{{component}}")],
            ),
        ),
    ),
    Row(
        "Latency against the targets",
        (
            _latency_panel(TTFT, "Time to first token", "Arrival to the first token, all APIs."),
            _latency_panel(ITL, "Inter-token latency", "Mean inter-token latency per request."),
            Panel(
                "Requests within target",
                "Share of requests within the TTFT and ITL targets (the SLOs the burn alerts watch).",
                [Target(within_target(TTFT), "TTFT"), Target(within_target(ITL), "ITL")],
                unit="percentunit",
                max=1.0,
            ),
            Panel(
                "Queueing",
                "p95 of arrival → prefill start (frontend) and of the wait in the router's priority queue "
                "(all workers at their in-flight limit).",
                [
                    Target(quantile(0.95, F + "queue_time_seconds"), "frontend p95"),
                    Target(quantile(0.95, R + "queue_wait_seconds"), "router queue p95"),
                ],
                unit="s",
            ),
        ),
    ),
    Row(
        "Prefix cache and drift",
        (
            Panel(
                "Cache hit share of returning turns",
                "Prompt tokens served from the KV cache, of turns whose session had a turn before: "
                "near 1 when every turn extends the last. A fall means a prefix is being lost (see drift).",
                [
                    Target(
                        ratio(F + "returning_cached_tokens_total", F + "returning_input_tokens_total"),
                        "returning",
                    ),
                    Target(ratio(F + "cached_tokens_total", F + "input_tokens_total"), "all requests"),
                ],
                unit="percentunit",
                max=1.0,
            ),
            Panel(
                "Prefix drift events by cause",
                "Prompts that did not extend their session's previous turn: history (a volatile span or "
                "compaction), output (replay re-rendered the answer), rewound (retry), reset, unknown.",
                [Target(rate(F + "prefix_drift_events_total", by="cause"), "{{cause}}")],
                unit="short",
            ),
            Panel(
                "Volatile spans stripped",
                "Spans stripped before hashing, by rule (anthropic_billing: Claude Code's billing line). "
                "Zero while Claude Code traffic flows means the preamble changed shape.",
                [Target(rate(F + "stripped_spans_total", by="rule"), "{{rule}}")],
                unit="short",
            ),
            Panel(
                "Router overlap",
                "Median share of a prompt's blocks cached on the worker the router chose.",
                [Target(quantile(0.5, R + "overlap_ratio"), "p50")],
                unit="percentunit",
                max=1.0,
            ),
        ),
    ),
    Row(
        "Tool calls",
        (
            Panel(
                "Tool dispatch lead time",
                "How long before the end of its turn each tool call was dispatched (what streaming "
                "dispatch gives the harness).",
                [
                    Target(quantile(0.5, F + "tool_dispatch_lead_time_seconds"), "p50"),
                    Target(quantile(0.95, F + "tool_dispatch_lead_time_seconds"), "p95"),
                ],
                unit="s",
            ),
            Panel(
                "Tool calls by outcome",
                "Tool calls in model output: dispatched, truncated, malformed, incomplete.",
                [Target(rate(F + "tool_calls_total", by="status"), "{{status}}")],
                unit="short",
            ),
        ),
    ),
    Row(
        "KV cache",
        (
            Panel(
                "KV blocks: active, retained, host tier",
                "Per worker: blocks running requests use, free blocks still holding a reusable prefix "
                "(retained sessions), and blocks in the host (CPU) tier.",
                [
                    Target(f"sum by (pod) ({sel(W + 'kv_blocks_used')})", "{{pod}} active"),
                    Target(f"sum by (pod) ({sel(W + 'kv_blocks_cached')})", "{{pod}} retained"),
                    Target(f"sum by (pod) ({sel(W + 'kv_host_blocks_used')})", "{{pod}} host"),
                ],
            ),
            Panel(
                "KV capacity",
                "GPU and host-tier blocks per worker.",
                [
                    Target(f"sum by (pod) ({sel(W + 'kv_blocks_capacity')})", "{{pod}} GPU"),
                    Target(f"sum by (pod) ({sel(W + 'kv_host_blocks_capacity')})", "{{pod}} host"),
                ],
            ),
            Panel(
                "Worker prefix cache hit rate",
                "Cached prompt tokens / prompt tokens, per worker.",
                [
                    Target(
                        ratio(W + "cached_prompt_tokens_total", W + "prompt_tokens_total", "pod"), "{{pod}}"
                    )
                ],
                unit="percentunit",
                max=1.0,
            ),
        ),
    ),
    Row(
        "Workers: queue and saturation",
        (
            Panel(
                "Running and waiting requests",
                "Per worker: requests in the running batch and waiting for admission.",
                [
                    Target(f"sum by (pod) ({sel(W + 'requests_running')})", "{{pod}} running"),
                    Target(f"sum by (pod) ({sel(W + 'requests_waiting')})", "{{pod}} waiting"),
                ],
            ),
            Panel(
                "KV usage",
                "Used KV blocks / total, per worker: near 1 the worker preempts and the router queues.",
                [Target(f"max by (pod) ({sel(W + 'kv_usage_ratio')})", "{{pod}}")],
                unit="percentunit",
                max=1.0,
            ),
            Panel(
                "Router queue and in-flight per worker",
                "Requests waiting in the router's priority queue, and routed requests per worker.",
                [
                    Target(f"sum({sel(R + 'queue_depth')})", "queued"),
                    Target(f"sum by (worker) ({sel(R + 'worker_inflight_requests')})", "{{worker}}"),
                ],
            ),
            Panel(
                "Output tokens per second",
                "Generated tokens per second, per worker.",
                [Target(rate(W + "generation_tokens_total", by="pod"), "{{pod}}")],
            ),
            Panel(
                "Preemptions",
                "Requests preempted for KV space, per worker.",
                [Target(rate(W + "preemptions_total", by="pod"), "{{pod}}")],
            ),
            Panel(
                "Constrained requests",
                "Requests per second with a constraint (tool_choice, strict tools, an output schema), "
                "per worker.",
                [Target(rate(W + "constrained_requests_total", by="pod"), "{{pod}}")],
            ),
            Panel(
                "Constraint CPU share",
                "The share of each worker's CPU its constraints took (grammar compiles and steering under "
                "the mask; sim workers: TensorRT-LLM's guided decoding runs inside its executor).",
                [
                    Target(
                        ratio(W + "constraint_cpu_seconds_total", "process_cpu_seconds_total", by="pod"),
                        "{{pod}}",
                    )
                ],
                unit="percentunit",
            ),
        ),
    ),
    Row(
        "Failover",
        (
            Panel(
                "Stream migrations",
                "Streams moved to another worker after theirs died mid-stream (the client sees nothing).",
                [Target(rate("agentserve_stream_migrations_total"), "migrations")],
            ),
            Panel(
                "Worker removals and engine restarts",
                "Workers the router removed from routing, by reason, and engine restarts seen in KV events.",
                [
                    Target(
                        f"sum by (reason) (increase({sel(R + 'worker_removals_total')}[{RATE}]))",
                        "removed: {{reason}}",
                    ),
                    Target(f"sum(increase({sel(R + 'kv_restarts_total')}[{RATE}]))", "engine restarts"),
                ],
            ),
            Panel(
                "Workers by state",
                "Workers the router knows, by state.",
                [Target(f"max by (state) ({sel(R + 'workers')})", "{{state}}")],
            ),
        ),
    ),
    Row(
        "Planner",
        (
            Panel(
                "Workers: desired, ready, loading",
                "The worker count the planner asks for (spec.workers.replicas through the scale "
                "subresource), the workers serving, and those still loading their model.",
                [
                    Target(f"max({sel(P + 'desired_workers')})", "desired"),
                    Target(f"max({sel(P + 'ready_workers')})", "ready"),
                    Target(f"max({sel(P + 'loading_workers')})", "loading"),
                    Target(f"max({sel(P + 'kv_floor_workers')})", "KV floor"),
                ],
            ),
            Panel(
                "TTFT and ITL: predicted vs observed",
                "What the planner predicts at the count it asked for, against the p90 the frontends "
                "observed over its last interval (a gap is the correction it applies).",
                [
                    Target(f"max by (latency) ({sel(P + 'predicted_seconds')})", "predicted {{latency}}"),
                    Target(f"max by (latency) ({sel(P + 'observed_seconds')})", "observed {{latency}}"),
                ],
                unit="s",
            ),
            Panel(
                "Decisions by reason",
                "Why the planner chose its count: min, kv (retained sessions), targets, max (targets "
                "unmet at maxWorkers), queue, hold (scale-down delay), down.",
                [Target(rate(P + "decisions_total", by="reason"), "{{reason}}")],
            ),
        ),
    ),
    Row(
        "State store",
        (
            Panel(
                "State store up",
                "1 while each frontend's shared store answers (0: stored responses and remembered turns "
                "are unavailable; previous_response_id answers 503).",
                [Target(f"min by (pod) ({sel(S + 'up')})", "{{pod}}")],
                kind="stat",
            ),
            Panel(
                "State store round trip",
                "p95 round trip per operation.",
                [Target(quantile(0.95, S + "op_seconds", by="op"), "{{op}}")],
                unit="s",
            ),
            Panel(
                "State store lookups",
                "Lookups per second by kind and result (a miss on a previous_response_id is a 404).",
                [Target(rate(S + "lookups_total", by="kind, result"), "{{kind}} {{result}}")],
            ),
        ),
    ),
)


def panels() -> Iterator[Panel]:
    for row in ROWS:
        yield from row.panels


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.max is not None:
        defaults["min"] = 0
        defaults["max"] = panel.max
    if panel.threshold is not None:
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}, {"color": "red", "value": panel.threshold}],
        }
        defaults["custom"] = {"thresholdsStyle": {"mode": "line"}}
    if panel.kind == "stat":
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}],
        }
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": t.expr, "legendFormat": t.legend, "datasource": DATASOURCE}
            for i, t in enumerate(panel.targets)
        ],
    }


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-query"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "current": {},
        "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    out: list[dict[str, Any]] = []
    y = 0
    next_id = 1
    for row in ROWS:
        out.append(
            {
                "id": next_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id += 1
        y += 1
        for i, panel in enumerate(row.panels):
            x = (i % 3) * 8
            if i and i % 3 == 0:
                y += 8
            out.append(_panel_json(panel, next_id, x, y))
            next_id += 1
        y += 8
    variables = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
        },
        _variable("namespace", "Namespace", "label_values(agentserve_frontend_requests_total, namespace)"),
        _variable(
            "deployment",
            "Deployment",
            'label_values(agentserve_frontend_requests_total{namespace=~"$namespace"}, deployment)',
        ),
    ]
    return {
        "uid": UID,
        "title": TITLE,
        "description": "Agent serving with agentserve: traffic, latency against targets, prefix cache and "
        "drift, tool dispatch, KV, saturation, failover, state store (docs/operations.md).",
        "tags": ["agentserve"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "graphTooltip": 1,
        "templating": {"list": variables},
        "annotations": {"list": []},
        "panels": out,
    }


def render() -> str:
    """The dashboard JSON as the chart ships it (stable key order, trailing newline)."""
    return json.dumps(dashboard(), indent=2) + "\n"
