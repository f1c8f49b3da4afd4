"""The router's Kubernetes discovery follows the real EndpointSlices of the worker Service as worker pods
come and go (the endpointslice controller writes them; KWOK gives pods IPs and readiness)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import yaml
from k8s_e2e import Kube, Operator, condition, wait_for

from agentserve.router.discovery import KubeWatcher, WorkerEndpoint

SIM = {
    "apiVersion": "agentserve.dev/v1alpha1",
    "kind": "AgentServingDeployment",
    "metadata": {"name": "disco", "namespace": "routing"},
    "spec": {"model": {"name": "agentserve-sim"}, "workers": {"engine": "sim", "replicas": 2}},
}


def _pod_ips(kube: Kube) -> set[str]:
    selector = "app.kubernetes.io/instance=disco,app.kubernetes.io/component=worker"
    return {
        p["status"]["podIP"]
        for p in kube.items("pods", "routing", selector)
        if p.get("status", {}).get("podIP") and p["metadata"].get("deletionTimestamp") is None
    }


def test_discovery_follows_worker_pods_as_they_come_and_go(operator: Operator) -> None:
    from kubernetes import config

    kube = operator.kube
    kube.ensure_namespace("routing")
    kube.apply_yaml(yaml.safe_dump(SIM))
    wait_for(
        lambda: condition(kube.get("asd", "disco", "routing"), "Ready").get("status") == "True",
        90,
        "disco Ready",
        interval=0.3,
    )
    seen: list[dict[str, WorkerEndpoint]] = []
    lock = threading.Lock()

    def on_change(endpoints: dict[str, WorkerEndpoint]) -> None:
        with lock:
            seen.append(dict(endpoints))

    def latest() -> dict[str, WorkerEndpoint]:
        with lock:
            return seen[-1] if seen else {}

    def hosts() -> set[str]:
        return {e.url.split("//", 1)[1].rsplit(":", 1)[0] for e in latest().values()}

    async def scenario() -> dict[str, Any]:
        client = config.new_client_from_config(config_file=str(kube.kubeconfig))
        watcher = KubeWatcher("routing", "disco-worker", on_change, api_client=client, retry_s=0.5)
        watcher.start()
        try:
            await _until(lambda: len(latest()) == 2 and hosts() == _pod_ips(kube), 60, "2 workers discovered")
            first = latest()
            assert all(e.kv_endpoint and e.kv_endpoint.startswith("tcp://") for e in first.values())
            kube.kubectl("scale", "asd/disco", "-n", "routing", "--replicas=4")
            await _until(lambda: len(latest()) == 4 and hosts() == _pod_ips(kube), 60, "scaled to 4")
            kube.kubectl("scale", "asd/disco", "-n", "routing", "--replicas=1")
            await _until(lambda: len(latest()) == 1 and hosts() == _pod_ips(kube), 60, "scaled to 1")
            # A worker pod that dies is replaced: the old pod leaves, the new one arrives (KWOK may
            # hand the new pod the freed IP, so compare pods, not addresses).
            (old,) = latest()
            kube.kubectl(
                "delete",
                "pods",
                "-n",
                "routing",
                "-l",
                "app.kubernetes.io/instance=disco,app.kubernetes.io/component=worker",
            )
            await _until(lambda: len(latest()) == 1 and old not in latest(), 60, "the replacement worker")
            return {"lists": watcher.lists}
        finally:
            await watcher.aclose()

    result = asyncio.run(scenario())
    assert result["lists"] >= 1


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s: {what}")
        await asyncio.sleep(0.2)
