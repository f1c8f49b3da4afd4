"""`agentserve up`'s app on a real uvicorn server (127.0.0.1, ephemeral port) in a background thread.

The tests drive it with the official SDKs' synchronous clients from the test thread; the server runs
its own event loop, as it does in production. `Served.call` runs a coroutine on that loop (to look at
engines or the frontend's state from a test).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI

from agentserve.config import UpConfig
from agentserve.frontend.app import frontend_of
from agentserve.frontend.backend import EngineBackend
from agentserve.frontend.http import ApiKeys
from agentserve.frontend.service import Frontend
from agentserve.frontend.up import build_up
from agentserve.worker.engine import Engine

T = TypeVar("T")


@dataclass
class Served:
    url: str
    app: FastAPI
    backend: EngineBackend
    loop: asyncio.AbstractEventLoop

    @property
    def frontend(self) -> Frontend:
        return frontend_of(self.app)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)


@contextlib.contextmanager
def serving(app: Any) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:
    """Any ASGI app on uvicorn (127.0.0.1, ephemeral port) in a thread with its own event loop."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    try:
        for _ in range(1000):
            if server.started or not thread.is_alive():
                break
            threading.Event().wait(0.01)
        assert server.started, "uvicorn did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", loop
    finally:
        server.should_exit = True
        thread.join(15)
        loop.close()


@contextlib.contextmanager
def served(
    settings: Mapping[str, Any] | None = None,
    *,
    engines: Mapping[str, Engine] | None = None,
    keys: ApiKeys | None = None,
) -> Iterator[Served]:
    """`agentserve up` with `settings` (UpConfig fields; zero-time sim unless given)."""
    config = UpConfig.model_validate({"port": 0, "sim_speedup": 0, **(settings or {})})
    app, backend = build_up(config, engines=engines, keys=keys or ApiKeys())
    with serving(app) as (url, loop):
        yield Served(url, app, backend, loop)
