"""The Helm chart, with the real helm binary: lint, template, and every rendered object validated.

helm comes from `scripts/install-helm` (into .tools/bin). Without it the tests skip, saying so,
except in CI (CI=true), where a missing helm is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentserve.operator.build import CHILD_KINDS
from agentserve.operator.crd import crd
from agentserve.ops.alerts import groups
from agentserve.ops.dashboard import dashboard
from agentserve.planner.access import PLANNER_ACCESS
from kubecheck import assert_valid

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "agentserve"
HELM = ROOT / ".tools" / "bin" / "helm"

if not HELM.exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"helm is missing at {HELM}: scripts/test runs scripts/install-helm first")
    pytest.skip(f"helm not installed at {HELM}: run scripts/install-helm", allow_module_level=True)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(HELM), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, "HELM_CACHE_HOME": "/tmp/h"},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@cache
def _rendered(sets: tuple[str, ...], namespace: str) -> str:
    args = ["template", "ops", str(CHART), "--namespace", namespace]
    for value in sets:
        args += ["--set", value]
    return helm(*args).stdout


def template(*sets: str, namespace: str = "agentserve-system") -> list[dict[str, Any]]:
    """The rendered objects (fresh dicts: tests may change them)."""
    return [doc for doc in yaml.safe_load_all(_rendered(sets, namespace)) if doc]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def test_helm_lint_strict() -> None:
    result = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("serviceMonitor.enabled=true", "verbose=true"),
        ("dashboards.enabled=true", "prometheusRule.enabled=true"),
        ("watchNamespaces={ai,research}", "crds.manage=false", "test.enabled=false"),
    ],
)
def test_every_rendered_object_is_valid(sets: tuple[str, ...]) -> None:
    objs = template(*sets)
    assert objs
    assert_valid(objs)


def test_operator_is_two_peered_replicas_with_a_pdb_or_one_recreated_without_peering() -> None:
    objs = template()
    (deployment,) = by_kind(objs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert "--peering=agentserve" in spec["template"]["spec"]["containers"][0]["args"]
    (pdb,) = by_kind(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    (peering,) = by_kind(objs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "agentserve"
    assert _allows(_rules(objs, "ClusterRole"), "kopf.dev", "clusterkopfpeerings", "patch")
    scoped = template("watchNamespaces={ai,research}")
    assert sorted(p["metadata"]["namespace"] for p in by_kind(scoped, "KopfPeering")) == ["ai", "research"]
    assert _allows(_rules(scoped, "Role"), "kopf.dev", "kopfpeerings", "patch")
    single = template("peering.enabled=false")
    (deployment,) = by_kind(single, "Deployment")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert by_kind(single, "PodDisruptionBudget") == [] and by_kind(single, "ClusterKopfPeering") == []
    assert not any("--peering" in a for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    crd_file = CHART / "crds" / "kopf-peering.yaml"
    kinds = {d["spec"]["names"]["kind"] for d in yaml.safe_load_all(crd_file.read_text(encoding="utf-8"))}
    assert kinds == {"ClusterKopfPeering", "KopfPeering"}


def test_operator_deployment_is_hardened() -> None:
    (deployment,) = by_kind(template(), "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["agentserve", "operator"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert container["image"] == "ghcr.io/agentserve/operator:0.1.0"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_the_chart_carries_the_generated_crd_in_crds_and_the_operator_manages_it() -> None:
    # Helm's crds/: installed when missing (also over a CRD applied before from the repo's crds/),
    # never templated, so no ownership check can fail on it.
    assert by_kind(template(), "CustomResourceDefinition") == []
    committed = CHART / "crds" / "agentserve.dev_agentservingdeployments.yaml"
    assert yaml.safe_load(committed.read_text(encoding="utf-8")) == crd()
    (deployment,) = by_kind(template(), "Deployment")
    assert "--manage-crd" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    cluster_rules = _rules(template(), "ClusterRole")
    (patch_crd,) = [
        r for r in cluster_rules if "customresourcedefinitions" in r["resources"] and "patch" in r["verbs"]
    ]
    assert patch_crd["resourceNames"] == ["agentservingdeployments.agentserve.dev"]
    unmanaged = template("crds.manage=false")
    (deployment,) = by_kind(unmanaged, "Deployment")
    assert "--manage-crd" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(
        "patch" in r["verbs"]
        for r in _rules(unmanaged, "ClusterRole")
        if "customresourcedefinitions" in r["resources"]
    )


def _rules(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rule for role in by_kind(objs, kind) for rule in role["rules"]]


def _allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


_PLURAL = {
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ConfigMap": "configmaps",
    "Service": "services",
    "Deployment": "deployments",
    "StatefulSet": "statefulsets",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "NetworkPolicy": "networkpolicies",
    "ServiceMonitor": "servicemonitors",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
}


@pytest.mark.parametrize(("sets", "kind"), [((), "ClusterRole"), (("watchNamespaces={ai}",), "Role")])
def test_rbac_covers_what_the_operator_does_and_nothing_more(sets: tuple[str, ...], kind: str) -> None:
    objs = template(*sets)
    rules = _rules(objs, kind)
    for api_version, child_kind in CHILD_KINDS:
        group = api_version.rpartition("/")[0]
        for verb in ("get", "list", "watch", "create", "patch", "delete"):
            assert _allows(rules, group, _PLURAL[child_kind], verb), (child_kind, verb)
    assert _allows(rules, "agentserve.dev", "agentservingdeployments/status", "patch")
    assert _allows(rules, "discovery.k8s.io", "endpointslices", "watch")  # granted on to the router
    assert _allows(rules, "", "pods", "list") and not _allows(rules, "", "pods", "create")
    # What the planner's Role grants, the operator must hold (RBAC refuses to grant more).
    for access in PLANNER_ACCESS:
        for verb in access.verbs:
            assert _allows(rules, access.group, access.resource, verb), (access.resource, verb)
    # The signing-key Secret is created, never read or changed: the operator sees no Secret's data.
    assert _allows(rules, "", "secrets", "create")
    every = [r for role in by_kind(objs, "ClusterRole") + by_kind(objs, "Role") for r in role["rules"]]
    for rule in every:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        if "secrets" in rule["resources"]:
            assert rule["resources"] == ["secrets"] and rule["verbs"] == ["create"]
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_namespaced_mode_uses_roles_in_each_namespace() -> None:
    objs = template("watchNamespaces={ai,research}")
    roles = by_kind(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ai", "research"]
    assert sorted(b["metadata"]["namespace"] for b in by_kind(objs, "RoleBinding")) == ["ai", "research"]
    (cluster_role,) = by_kind(objs, "ClusterRole")  # only the cluster-scoped reads
    assert {r for rule in cluster_role["rules"] for r in rule["resources"]} == {
        "customresourcedefinitions",
        "namespaces",
    }
    (deployment,) = by_kind(objs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=ai" in args and "--namespace=research" in args


def test_service_monitor_and_helm_test() -> None:
    assert by_kind(template(), "ServiceMonitor") == []
    (monitor,) = by_kind(
        template("serviceMonitor.enabled=true", "serviceMonitor.labels.release=prom"), "ServiceMonitor"
    )
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    (test_pod,) = by_kind(template(), "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert by_kind(template("test.enabled=false"), "Pod") == []


def test_values_schema_rejects_bad_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    for bad in ("image.pullPolicy=Sometimes", "watchNamespaces={Not_A_Namespace}", "unknownKey=1"):
        result = helm("template", "ops", str(CHART), "--set", bad, check=False)
        assert result.returncode != 0, bad
        assert "schema" in result.stderr.lower() or "values don't meet" in result.stderr.lower(), (
            result.stderr
        )


def test_notes_explain_the_next_kubectl_apply() -> None:
    result = helm("install", "ops", str(CHART), "--namespace", "ops", "--dry-run=client")
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl apply -f examples/" in notes
    assert "kubectl wait --for=condition=Ready" in notes


def test_dashboard_configmap_for_the_grafana_sidecar() -> None:
    assert [c for c in by_kind(template(), "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")] == []
    objs = template("dashboards.enabled=true", "dashboards.annotations.grafana_folder=agents")
    assert_valid(objs)
    (cm,) = [c for c in by_kind(objs, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "agents"}
    assert cm["metadata"]["namespace"] == "agentserve-system"
    assert json.loads(cm["data"]["agentserve-dashboard.json"]) == dashboard()
    elsewhere = template("dashboards.enabled=true", "dashboards.namespace=monitoring")
    (moved,) = [c for c in by_kind(elsewhere, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    assert moved["metadata"]["namespace"] == "monitoring"


def test_prometheus_rule_carries_the_alerts() -> None:
    assert by_kind(template(), "PrometheusRule") == []
    objs = template("prometheusRule.enabled=true", "prometheusRule.labels.release=prom")
    assert_valid(objs)
    (rule,) = by_kind(objs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == {"groups": groups()}
    # Helm does not template the rules: Prometheus's own {{ $labels.… }} reach it untouched.
    assert "{{ $labels.deployment }}" in rule["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]
