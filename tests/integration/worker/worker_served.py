"""A worker app on a real uvicorn server bound to 127.0.0.1 on an ephemeral port, in this loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn

from agentserve.worker.engine import Engine
from agentserve.worker.publisher import KvEventPublisher
from agentserve.worker.service import create_app


@dataclass
class Served:
    url: str
    engine: Engine
    publisher: KvEventPublisher | None
    server: uvicorn.Server | None = None

    def cut_connections(self) -> int:
        """Abort every client connection the server holds (a worker dying, seen from the network)."""
        assert self.server is not None
        conns = list(self.server.server_state.connections)
        for conn in conns:
            conn.transport.abort()  # type: ignore[attr-defined]
        return len(conns)


@contextlib.asynccontextmanager
async def served(
    engine: Engine, *, publisher: KvEventPublisher | None = None, **kw: object
) -> AsyncIterator[Served]:
    app = create_app(engine, publisher=publisher, **kw)  # type: ignore[arg-type]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "uvicorn did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield Served(f"http://127.0.0.1:{port}", engine, publisher, server)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
