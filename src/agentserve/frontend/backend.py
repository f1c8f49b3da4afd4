"""What the frontend generates on: a dispatcher over routed workers, with a lifecycle.

`Backend` is the frontend's one dependency on the rest of the stack. `EngineBackend` is the
embedded deployment (`agentserve up`, tests, benchmarks): engines in this process, an embedded
`RouterCore` fed their KV events by one task per engine, and a `Dispatcher` over
`EngineTransport`s. `RoutedBackend` is the network deployment (`agentserve frontend`): workers
reached through `agentserve.router.remote` — a router service (`router_url`) or a router embedded
here that follows `worker_urls` by their ZeroMQ KV events — with the same dispatcher.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from agentserve.config import FrontendConfig, RouterConfig
from agentserve.eventloop import cancel_and_wait
from agentserve.router.core import Role, RouterCore
from agentserve.router.dispatch import (
    DispatchedStream,
    Dispatcher,
    EngineTransport,
    NoCapacityError,
    WorkerTransport,
)
from agentserve.router.placement import RouteRequest
from agentserve.worker.engine import Engine, GenerateRequest, KvEvent, KvTransfer, Retention

if TYPE_CHECKING:
    from agentserve.router.remote import Backend as RemoteBackend

log = logging.getLogger("agentserve.frontend")


class Backend(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    @property
    def ready(self) -> bool:
        """At least one worker can take requests."""
        ...

    async def generate(self, request: GenerateRequest, route: RouteRequest) -> DispatchedStream:
        """Route and open a request (raises `NoCapacityError`, the router's `OverloadedError`, or
        the engine's `InvalidRequestError`)."""
        ...

    def speculative_prefill(
        self, prompt_token_ids: Sequence[int], route: RouteRequest, retention: Retention | None = None
    ) -> bool:
        """Prefill a predicted prompt in the background where `route` leads (lowest priority, one
        token; `Dispatcher.speculative_prefill`), its blocks released under `retention`; False when it
        was not started."""
        ...

    def describe(self) -> dict[str, Any]:
        """A small JSON summary for `/ready` (workers, router state)."""
        ...


class EngineBackend:
    """Engines in this process behind an embedded router (`agentserve up`)."""

    def __init__(
        self,
        engines: Mapping[str, Engine],
        router_config: RouterConfig | None = None,
        *,
        max_attempts: int = 3,
        max_migrations: int = 3,
        roles: Mapping[str, Role] | None = None,
    ) -> None:
        self.engines = dict(engines)
        self.roles = dict(roles or {})  # worker -> role (absent: both)
        self.router = RouterCore(router_config or RouterConfig.model_validate({}))
        for engine in self.engines.values():
            self._connect_kv(engine)
        self._transports: dict[str, WorkerTransport] = {
            w: EngineTransport(e) for w, e in self.engines.items()
        }
        self.dispatcher = Dispatcher(
            self.router, lambda: self._transports, max_attempts=max_attempts, max_migrations=max_migrations
        )
        self._feeds: dict[str, asyncio.Task[None]] = {}
        self._companions: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._companion_tasks: list[asyncio.Task[None]] = []
        self._started = False

    def run_beside(self, companion: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `companion()` while the backend runs (the local planner), cancelled at stop."""
        self._companions.append(companion)

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        for worker, engine in self.engines.items():
            await self._start_engine(worker, engine)
        self._companion_tasks = [asyncio.create_task(c(), name="backend-companion") for c in self._companions]

    async def _start_engine(self, worker: str, engine: Engine) -> None:
        # Subscribe before the engine starts, so its first event (`cleared`, seq 1) is seen.
        events = engine.kv_events()
        self._feeds[worker] = asyncio.create_task(self._feed(worker, engine, events), name=f"kv-{worker}")
        await engine.start()
        self.router.add_worker(worker, role=self.roles.get(worker, "both"))

    def _connect_kv(self, engine: Engine) -> None:
        """Disaggregated prefill in one process: a decode engine pulls KV from a prefill engine
        directly (the transfer's `source` is the prefill engine's name)."""
        if hasattr(engine, "kv_peer") and getattr(engine, "kv_peer", None) is None:
            engine.kv_peer = self._pull

    async def _pull(self, transfer: KvTransfer) -> int | None:
        pull = getattr(self.engines.get(transfer.source), "kv_pull", None)
        return None if pull is None else await pull(transfer)

    async def add_engine(self, worker: str, engine: Engine) -> None:
        """One more in-process engine: started (a sim's model load takes its time), then routed to."""
        if worker in self.engines:
            raise ValueError(f"worker {worker!r} exists")
        self.engines[worker] = engine
        self._connect_kv(engine)
        self._transports[worker] = EngineTransport(engine)
        await self._start_engine(worker, engine)

    async def remove_engine(self, worker: str, grace_s: float = 120.0) -> None:
        """Take `worker` out: no new requests from now on, its running ones finish (within `grace_s`;
        the rest are aborted), then it stops."""
        self.router.remove_worker(worker)
        engine = self.engines[worker]
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            load = engine.load()
            if load.running + load.waiting == 0:
                break
            await asyncio.sleep(0.05)
        await engine.stop()
        feed = self._feeds.pop(worker, None)
        if feed is not None:
            await cancel_and_wait([feed])
        del self.engines[worker]
        del self._transports[worker]

    async def _feed(self, worker: str, engine: Engine, events: Any) -> None:
        batch: list[KvEvent]
        async for batch in events:
            if not self.router.apply_events(worker, batch):
                log.info("KV events of %s skipped a sequence number; resyncing from its snapshot", worker)
                self.router.resync(worker, engine.kv_snapshot())

    async def stop(self) -> None:
        tasks = [*self._companion_tasks, *self._feeds.values()]
        await cancel_and_wait(tasks)
        self._feeds.clear()
        self._companion_tasks.clear()
        for engine in self.engines.values():
            await engine.stop()
        self._started = False

    @property
    def ready(self) -> bool:
        return any(self.engines[w].ready for w in self.router.workers if w in self.engines)

    async def generate(self, request: GenerateRequest, route: RouteRequest) -> DispatchedStream:
        return await self.dispatcher.generate(request, route)

    def speculative_prefill(
        self, prompt_token_ids: Sequence[int], route: RouteRequest, retention: Retention | None = None
    ) -> bool:
        return self.dispatcher.speculative_prefill(prompt_token_ids, route, retention) is not None

    def describe(self) -> dict[str, Any]:
        stats = self.router.stats()
        return {
            "router": "embedded",
            "workers": {w: {"ready": e.ready} for w, e in self.engines.items()},
            "routed_workers": len(self.router.workers),
            "queued": stats.queued,
            "decisions": stats.decisions,
            "prefill_decisions": dict(self.router.prefill_decisions),
        }


class RoutedBackend:
    """Network workers behind `agentserve.router.remote.connect` (router service or embedded router)."""

    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.remote: RemoteBackend | None = None
        self._dispatcher: Dispatcher | None = None

    async def start(self) -> None:
        from agentserve.router.remote import connect

        self.remote = await connect(self.config)
        self._dispatcher = self.remote.dispatcher(max_migrations=self.config.migration_limit)

    async def stop(self) -> None:
        if self.remote is not None:
            await self.remote.aclose()
            self.remote = None

    @property
    def ready(self) -> bool:
        return self.remote is not None and bool(self.remote.workers())

    async def generate(self, request: GenerateRequest, route: RouteRequest) -> DispatchedStream:
        if self._dispatcher is None:
            raise NoCapacityError("the frontend is still connecting to its workers")
        return await self._dispatcher.generate(request, route)

    def speculative_prefill(
        self, prompt_token_ids: Sequence[int], route: RouteRequest, retention: Retention | None = None
    ) -> bool:
        if self._dispatcher is None:
            return False
        return self._dispatcher.speculative_prefill(prompt_token_ids, route, retention) is not None

    def describe(self) -> dict[str, Any]:
        live = sorted(self.remote.workers()) if self.remote is not None else []
        return {"router": "service" if self.config.router_url else "embedded", "workers": live}
