"""A router service (the real app over a `LocalRouter`) on a loopback uvicorn server, in this loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn

from agentserve.config import RouterConfig
from agentserve.router.local import LocalRouter
from agentserve.router.service import create_app


@dataclass
class RoutedService:
    url: str
    router: LocalRouter


@contextlib.asynccontextmanager
async def routed(config: RouterConfig) -> AsyncIterator[RoutedService]:
    router = LocalRouter(config)
    server = uvicorn.Server(
        uvicorn.Config(create_app(router), host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "uvicorn did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield RoutedService(f"http://127.0.0.1:{port}", router)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
