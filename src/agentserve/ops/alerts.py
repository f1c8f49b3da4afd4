"""Prometheus alert rules for agent serving (`agentserve alerts`; the chart ships them as a PrometheusRule).

Each alert has a runbook section in docs/operations.md (the `runbook` annotation names it), a
promtool unit test that fires it and one that keeps it quiet (tests/ops/alerts_test.yaml), and names
only series and labels the code exports (tests/unit/ops). Alerts group by the ServiceMonitor's
`namespace` and `deployment` labels, so one firing names one AgentServingDeployment.

SLO burn follows the multi-window, multi-burn-rate recipe: a fast burn (14.4× the budget over 1 h and
5 m: 2 % of a 30-day budget in an hour) pages, a slow one (6× over 6 h and 30 m) opens a ticket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from agentserve.ops.slo import ITL, TTFT, SloTarget

GROUP = "agentserve"
BY = "namespace, deployment"
RUNBOOK = "docs/operations.md#"


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def anchor(self) -> str:
        return self.name.lower()

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, **self.labels},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook": RUNBOOK + self.anchor,
            },
        }


def _slow_share(slo: SloTarget, window: str) -> str:
    """Share of requests over the target in `window`, per deployment."""
    total = f"sum by ({BY}) (rate({slo.histogram}_count[{window}]))"
    good = f'sum by ({BY}) (rate({slo.histogram}_bucket{{le=~"{slo.le_regex}"}}[{window}]))'
    return f"(1 - {good} / {total})"


def _burn(slo: SloTarget, factor: float, long: str, short: str) -> str:
    threshold = f"{factor * slo.budget:g}"
    return f"{_slow_share(slo, long)} > {threshold}\nand\n{_slow_share(slo, short)} > {threshold}"


def _burn_alerts(slo: SloTarget) -> list[Alert]:
    what = f"{slo.name} over {slo.target_s * 1000:g} ms"
    goal = f"{slo.objective * 100:g}% of requests within {slo.target_s * 1000:g} ms"
    return [
        Alert(
            f"AgentServe{slo.name}BudgetBurnFast",
            _burn(slo, 14.4, "1h", "5m"),
            "2m",
            "critical",
            f"{{{{ $labels.deployment }}}}: {what} burns the {slo.name} error budget 14x too fast",
            f"More than {14.4 * slo.budget * 100:g}% of requests in the last hour (and 5 minutes) had "
            f"{what}; the objective is {goal}.",
        ),
        Alert(
            f"AgentServe{slo.name}BudgetBurnSlow",
            _burn(slo, 6, "6h", "30m"),
            "15m",
            "warning",
            f"{{{{ $labels.deployment }}}}: {what} burns the {slo.name} error budget 6x too fast",
            f"More than {6 * slo.budget * 100:g}% of requests in the last 6 hours (and 30 minutes) had "
            f"{what}; the objective is {goal}.",
        ),
    ]


ALERTS: tuple[Alert, ...] = (
    *_burn_alerts(TTFT),
    *_burn_alerts(ITL),
    Alert(
        "AgentServeWorkersSaturated",
        f"sum by ({BY}) (agentserve_router_queue_depth) > 0\n"
        f"and\nmin by ({BY}) (agentserve_worker_kv_usage_ratio) > 0.9",
        "10m",
        "warning",
        "{{ $labels.deployment }}: every worker is full and requests queue in the router",
        "Requests have waited in the router's priority queue for 10 minutes while every worker's KV "
        "cache was over 90% used.",
    ),
    Alert(
        "AgentServeCacheHitShareCollapsed",
        f"sum by ({BY}) (rate(agentserve_frontend_returning_cached_tokens_total[15m]))\n"
        f"/ sum by ({BY}) (rate(agentserve_frontend_returning_input_tokens_total[15m]))\n< 0.5",
        "15m",
        "warning",
        "{{ $labels.deployment }}: returning turns hit the prefix cache for only "
        "{{ $value | humanizePercentage }} of their prompt",
        "A session's next turn should extend its last one, so most of its prompt is cached. Below 50% "
        "for 15 minutes, something changes every prompt early on: most often a new volatile span "
        "(a timestamp, a per-request id) that poisons every prefix.",
    ),
    Alert(
        "AgentServeStateStoreDown",
        f"min by ({BY}, pod) (agentserve_state_up) == 0",
        "1m",
        "critical",
        "{{ $labels.deployment }}: the shared state store does not answer {{ $labels.pod }}",
        "The frontend cannot reach its Redis/Valkey state store: previous_response_id chains answer "
        "503 and remembered turns are lost, so replay falls back and prefixes are recomputed.",
    ),
    Alert(
        "AgentServeMigrationStorm",
        f"sum by ({BY}) (increase(agentserve_stream_migrations_total[10m])) > 20",
        "5m",
        "warning",
        "{{ $labels.deployment }}: {{ $value | humanize }} streams migrated in 10 minutes",
        "Streams keep moving to another worker after theirs died mid-stream. Clients see nothing, but "
        "each migration re-sends the prompt and the tokens so far, and workers are dying.",
    ),
    Alert(
        "AgentServeWorkerRestarts",
        f"sum by ({BY}) (increase(agentserve_router_worker_removals_total[30m])) > 3\n"
        f"or\nsum by ({BY}) (increase(agentserve_router_kv_restarts_total[30m])) > 3",
        "0m",
        "warning",
        "{{ $labels.deployment }}: workers keep leaving or restarting "
        "({{ $value | humanize }} in 30 minutes)",
        "The router removed workers from routing, or saw their engines restart, more than 3 times in "
        "30 minutes. Each loses that worker's KV cache and moves its streams.",
    ),
    Alert(
        "AgentServePlannerAtMaximum",
        f'sum by ({BY}) (rate(agentserve_planner_decisions_total{{reason="max"}}[15m]))\n'
        f"/ sum by ({BY}) (rate(agentserve_planner_decisions_total[15m]))\n> 0.5",
        "15m",
        "warning",
        "{{ $labels.deployment }}: the planner cannot meet the latency targets even at maxWorkers",
        "For 15 minutes most of the planner's decisions predicted TTFT or ITL over target at "
        "autoscaling.maxWorkers: the load needs more workers than the spec allows (or the profile "
        "underestimates the engine).",
    ),
    Alert(
        "AgentServeOperatorReconcileErrors",
        'sum by (namespace, pod) (increase(agentserve_operator_syncs_total{result!="ok"}[15m])) > 0',
        "15m",
        "warning",
        "the agentserve operator {{ $labels.pod }} fails to reconcile",
        "Reconciles of AgentServingDeployments have failed for 15 minutes: spec changes do not reach "
        "the Deployments, and the failure is in the CR's Ready condition.",
    ),
)


def groups() -> list[dict[str, Any]]:
    return [{"name": GROUP, "rules": [a.rule() for a in ALERTS]}]


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    """The plain Prometheus rules file (`rule_files:`), as shipped in the chart's files."""
    header = (
        "# Generated by `agentserve alerts` (src/agentserve/ops/alerts.py); runbooks: docs/operations.md\n"
    )
    return header + yaml.dump({"groups": groups()}, Dumper=_Dumper, sort_keys=False, width=200)
