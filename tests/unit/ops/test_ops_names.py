"""The dashboard and the alert rules name only what the code exports; the shipped files are generated;
each alert has a runbook."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from agentserve.cli import main
from agentserve.ops import alerts, dashboard
from agentserve.ops.catalog import exported_series, families, target_labels
from agentserve.ops.names import names, unknown
from agentserve.ops.slo import SLOS

ROOT = Path(__file__).resolve().parents[3]
FILES = ROOT / "charts" / "agentserve" / "files"
EXPORTED = exported_series()


def _expressions() -> list[tuple[str, str]]:
    out = [(f"panel {p.title!r}", t.expr) for p in dashboard.panels() for t in p.targets]
    out += [(f"alert {a.name}", a.expr) for a in alerts.ALERTS]
    model = dashboard.dashboard()
    out += [
        (f"variable {v['name']}", v["definition"]) for v in model["templating"]["list"] if "definition" in v
    ]
    return out


@pytest.mark.parametrize(("where", "expr"), _expressions(), ids=[w for w, _ in _expressions()])
def test_every_expression_names_exported_series_and_labels(where: str, expr: str) -> None:
    text = re.sub(r"label_values\((.*), (\w+)\)$", r"count by (\2) (\1)", expr)
    assert unknown(text, EXPORTED) == [], where


def test_the_check_fails_on_a_name_or_label_the_code_does_not_export() -> None:
    good = 'sum by (api) (rate(agentserve_frontend_requests_total{status="stop"}[5m]))'
    assert unknown(good, EXPORTED) == []
    assert unknown(good.replace("requests_total", "request_total"), EXPORTED) == [
        "metric agentserve_frontend_request_total",
        "label api",
        "label status",
    ]
    assert unknown(good.replace("by (api)", "by (session_id)"), EXPORTED) == ["label session_id"]
    assert unknown(good.replace("status=", "reason="), EXPORTED) == ["label reason"]
    # A label of another metric does not count.
    assert unknown("sum by (worker) (agentserve_worker_requests_running)", EXPORTED) == ["label worker"]
    assert unknown("vector(1)", EXPORTED) == ["no metric at all"]


def test_names_finds_metrics_and_labels_but_not_functions_or_strings() -> None:
    found = names(
        'histogram_quantile(0.95, sum by (le, op) (rate(m_bucket{a=~"x|y", b!="}"}[$__rate_interval])))'
        " / on (op) group_left (c) other offset 5m > bool 0"
    )
    assert found.metrics == {"m_bucket", "other"}
    assert found.labels == {"le", "op", "a", "b", "c"}


def test_the_catalog_comes_from_the_components() -> None:
    by_component: dict[str, set[str]] = {}
    for family in families():
        by_component.setdefault(family.component, set()).add(family.name)
    assert "agentserve_frontend_returning_cached_tokens" in by_component["frontend"]
    assert "agentserve_state_up" in by_component["frontend"]
    assert "agentserve_router_worker_removals" in by_component["router"]
    assert "agentserve_worker_kv_host_blocks_used" in by_component["worker"]
    assert "agentserve_operator_syncs" in by_component["operator"]
    assert EXPORTED["agentserve_frontend_requests_total"] >= {"api", "model", "status", "deployment"}
    assert EXPORTED["agentserve_frontend_time_to_first_token_seconds_bucket"] >= {"le", "api"}
    assert {"deployment", "component", "namespace", "pod"} <= target_labels()


def test_slo_targets_are_bucket_bounds() -> None:
    for slo in SLOS:
        assert slo.target_s in slo.buckets, slo.name
        le = slo.le_regex.replace("\\\\", "\\")
        assert re.fullmatch(le, repr(slo.target_s)) and re.fullmatch(le, f"{slo.target_s:g}")


def test_the_chart_ships_what_the_code_generates(capsys: pytest.CaptureFixture[str]) -> None:
    assert (FILES / "agentserve-dashboard.json").read_text() == dashboard.render(), "run scripts/generate"
    assert (FILES / "agentserve-rules.yaml").read_text() == alerts.render(), "run scripts/generate"
    assert main(["dashboard"]) == 0
    assert json.loads(capsys.readouterr().out)["uid"] == dashboard.UID
    assert main(["alerts"]) == 0
    rules = yaml.safe_load(capsys.readouterr().out)["groups"][0]["rules"]
    assert [r["alert"] for r in rules] == [a.name for a in alerts.ALERTS]


def test_the_dashboard_has_the_rows_and_variables_an_operator_needs() -> None:
    model = dashboard.dashboard()
    rows = [p["title"] for p in model["panels"] if p["type"] == "row"]
    assert rows == [r.title for r in dashboard.ROWS]
    assert [v["name"] for v in model["templating"]["list"]] == ["datasource", "namespace", "deployment"]
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    for panel in model["panels"]:
        for target in panel.get("targets", []):
            assert 'namespace=~"$namespace", deployment=~"$deployment"' in target["expr"], panel["title"]


def test_every_alert_has_a_runbook_section() -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    }
    for alert in alerts.ALERTS:
        assert alert.anchor in headings, f"docs/operations.md has no section {alert.name}"
        section = text.split(f"### {alert.name}", 1)[1].split("\n### ", 1)[0]
        assert "**Means**" in section and "**Do**" in section, alert.name
