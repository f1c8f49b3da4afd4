"""The alert rules, checked and unit-tested by the real promtool: `check rules` on the shipped rules file,
and `test rules` with, for every alert, series that fire it (labels and expanded annotations
compared) and series that keep it quiet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from promtool_runner import ROOT, Promtool

from agentserve.ops.alerts import ALERTS, Alert

RULES = ROOT / "charts" / "agentserve" / "files" / "agentserve-rules.yaml"
AT = {"namespace": "agents", "deployment": "coder"}
SEL = 'namespace="agents", deployment="coder"'
FRONTEND = f'{SEL}, component="frontend", pod="coder-frontend-0"'
ROUTER = f'{SEL}, component="router", pod="coder-router-0"'
TTFT = "agentserve_frontend_time_to_first_token_seconds"
ITL = "agentserve_frontend_inter_token_latency_seconds"


@dataclass(frozen=True)
class Case:
    alert: str
    series: dict[str, str]  # series → promtool values notation
    eval_time: str
    fires: list[dict[str, str]]  # expected alerts' labels besides severity and alertname ([]: quiet)
    summary: str = ""
    interval: str = "1m"


def latency(
    histogram: str, le: str, good_per_min: int, minutes: int, api: str = "anthropic"
) -> dict[str, str]:
    labels = f'{FRONTEND}, api="{api}", model="coder"'
    return {
        f'{histogram}_bucket{{{labels}, le="{le}"}}': f"0+{good_per_min}x{minutes}",
        f'{histogram}_bucket{{{labels}, le="+Inf"}}': f"0+100x{minutes}",
        f"{histogram}_count{{{labels}}}": f"0+100x{minutes}",
    }


def burn(name: str, histogram: str, le: str, what: str) -> list[Case]:
    fast, slow = f"AgentServe{name}BudgetBurnFast", f"AgentServe{name}BudgetBurnSlow"
    return [
        # 90% of requests over target for an hour: the fast burn pages.
        Case(
            fast,
            latency(histogram, le, 10, 70),
            "65m",
            [AT],
            f"coder: {what} burns the {name} error budget 14x too fast",
        ),
        # 1% over target: within the budget.
        Case(fast, latency(histogram, le, 99, 70), "65m", []),
        # 40% over target for 7 hours: too little for the fast burn (72%), enough for the slow one (30%).
        Case(fast, latency(histogram, le, 60, 450), "7h", []),
        Case(
            slow,
            latency(histogram, le, 60, 450),
            "7h",
            [AT],
            f"coder: {what} burns the {name} error budget 6x too fast",
        ),
        # 20% over target: under the slow burn's 30%.
        Case(slow, latency(histogram, le, 80, 450), "7h", []),
    ]


def saturated(usage: tuple[float, float]) -> dict[str, str]:
    series = {f"agentserve_router_queue_depth{{{ROUTER}}}": "3x30"}
    for i, u in enumerate(usage):
        worker = f'{SEL}, component="worker", pod="coder-worker-{i}", model="coder"'
        series[f"agentserve_worker_kv_usage_ratio{{{worker}}}"] = f"{u}x30"
    return series


def returning(cached_per_min: int) -> dict[str, str]:
    labels = f'{FRONTEND}, api="anthropic", model="coder"'
    return {
        f"agentserve_frontend_returning_input_tokens_total{{{labels}}}": "0+1000x40",
        f"agentserve_frontend_returning_cached_tokens_total{{{labels}}}": f"0+{cached_per_min}x40",
    }


def state_up(values: str) -> dict[str, str]:
    return {f'agentserve_state_up{{{FRONTEND}, backend="redis"}}': values}


def syncs(result: str) -> dict[str, str]:
    op = 'namespace="agentserve-system", pod="agentserve-operator-0"'
    return {
        f'agentserve_operator_syncs_total{{{op}, trigger="timer", result="ok"}}': "0+4x40",
        f'agentserve_operator_syncs_total{{{op}, trigger="update", result="{result}"}}': "0+1x40",
    }


def planner(max_per_min: int) -> dict[str, str]:
    labels = f'{SEL}, component="planner", pod="coder-planner-0"'
    return {
        f'agentserve_planner_decisions_total{{{labels}, reason="max"}}': f"0+{max_per_min}x40",
        f'agentserve_planner_decisions_total{{{labels}, reason="targets"}}': f"0+{4 - max_per_min}x40",
    }


OPERATOR = {"namespace": "agentserve-system", "pod": "agentserve-operator-0"}
REMOVALS = f'agentserve_router_worker_removals_total{{{ROUTER}, reason="probe"}}'
RESTARTS = f"agentserve_router_kv_restarts_total{{{ROUTER}}}"

CASES: list[Case] = [
    *burn("TTFT", TTFT, "4.0", "TTFT over 4000 ms"),
    *burn("ITL", ITL, "0.05", "ITL over 50 ms"),
    Case(
        "AgentServeWorkersSaturated",
        saturated((0.95, 0.97)),
        "20m",
        [AT],
        "coder: every worker is full and requests queue in the router",
    ),
    # One worker has room: the router will place there, nothing to do.
    Case("AgentServeWorkersSaturated", saturated((0.95, 0.5)), "20m", []),
    Case(
        "AgentServeCacheHitShareCollapsed",
        returning(200),
        "35m",
        [AT],
        "coder: returning turns hit the prefix cache for only 20% of their prompt",
    ),
    Case("AgentServeCacheHitShareCollapsed", returning(900), "35m", []),
    Case(
        "AgentServeStateStoreDown",
        state_up("1x5 0x10"),
        "12m",
        [{**AT, "pod": "coder-frontend-0"}],
        "coder: the shared state store does not answer coder-frontend-0",
    ),
    Case("AgentServeStateStoreDown", state_up("1x15"), "12m", []),
    # A blip shorter than `for`.
    Case("AgentServeStateStoreDown", state_up("1x10 0 1x5"), "11m", []),
    Case(
        "AgentServeMigrationStorm",
        {f"agentserve_stream_migrations_total{{{FRONTEND}}}": "0+5x30"},
        "20m",
        [AT],
        "coder: 50 streams migrated in 10 minutes",
    ),
    Case(
        "AgentServeMigrationStorm", {f"agentserve_stream_migrations_total{{{FRONTEND}}}": "0+1x30"}, "20m", []
    ),
    Case(
        "AgentServeWorkerRestarts",
        {REMOVALS: "0+1x40", RESTARTS: "0x40"},
        "35m",
        [AT],
        "coder: workers keep leaving or restarting (30 in 30 minutes)",
    ),
    Case(
        "AgentServeWorkerRestarts",
        {REMOVALS: "0x40", RESTARTS: "0+0.5x40"},
        "35m",
        [AT],
        "coder: workers keep leaving or restarting (15 in 30 minutes)",
    ),
    # Two removals (a rollout) are no storm.
    Case("AgentServeWorkerRestarts", {REMOVALS: "0x10 1x10 2x20", RESTARTS: "0x40"}, "35m", []),
    Case(
        "AgentServeOperatorReconcileErrors",
        syncs("ApplyFailed"),
        "35m",
        [OPERATOR],
        "the agentserve operator agentserve-operator-0 fails to reconcile",
    ),
    Case("AgentServeOperatorReconcileErrors", syncs("ok"), "35m", []),
    Case(
        "AgentServePlannerAtMaximum",
        planner(4),
        "35m",
        [AT],
        "coder: the planner cannot meet the latency targets even at maxWorkers",
    ),
    Case("AgentServePlannerAtMaximum", planner(1), "35m", []),
]


def _test(case: Case, alert: Alert) -> dict[str, Any]:
    annotations = alert.rule()["annotations"]
    expected = [
        {
            "exp_labels": {"alertname": case.alert, "severity": alert.severity, **labels},
            "exp_annotations": {**annotations, "summary": case.summary},
        }
        for labels in case.fires
    ]
    return {
        "name": f"{case.alert} {'fires' if case.fires else 'stays quiet'}",
        "interval": case.interval,
        "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
        "alert_rule_test": [{"eval_time": case.eval_time, "alertname": case.alert, "exp_alerts": expected}],
    }


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    names = {a.name for a in ALERTS}
    assert {c.alert for c in CASES if c.fires} == names
    assert {c.alert for c in CASES if not c.fires} == names


def test_promtool_checks_the_rules_file(promtool: Promtool) -> None:
    result = promtool.run("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_unit_tests_every_alert(promtool: Promtool, tmp_path: Path) -> None:
    by_name = {a.name: a for a in ALERTS}
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [_test(c, by_name[c.alert]) for c in CASES],
    }
    path = tmp_path / "alerts_test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = promtool.run("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_can_fail(promtool: Promtool, tmp_path: Path) -> None:
    """A quiet case expected to fire fails: the runs above would notice an alert that never fires."""
    by_name = {a.name: a for a in ALERTS}
    quiet = next(c for c in CASES if not c.fires and c.alert == "AgentServeStateStoreDown")
    wrong = Case(quiet.alert, quiet.series, quiet.eval_time, [AT], "whatever")
    path = tmp_path / "wrong_test.yaml"
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [_test(wrong, by_name[wrong.alert])],
    }
    path.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = promtool.run("test", "rules", str(path))
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr
