"""The EndpointSlice watch through the official kubernetes client, against a loopback fake API.

No kube-apiserver can run here (no cluster, no etcd): `fake_apiserver.FakeApiServer` serves the
list and watch HTTP shapes the real one does, and the real kubernetes client talks to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from fake_apiserver import FakeApiServer

from agentserve.router.discovery import KubeWatcher, WorkerEndpoint

pytestmark = pytest.mark.anyio

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client is the `kubernetes` extra")


def eps(name: str, *ips_ready: tuple[str, bool]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": "workers"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8200}, {"name": "kv-events", "port": 5557}],
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "name": f"pod-{ip}"},
            }
            for ip, ready in ips_ready
        ],
    }


def api_client(url: str) -> Any:
    config = kubernetes.client.Configuration()
    config.host = url
    return kubernetes.client.ApiClient(config)


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    for _ in range(int(timeout_s / 0.02)):
        if check():
            return True
        await asyncio.sleep(0.02)
    return check()


async def test_scaling_the_service_changes_the_workers_without_a_restart() -> None:
    seen: list[dict[str, WorkerEndpoint]] = []
    with FakeApiServer("ns") as api:
        api.put(eps("workers-a", ("10.0.0.1", True), ("10.0.0.2", False)))
        watcher = KubeWatcher("ns", "workers", seen.append, api_client=api_client(api.url), retry_s=0.1)
        watcher.start()
        try:
            assert await until(lambda: bool(seen) and api.watchers() == 1)
            assert seen[-1] == {
                "pod-10.0.0.1": WorkerEndpoint("pod-10.0.0.1", "http://10.0.0.1:8200", "tcp://10.0.0.1:5557")
            }
            path, query = api.requests[0]
            assert path == "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"
            assert query["labelSelector"] == ["kubernetes.io/service-name=workers"]
            # Scale up: the second pod turns ready, a third appears in a new slice.
            api.put(eps("workers-a", ("10.0.0.1", True), ("10.0.0.2", True)))
            api.put(eps("workers-b", ("10.0.0.3", True)))
            assert await until(lambda: set(seen[-1]) == {"pod-10.0.0.1", "pod-10.0.0.2", "pod-10.0.0.3"})
            # Scale down: a pod leaves a slice, and a slice goes away.
            api.put(eps("workers-a", ("10.0.0.2", True)))
            api.delete("workers-b")
            assert await until(lambda: set(seen[-1]) == {"pod-10.0.0.2"})
            assert watcher.lists == 1  # all of it through one watch
        finally:
            await watcher.aclose()


async def test_an_expired_watch_relists_and_catches_up() -> None:
    seen: list[dict[str, WorkerEndpoint]] = []
    with FakeApiServer("ns") as api:
        api.put(eps("workers-a", ("10.0.0.1", True)))
        watcher = KubeWatcher("ns", "workers", seen.append, api_client=api_client(api.url), retry_s=0.05)
        watcher.start()
        try:
            assert await until(lambda: api.watchers() == 1)
            api.expire()  # 410 Gone: this watch cannot resume
            # Changed while nobody watched: only a fresh list shows it.
            api.slices["workers-a"] = eps("workers-a", ("10.0.0.1", True), ("10.0.0.9", True))
            assert await until(lambda: watcher.lists >= 2 and "pod-10.0.0.9" in seen[-1])
            assert await until(lambda: api.watchers() == 1)  # and watching again
            api.put(eps("workers-a", ("10.0.0.9", True)))
            assert await until(lambda: set(seen[-1]) == {"pod-10.0.0.9"})
        finally:
            await watcher.aclose()


async def test_an_unreachable_api_is_retried_and_close_is_prompt() -> None:
    seen: list[dict[str, WorkerEndpoint]] = []
    with FakeApiServer("ns") as api:
        url = api.url
    watcher = KubeWatcher("ns", "workers", seen.append, api_client=api_client(url), retry_s=0.05)
    watcher.start()
    await asyncio.sleep(0.3)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await watcher.aclose()
    assert loop.time() - t0 < 2.0
    assert seen == [] and watcher.lists == 0
