"""Disaggregated prefill on the real control plane with KWOK B200 nodes: examples/deepseek-r1-disagg-b200.yaml
(2 decode + 1 prefill worker, 8 GPUs each) scheduled onto whole B200 nodes, both pools discovered by the
router's own EndpointSlice watch of their two Services.

The test brings three B200 nodes of its own, tainted so nothing else lands there and nothing here
lands elsewhere."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from k8s_e2e import Kube, Operator, condition, k8s_local, load_example, wait_for

from agentserve.router.discovery import KubeWatcher, WorkerEndpoint

NS = "disagg"
POOL = "disagg-e2e"
TAINT = {"key": "agentserve.dev/e2e", "value": "disagg", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def nodes(operator: Operator) -> Iterator[Kube]:
    kube = operator.kube
    for i in range(3):
        node = k8s_local.b200_node(f"pd-{i}", "zone-a")
        node["metadata"]["labels"]["agentserve.dev/pool"] = POOL
        node["spec"] = {"taints": [*node["spec"]["taints"], TAINT]}
        kube.cluster.apply(node)
    kube.cluster.wait_nodes_ready([f"pd-{i}" for i in range(3)])
    kube.ensure_namespace(NS)
    yield kube


def _cr() -> dict[str, Any]:
    """The example as written, moved to this test's nodes (their pool label and taint)."""
    body = load_example("deepseek-r1-disagg-b200.yaml")
    body["metadata"] = {"name": "r1", "namespace": NS}
    body["spec"]["model"]["source"] = {"hostPath": {"path": "/mnt/nvme/models/r1"}}
    pool = body["spec"]["nodePool"]
    pool["nodeSelector"] = {"agentserve.dev/pool": POOL}
    pool["tolerations"] = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"},
    ]
    return body


def _running(kube: Kube, component: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance=r1,app.kubernetes.io/component={component}"
    pods = [p for p in kube.items("pods", NS, selector) if p["metadata"].get("deletionTimestamp") is None]
    return [
        p for p in pods if p["spec"].get("nodeName") and (p.get("status") or {}).get("phase") == "Running"
    ]


def _discover(kube: Kube, service: str, want: int) -> set[str]:
    """The router's EndpointSlice watch of `service`, until it sees `want` workers."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(kube.kubeconfig))
    seen: dict[str, WorkerEndpoint] = {}
    done = threading.Event()

    def found(endpoints: dict[str, WorkerEndpoint]) -> None:
        seen.clear()
        seen.update(endpoints)
        if len(endpoints) == want:
            done.set()

    async def main() -> None:
        watcher = KubeWatcher(NS, service, found, api_client=client, retry_s=0.5)
        watcher.start()
        for _ in range(600):
            if done.is_set():
                break
            await asyncio.sleep(0.1)
        await watcher.aclose()

    asyncio.run(main())
    return set(seen)


def test_both_pools_are_scheduled_on_b200_nodes_and_discovered_apart(nodes: Kube) -> None:
    kube = nodes
    kube.apply_yaml(yaml.safe_dump(_cr()))
    wait_for(lambda: condition(kube.get("asd", "r1", NS), "Ready").get("status") == "True", 90, "r1 Ready")
    decode = wait_for(lambda: len(p := _running(kube, "worker")) == 2 and p, 60, "two decode pods")
    prefill = wait_for(lambda: len(p := _running(kube, "prefill-worker")) == 1 and p, 60, "a prefill pod")
    on = {p["spec"]["nodeName"] for p in [*decode, *prefill]}
    assert on == {"pd-0", "pd-1", "pd-2"}, on  # one whole B200 node each, all three ours
    for pod in [*decode, *prefill]:
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == 8
    (pod,) = prefill
    assert pod["spec"]["containers"][0]["args"] == ["--config", "/etc/agentserve/prefill-worker.yaml"]
    # The router's discovery finds each pool in its own Service.
    assert len(_discover(kube, "r1-worker", 2)) == 2
    assert len(_discover(kube, "r1-prefill-worker", 1)) == 1
    assert kube.get("networkpolicy", "r1-kv-transfer", NS) is not None
    kube.kubectl("delete", "asd", "r1", "-n", NS, "--wait=false")
