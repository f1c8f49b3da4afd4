"""`spec.workers.prefill`: the prefill pool's objects beside the decode pool (pure builder)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from agentserve.operator.build import PREFILL, Target, build
from agentserve.operator.reconcile import PREFILL_CONDITION, compute_status
from agentserve.operator.spec import AgentServingDeploymentSpec, AgentServingDeploymentStatus

C = "app.kubernetes.io/component"


def spec(**workers: Any) -> AgentServingDeploymentSpec:
    return AgentServingDeploymentSpec.model_validate(
        {
            "model": {
                "name": "deepseek-ai/DeepSeek-R1",
                "contextLength": 131072,
                "source": {"pvc": {"claimName": "m"}},
            },
            "workers": {
                "replicas": 2,
                "tensorParallelSize": 8,
                "llmApiOptions": {"max_batch_size": 64},
                **workers,
            },
        }
    )


def by(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def test_the_prefill_pool_is_its_own_deployment_service_and_pdb() -> None:
    objs = build(
        spec(prefill={"replicas": 3, "tensorParallelSize": 4, "llmApiOptions": {"max_batch_size": 8}}),
        "ds",
        "ns",
    )
    pool = by(objs, "Deployment", "ds-prefill-worker")
    decode = by(objs, "Deployment", "ds-worker")
    assert pool["spec"]["replicas"] == 3 and decode["spec"]["replicas"] == 2
    assert pool["spec"]["selector"]["matchLabels"][C] == "prefill-worker"
    assert pool["spec"]["template"]["metadata"]["labels"][C] == "prefill-worker"
    container = pool["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["--config", "/etc/agentserve/prefill-worker.yaml"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4  # its own tensor parallel size
    assert decode["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    # Same B200 placement as the decode pool.
    assert (
        pool["spec"]["template"]["spec"]["nodeSelector"] == decode["spec"]["template"]["spec"]["nodeSelector"]
    )
    # The decode Service does not select prefill pods, and the other way round.
    assert by(objs, "Service", "ds-worker")["spec"]["selector"][C] == "worker"
    assert by(objs, "Service", "ds-prefill-worker")["spec"]["selector"][C] == "prefill-worker"
    assert (
        by(objs, "PodDisruptionBudget", "ds-prefill-worker")["spec"]["selector"]["matchLabels"][C]
        == "prefill-worker"
    )

    data = by(objs, "ConfigMap", "ds-config")["data"]
    prefill = yaml.safe_load(data["prefill-worker.yaml"])
    worker = yaml.safe_load(data["worker.yaml"])
    assert prefill["role"] == "prefill" and worker["role"] == "decode"
    assert prefill["tensor_parallel_size"] == 4 and worker["tensor_parallel_size"] == 8
    assert prefill["max_seq_len"] == 131072  # the transfer buffer's size
    assert prefill["extra_llm_api_options"] == "/etc/agentserve/prefill-llm-api-options.yaml"
    assert yaml.safe_load(data["prefill-llm-api-options.yaml"]) == {"max_batch_size": 8}  # over the pool's 64
    router = yaml.safe_load(data["router.yaml"])
    assert router["prefill_worker_service"] == "ds-prefill-worker" and router["worker_service"] == "ds-worker"

    kv = by(objs, "NetworkPolicy", "ds-kv-transfer")["spec"]
    assert kv["podSelector"]["matchExpressions"][0]["values"] == ["worker", "prefill-worker"]
    internal = by(objs, "NetworkPolicy", "ds-internal")["spec"]["podSelector"]["matchExpressions"][0][
        "values"
    ]
    assert "prefill-worker" in internal


def test_without_a_prefill_pool_nothing_changes() -> None:
    objs = build(spec(), "ds", "ns")
    assert not [
        o for o in objs if "prefill" in o["metadata"]["name"] or o["metadata"]["name"] == "ds-kv-transfer"
    ]
    data = by(objs, "ConfigMap", "ds-config")["data"]
    assert "prefill-worker.yaml" not in data and "role" not in yaml.safe_load(data["worker.yaml"])
    assert "prefill_worker_service" not in yaml.safe_load(data["router.yaml"])


def test_the_prefill_pool_changes_roll_only_its_pods() -> None:
    one = build(spec(prefill={"llmApiOptions": {"max_batch_size": 8}}), "ds", "ns")
    two = build(spec(prefill={"llmApiOptions": {"max_batch_size": 16}}), "ds", "ns")

    def hashes(objs: list[dict[str, Any]], name: str) -> str:
        return str(by(objs, "Deployment", name)["spec"]["template"]["metadata"]["annotations"])

    assert hashes(one, "ds-prefill-worker") != hashes(two, "ds-prefill-worker")
    assert hashes(one, "ds-worker") == hashes(two, "ds-worker")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"workers": {"prefill": {"tensorParallelSize": 16}}}, "one node"),
        ({"model": {"contextLength": None}, "workers": {"prefill": {}}}, "contextLength"),
        ({"workers": {"prefill": {"llmApiOptions": {"no_such_option": 1}}}}, "workers.prefill.llmApiOptions"),
        (
            {"workers": {"engine": "sim", "tensorParallelSize": 1, "prefill": {"tensorParallelSize": 2}}},
            "no GPU",
        ),
    ],
)
def test_a_prefill_pool_that_cannot_serve_is_refused(change: dict[str, Any], message: str) -> None:
    body: dict[str, Any] = {
        "model": {"name": "m", "contextLength": 8192, "source": {"pvc": {"claimName": "m"}}},
        "workers": {"tensorParallelSize": 8},
    }
    for key, value in change.items():
        body[key] = {**body[key], **value}
    body["model"] = {k: v for k, v in body["model"].items() if v is not None}
    with pytest.raises(ValidationError, match=message):
        AgentServingDeploymentSpec.model_validate(body)


def test_a_prefill_pool_without_replicas_is_scaled_through_its_deployment() -> None:
    objs = build(spec(prefill={"replicas": None}), "ds", "ns")
    assert "replicas" not in by(objs, "Deployment", "ds-prefill-worker")["spec"]
    assert by(objs, "Deployment", "ds-worker")["spec"]["replicas"] == 2


def _deployment(name: str, component: str, replicas: int, ready: int) -> dict[str, Any]:
    labels = {C: component, "app.kubernetes.io/instance": "r1"}
    return {
        "metadata": {"name": name, "labels": labels, "generation": 1},
        "spec": {"replicas": replicas},
        "status": {"observedGeneration": 1, "readyReplicas": ready, "updatedReplicas": replicas},
    }


def test_the_status_reports_the_prefill_pool_and_ready_waits_for_it() -> None:
    target = Target("r1", "ai")
    ready_rest = [
        _deployment(target.child("frontend"), "frontend", 1, 1),
        _deployment(target.child("router"), "router", 1, 1),
        _deployment(target.child("worker"), "worker", 2, 2),
    ]

    def status(prefill_ready: int) -> dict[str, Any]:
        pool = _deployment(target.prefill_workers, PREFILL, 1, prefill_ready)
        return compute_status(
            target=target,
            generation=1,
            spec=spec(prefill={"replicas": 1}),
            deployments=iter([*ready_rest, pool]),  # read more than once: any iterable
            pods=iter([]),
            previous=None,
            failure=None,
            now=datetime(2026, 11, 27, tzinfo=UTC),
        )

    def condition(s: dict[str, Any], kind: str) -> dict[str, Any]:
        return next(c for c in s["conditions"] if c["type"] == kind)

    waiting = status(0)
    assert condition(waiting, PREFILL_CONDITION)["status"] == "False"
    assert condition(waiting, "WorkersReady")["status"] == "True"
    assert condition(waiting, "Ready")["status"] == "False"
    assert "prefillWorkers" in condition(waiting, "Ready")["message"]
    assert waiting["prefillWorkers"]["readyReplicas"] == 0 and waiting["prefillWorkers"]["replicas"] == 1
    ready = status(1)
    assert condition(ready, PREFILL_CONDITION)["status"] == "True"
    assert condition(ready, "Ready")["status"] == "True"
    AgentServingDeploymentStatus.model_validate(ready)  # the CRD's status schema holds it
    without = compute_status(
        target=target,
        generation=1,
        spec=spec(),
        deployments=ready_rest,
        pods=[],
        previous=None,
        failure=None,
        now=datetime(2026, 11, 27, tzinfo=UTC),
    )
    assert "prefillWorkers" not in without
    assert all(c["type"] != PREFILL_CONDITION for c in without["conditions"])
    assert condition(without, "Ready")["status"] == "True"
