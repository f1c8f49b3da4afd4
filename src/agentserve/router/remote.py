"""What a frontend needs to dispatch requests: a `Router` and worker transports, from its config.

`connect(config)` returns a `Backend` (the router, the current worker transports, what to do
when a worker fails), from which the frontend builds its `Dispatcher`:

- `router_url` set → `RouterClient`, the `Router` protocol over the router service's route API
  (keep-alive HTTP/1.1, msgpack bodies); worker transports (`ClientTransport(WorkerClient)`) are
  created as decisions name workers, and pruned from the router's `GET /workers`;
- else `workers` set → an embedded `LocalRouter` following those workers' KV events itself
  (the same ingestion code as the service), transports for the workers it finds routable.

`agentserve up` (engines in the frontend's process) builds its `Backend` with `in_process`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry

from agentserve.config import ConfigError, FrontendConfig, RouterConfig
from agentserve.router.core import OverloadedError, Router
from agentserve.router.dispatch import ClientTransport, Dispatcher, EngineTransport, WorkerTransport
from agentserve.router.ingest import DEAD
from agentserve.router.local import EngineRouter, LocalRouter
from agentserve.router.placement import Decision, NoWorkerError, RouteRequest
from agentserve.router.wire import (
    Encoding,
    decode_routed,
    encode_route,
    encode_ticket,
    encode_worker,
    media_type,
)
from agentserve.worker.client import WorkerClient
from agentserve.worker.engine import Engine
from agentserve.worker.http1 import Http1Pool, HttpConnectionError

log = logging.getLogger("agentserve.router")

REFRESH_S = 5.0  # how often the remote worker list is re-read (to close clients of gone workers)


class RouterUnavailableError(ConnectionError):
    """The router service cannot be reached or answered with an unexpected error."""


class WorkerRegistry:
    """One `ClientTransport(WorkerClient)` per worker URL, kept while the worker is known."""

    def __init__(self, client_factory: Callable[[str], WorkerClient] = WorkerClient) -> None:
        self.client_factory = client_factory
        self._urls: dict[str, str] = {}
        self._transports: dict[str, ClientTransport] = {}
        self._clients: dict[str, WorkerClient] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def transports(self) -> Mapping[str, WorkerTransport]:
        return self._transports

    def ensure(self, worker: str, url: str) -> None:
        if self._urls.get(worker) == url:
            return
        self.drop(worker)
        client = self.client_factory(url)
        self._urls[worker] = url
        self._clients[worker] = client
        self._transports[worker] = ClientTransport(client)

    def drop(self, worker: str) -> None:
        self._urls.pop(worker, None)
        self._transports.pop(worker, None)
        client = self._clients.pop(worker, None)
        if client is not None:
            # Streams still open on it keep their connections; only idle ones close.
            task = asyncio.get_running_loop().create_task(client.aclose())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def sync(self, workers: Mapping[str, str]) -> None:
        """Make the registry exactly `workers` (id -> URL)."""
        for worker in [w for w in self._urls if w not in workers]:
            self.drop(worker)
        for worker, url in workers.items():
            self.ensure(worker, url)

    async def aclose(self) -> None:
        for worker in list(self._urls):
            self.drop(worker)
        await asyncio.gather(*self._closing, return_exceptions=True)


class RouterClient:
    """The `Router` protocol over the router service (see `agentserve.router.service`)."""

    def __init__(
        self,
        base_url: str,
        *,
        encoding: Encoding = "msgpack",
        registry: WorkerRegistry | None = None,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.encoding: Encoding = encoding
        self.registry = registry if registry is not None else WorkerRegistry()
        self._pool = Http1Pool(self.base_url, connect_timeout_s=connect_timeout_s)
        self._headers = {"content-type": media_type(encoding), "accept": media_type(encoding)}

    async def _post(self, path: str, body: bytes) -> tuple[int, bytes]:
        try:
            response = await self._pool.request("POST", path, headers=self._headers, body=body)
            return response.status, await response.read()
        except HttpConnectionError as exc:
            raise RouterUnavailableError(f"router {self.base_url}: {exc}") from exc

    async def route(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Decision:
        status, body = await self._post("/route", encode_route(request, exclude, self.encoding))
        if status == 200:
            decision, url, prefill_url = decode_routed(body, self.encoding)
            if url:
                self.registry.ensure(decision.worker, url)
            plan = decision.prefill
            if prefill_url and plan is not None and plan.prefill_worker is not None:
                self.registry.ensure(plan.prefill_worker, prefill_url)
            return decision
        kind, message = _error_of(body)
        if status == 503 and kind == "no_worker":
            raise NoWorkerError(message)
        if status == 503 and kind == "overloaded":
            raise OverloadedError(message)
        raise RouterUnavailableError(f"router answered {status} {kind}: {message}")

    async def finish(self, decision: Decision) -> None:
        # Best effort: a lost finish is reclaimed by the router's ticket TTL.
        with contextlib.suppress(RouterUnavailableError):
            await self._post("/finish", encode_ticket(decision.ticket, self.encoding))

    async def worker_failed(self, worker: str) -> None:
        self.registry.drop(worker)
        with contextlib.suppress(RouterUnavailableError):
            await self._post("/worker_failed", encode_worker(worker, self.encoding))

    async def workers(self) -> list[dict[str, Any]]:
        try:
            response = await self._pool.request("GET", "/workers")
            body = await response.read()
        except HttpConnectionError as exc:
            raise RouterUnavailableError(f"router {self.base_url}: {exc}") from exc
        if response.status != 200:
            raise RouterUnavailableError(f"router answered {response.status} to /workers")
        workers = json.loads(body)["workers"]
        return list(workers)

    async def refresh(self) -> list[str]:
        """Align the worker transports with the router's routable workers; returns the workers
        the router declared dead (silent or unhealthy), whose streams should be interrupted."""
        workers = await self.workers()
        self.registry.sync({w["id"]: w["url"] for w in workers if w.get("state") == "live"})
        return [
            w["id"]
            for w in workers
            if w.get("state") != "live" and str(w.get("last_removal") or "").split(":", 1)[0] in DEAD
        ]

    async def aclose(self) -> None:
        await self._pool.aclose()
        await self.registry.aclose()

    async def __aenter__(self) -> RouterClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _error_of(body: bytes) -> tuple[str, str]:
    try:
        err = json.loads(body)["error"]
        return str(err["type"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        return "http_error", body[:200].decode("utf-8", "replace")


@dataclass
class Backend:
    """The frontend's way to its workers: build a `Dispatcher` with `dispatcher()`, close at exit."""

    router: Router
    workers: Callable[[], Mapping[str, WorkerTransport]]
    on_worker_failed: Callable[[str], None] = lambda worker: None
    wait_ready: Callable[[float], Awaitable[bool]] = field(default=lambda timeout_s: _true())
    _closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    _dispatchers: weakref.WeakSet[Dispatcher] = field(default_factory=weakref.WeakSet)

    def dispatcher(self, *, max_attempts: int = 3, max_migrations: int = 3) -> Dispatcher:
        dispatcher = Dispatcher(
            self.router,
            self.workers,
            max_attempts=max_attempts,
            max_migrations=max_migrations,
            on_worker_failed=self.on_worker_failed,
        )
        self._dispatchers.add(dispatcher)
        return dispatcher

    def interrupt(self, worker: str) -> int:
        """`worker` was declared dead: end the streams every dispatcher still has open on it."""
        return sum(d.interrupt(worker) for d in list(self._dispatchers))

    async def aclose(self) -> None:
        for dispatcher in list(self._dispatchers):
            await dispatcher.aclose()
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                await close()


