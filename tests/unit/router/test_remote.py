"""`connect` and the worker registry, without a network (the service tests cover the wire)."""

from __future__ import annotations

import pytest

from agentserve.config import ConfigError, FrontendConfig
from agentserve.router.dispatch import ClientTransport
from agentserve.router.remote import WorkerRegistry, connect

pytestmark = pytest.mark.anyio


async def test_connect_needs_a_router_url_or_workers() -> None:
    with pytest.raises(ConfigError, match="router_url"):
        await connect(FrontendConfig())


async def test_the_registry_keeps_one_client_per_worker_and_follows_its_url() -> None:
    registry = WorkerRegistry()
    registry.ensure("a", "http://127.0.0.1:1")
    first = registry.transports()["a"]
    registry.ensure("a", "http://127.0.0.1:1")
    assert registry.transports()["a"] is first  # same URL: same client (its keep-alive pool)
    registry.ensure("a", "http://127.0.0.1:2")  # moved (a pod replaced at a new address)
    moved = registry.transports()["a"]
    assert moved is not first and isinstance(moved, ClientTransport)
    assert moved.client.base_url == "http://127.0.0.1:2"  # type: ignore[attr-defined]
    registry.sync({"b": "http://127.0.0.1:3"})
    assert set(registry.transports()) == {"b"}
    registry.drop("b")
    assert dict(registry.transports()) == {}
    await registry.aclose()
