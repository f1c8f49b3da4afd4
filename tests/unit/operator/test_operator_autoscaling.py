"""spec.autoscaling and spec.frontend.autoscaling → the planner's objects, its configuration, the
frontend's HorizontalPodAutoscaler; the status keeps the planner's condition while it is wanted."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from test_operator_build import container, get, objects, pod

from agentserve.config import PlannerServiceConfig, load_config
from agentserve.operator.build import PROFILE_DIR, Target, config_files, config_hash
from agentserve.operator.reconcile import compute_status, stale_conditions
from agentserve.operator.spec import AUTOSCALING_CONDITION, AgentServingDeploymentSpec
from agentserve.planner.access import role_rules
from agentserve.worker.profiles import DEFAULT_PROFILE
from kubecheck import assert_valid

ROOT = Path(__file__).resolve().parents[3]
SCALING = {"autoscaling": {"minWorkers": 2, "maxWorkers": 6, "ttftTargetMs": 1500, "intervalSeconds": 10}}
FRONTEND_HPA = {
    "frontend": {
        "resources": {"requests": {"cpu": "2"}},
        "autoscaling": {"minReplicas": 2, "maxReplicas": 5},
    },
    "state": {"managed": {}},
}


def planner_config(objs: list[dict[str, Any]], tmp_path: Path) -> PlannerServiceConfig:
    path = tmp_path / "planner.yaml"
    path.write_text(get(objs, "ConfigMap", "coder-config")["data"]["planner.yaml"])
    return load_config(PlannerServiceConfig, path)


def test_no_planner_objects_without_autoscaling() -> None:
    objs = objects()
    assert not [o for o in objs if o["metadata"]["name"] == "coder-planner"]
    assert "planner.yaml" not in get(objs, "ConfigMap", "coder-config")["data"]
    assert not [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]


def test_the_planner_gets_its_role_one_pod_and_a_metrics_service(tmp_path: Path) -> None:
    objs = objects(SCALING, uid="uid-1")
    assert_valid(objs)
    assert get(objs, "Role", "coder-planner")["rules"] == role_rules("coder")
    binding = get(objs, "RoleBinding", "coder-planner")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "coder-planner", "namespace": "ai"}]
    deployment = get(objs, "Deployment", "coder-planner")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    spec = pod(objs, "planner")
    assert spec["serviceAccountName"] == "coder-planner" and spec["automountServiceAccountToken"] is True
    main = container(objs, "planner")
    assert main["command"] == ["agentserve", "planner"]
    assert main["args"] == ["--config", "/etc/agentserve/planner.yaml"]
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    service = get(objs, "Service", "coder-planner")
    assert service["spec"]["ports"][0]["name"] == "http"  # the ServiceMonitor's port: it is scraped too
    config = planner_config(objs, tmp_path)
    assert config.discovery == "kubernetes" and config.deployment == "coder" and config.namespace == "ai"
    assert (config.worker_service, config.frontend_service, config.router_service) == (
        "coder-worker",
        "coder-frontend",
        "coder-router",
    )
    assert (config.min_workers, config.max_workers, config.ttft_target_ms, config.interval_s) == (
        2,
        6,
        1500,
        10,
    )
    assert config.profile == DEFAULT_PROFILE and config.max_num_tokens == 8192


def test_the_profile_and_chunk_follow_the_spec(tmp_path: Path) -> None:
    sim = {"workers": {"engine": "sim", "sim": {"profile": "h200-qwen3-30b-a3b-pytorch"}}}
    assert planner_config(objects({**SCALING, **sim}), tmp_path).profile == "h200-qwen3-30b-a3b-pytorch"
    own = {"autoscaling": {"maxWorkers": 4, "profileConfigMap": {"name": "measured", "key": "b200.yaml"}}}
    objs = objects(own)
    assert planner_config(objs, tmp_path).profile == f"{PROFILE_DIR}/profile.yaml"
    volume = next(v for v in pod(objs, "planner")["volumes"] if v["name"] == "profile")
    assert volume["configMap"] == {
        "name": "measured",
        "items": [{"key": "b200.yaml", "path": "profile.yaml"}],
    }
    chunked = objects({**SCALING, "workers": {"llmApiOptions": {"max_num_tokens": 16384}}})
    assert planner_config(chunked, tmp_path).max_num_tokens == 16384


def test_a_planner_setting_rolls_only_the_planner() -> None:
    def hashes(extra: dict[str, Any]) -> dict[str, str]:
        spec = AgentServingDeploymentSpec.model_validate(
            {"model": {"name": "m"}, "workers": {"engine": "sim"}, **extra}
        )
        files = config_files(spec, Target("coder", "ai"))
        return {part: config_hash(files, part) for part in ("frontend", "router", "worker", "planner")}

    before = hashes(SCALING)
    after = hashes({"autoscaling": {**SCALING["autoscaling"], "ttftTargetMs": 900}})
    assert [p for p in before if before[p] != after[p]] == ["planner"]


def test_frontend_autoscaling_is_an_hpa_that_owns_the_frontend_replicas() -> None:
    objs = objects(FRONTEND_HPA)
    assert_valid(objs)
    hpa = get(objs, "HorizontalPodAutoscaler", "coder-frontend")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "coder-frontend",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 5)
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 70
    assert "replicas" not in get(objs, "Deployment", "coder-frontend")["spec"]
    assert get(objs, "Deployment", "coder-router")["spec"]["replicas"] == 1


def test_the_autoscaling_example_renders() -> None:
    from agentserve.operator.build import build
    from agentserve.operator.manifests import load_resources

    (res,) = load_resources((ROOT / "examples" / "autoscaling" / "planner.yaml").read_text())
    objs = build(res.spec, res.name, res.namespace)
    assert_valid(objs)
    kinds = {o["kind"] for o in objs}
    assert {"HorizontalPodAutoscaler", "Role", "ServiceAccount"} <= kinds
    hpa = yaml.safe_load((ROOT / "examples" / "autoscaling" / "hpa-on-workers.yaml").read_text())
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "AgentServingDeployment"
    assert_valid([hpa])


def _status(spec: dict[str, Any] | None, previous: dict[str, Any]) -> dict[str, Any]:
    return compute_status(
        target=Target("coder", "ai"),
        generation=2,
        spec=AgentServingDeploymentSpec.model_validate(spec) if spec is not None else None,
        deployments=[],
        pods=[],
        previous=previous,
        failure=None,
        now=datetime(2026, 11, 27, tzinfo=UTC),
    )


def test_the_status_leaves_the_planners_condition_to_the_planner_and_removes_it_without_autoscaling() -> None:
    planner = {
        "type": AUTOSCALING_CONDITION,
        "status": "True",
        "reason": "MeetingTargets",
        "message": "3 workers: targets",
        "lastTransitionTime": "2026-11-27T00:00:00Z",
    }
    base = {"model": {"name": "m"}, "workers": {"engine": "sim"}}
    scaled = AgentServingDeploymentSpec.model_validate({**base, "autoscaling": {"maxWorkers": 3}})
    # Written by server-side apply: the operator's list never names the planner's condition, so its
    # write neither carries a stale copy nor drops a newer one.
    kept = _status({**base, "autoscaling": {"maxWorkers": 3}}, {"conditions": [planner]})
    assert all(c["type"] != AUTOSCALING_CONDITION for c in kept["conditions"])
    assert stale_conditions(scaled, {"conditions": [planner]}) == []
    static = AgentServingDeploymentSpec.model_validate(base)
    assert stale_conditions(static, {"conditions": [planner]}) == [AUTOSCALING_CONDITION]
    assert stale_conditions(static, {"conditions": []}) == []
    assert stale_conditions(None, {"conditions": [planner]}) == []  # an invalid spec: left as it is