async def _true() -> bool:
    return True


async def connect(config: FrontendConfig, *, registry: CollectorRegistry | None = None) -> Backend:
    """The frontend's `Backend` for its configuration (see the module docstring).

    `registry`: where an embedded router registers its metrics (the frontend's /metrics).
    Raises `ConfigError` when neither `router_url` nor `workers` is set (in-process engines are
    `in_process`'s job).
    """
    if config.router_url:
        return await remote(config.router_url)
    if config.worker_urls:
        router_config = RouterConfig.model_validate(
            {
                "block_size": config.block_size,
                "workers": list(config.worker_urls),
                "prefill_workers": list(config.prefill_worker_urls),
            }
        )
        return await embedded(router_config, registry=registry)
    raise ConfigError(
        "set router_url (a router service) or worker_urls (an embedded router) to reach workers"
    )


async def remote(url: str, *, refresh_s: float = REFRESH_S) -> Backend:
    """A `Backend` over the router service at `url`."""
    client = RouterClient(url)
    backend: Backend | None = None

    async def refresh_forever() -> None:
        while True:
            with contextlib.suppress(RouterUnavailableError, ValueError, KeyError):
                for worker in await client.refresh():
                    if backend is not None:
                        backend.interrupt(worker)
            await asyncio.sleep(refresh_s)

    refresher = asyncio.create_task(refresh_forever(), name="router-workers-refresh")

    async def wait_ready(timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            with contextlib.suppress(RouterUnavailableError, ValueError, KeyError):
                await client.refresh()
                if client.registry.transports():
                    return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.1)

    async def stop_refresh() -> None:
        refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await refresher

    backend = Backend(
        client,
        client.registry.transports,
        on_worker_failed=client.registry.drop,
        wait_ready=wait_ready,
        _closers=[client.aclose, stop_refresh],
    )
    return backend


async def embedded(config: RouterConfig, *, registry: CollectorRegistry | None = None) -> Backend:
    """A `Backend` with the router in this process, following `config`'s workers itself."""
    router = LocalRouter(config, registry=registry)
    transports = WorkerRegistry()
    backend = Backend(
        router,
        transports.transports,
        wait_ready=lambda timeout_s: router.fleet.wait_live(1, timeout_s),
        _closers=[transports.aclose, router.aclose],
    )

    def removed(worker: str, kind: str) -> None:
        if kind in DEAD:
            backend.interrupt(worker)

    router.fleet.on_change = lambda: transports.sync(router.fleet.live_urls())
    router.fleet.on_removed = removed
    await router.start()
    return backend


async def in_process(engines: Mapping[str, Engine], config: RouterConfig) -> Backend:
    """Engines in this process (`agentserve up`): routed by their own KV events, no sockets.

    The engines must be started (or start later: each joins routing once ready)."""
    router = EngineRouter(engines, config)
    await router.start()
    transports: dict[str, WorkerTransport] = {name: EngineTransport(e) for name, e in engines.items()}

    async def wait_ready(timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not router.core.workers and loop.time() < deadline:
            await asyncio.sleep(0.01)
        return bool(router.core.workers)

    return Backend(router, lambda: transports, wait_ready=wait_ready, _closers=[router.aclose])
