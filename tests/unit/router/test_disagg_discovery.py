"""A prefill pool found by Kubernetes discovery: two Services, one fleet, the prefill pool's role."""

from __future__ import annotations

import pytest

from agentserve.config import RouterConfig
from agentserve.router.discovery import WorkerEndpoint
from agentserve.router.local import LocalRouter

pytestmark = pytest.mark.anyio


def endpoint(ip: str) -> WorkerEndpoint:
    return WorkerEndpoint(f"pod-{ip}", f"http://{ip}:8200", f"tcp://{ip}:5557")


async def test_both_services_feed_one_fleet_and_the_prefill_pool_keeps_its_role() -> None:
    config = RouterConfig(
        discovery="kubernetes", worker_service="w", prefill_worker_service="p", namespace="ns"
    )
    router = LocalRouter(config)
    try:
        router._decode_found({"pod-1": endpoint("1"), "pod-2": endpoint("2")})
        router._prefill_found({"pod-9": endpoint("9")})
        assert {m.id for m in router.fleet.members()} == {"pod-1", "pod-2", "pod-9"}
        # The decode Service changing does not drop the prefill pool, and the other way round.
        router._decode_found({"pod-1": endpoint("1")})
        assert {m.id for m in router.fleet.members()} == {"pod-1", "pod-9"}
        router.core.add_worker("pod-9")  # joins once synced: as a prefill worker
        router.core.add_worker("pod-1")
        assert router.core.role("pod-9") == "prefill" and router.core.role("pod-1") == "both"
        router.core.remove_worker("pod-9")  # unhealthy for a while: still of the pool when it returns
        router.core.add_worker("pod-9")
        assert router.core.role("pod-9") == "prefill"
    finally:
        await router.aclose()


def test_a_prefill_service_needs_kubernetes_discovery() -> None:
    with pytest.raises(ValueError, match="discovery: kubernetes"):
        RouterConfig(prefill_worker_service="p")
