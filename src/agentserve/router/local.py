"""A router in this process: routing state fed by KV events, behind the `Router` protocol.

`LocalRouter` is the router service's heart (the HTTP app only translates), and a frontend with a
worker list and no router URL embeds the very same object: core + fleet (ZeroMQ ingestion,
liveness) + discovery + metrics.

`EngineRouter` is the `agentserve up` shape: engines in this process, their KV events read
straight from `Engine.kv_events()` through the same `WorkerSync`, no sockets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry

from agentserve.config import ConfigError, RouterConfig
from agentserve.eventloop import cancel_and_wait
from agentserve.router.core import OverloadedError, RouterCore
from agentserve.router.discovery import KubeWatcher, WorkerEndpoint, static_endpoints
from agentserve.router.ingest import Fleet
from agentserve.router.metrics import RouterMetrics
from agentserve.router.placement import Decision, NoWorkerError, RouteRequest
from agentserve.router.sync import IngestCounters, WorkerSync
from agentserve.worker.engine import Engine, KvSnapshot
from agentserve.worker.kvwire import split_by_rank

log = logging.getLogger("agentserve.router")

TICKET_SWEEP_S = 30.0
RATE_INTERVAL_S = 1.0
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class LocalRouter:
    def __init__(self, config: RouterConfig, *, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.core = RouterCore(config)
        self.fleet = Fleet(
            self.core,
            kv_events_timeout_s=config.kv_events_timeout_s,
            health_interval_s=config.health_interval_s,
        )
        self.metrics = RouterMetrics(self.core, self.fleet, registry)
        self._watcher: KubeWatcher | None = None
        self._prefill_watcher: KubeWatcher | None = None  # the prefill pool's Service (disaggregation)
        self._found: dict[str, dict[str, WorkerEndpoint]] = {"decode": {}, "prefill": {}}
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start discovery and the housekeeping tasks (workers become routable as they sync)."""
        config = self.config
        if config.discovery == "kubernetes":
            if not config.worker_service:
                raise ConfigError("discovery: kubernetes needs worker_service (the workers' Service)")
            namespace = config.namespace or _pod_namespace()
            self._watcher = KubeWatcher(namespace, config.worker_service, self._decode_found)
            self._watcher.start()
            if config.prefill_worker_service:
                self._prefill_watcher = KubeWatcher(
                    namespace, config.prefill_worker_service, self._prefill_found
                )
                self._prefill_watcher.start()
        else:
            try:
                self.fleet.update(static_endpoints([*config.workers, *config.prefill_workers]))
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        self._tasks = [
            asyncio.create_task(self._sweep_tickets(), name="router-tickets"),
            asyncio.create_task(self._sample_rate(), name="router-rate"),
        ]

    async def aclose(self) -> None:
        await cancel_and_wait(self._tasks)
        if self._watcher is not None:
            await self._watcher.aclose()
        if self._prefill_watcher is not None:
            await self._prefill_watcher.aclose()
        await self.fleet.aclose()

    def _decode_found(self, endpoints: dict[str, WorkerEndpoint]) -> None:
        self._found["decode"] = endpoints
        self.fleet.update({**self._found["decode"], **self._found["prefill"]})

    def _prefill_found(self, endpoints: dict[str, WorkerEndpoint]) -> None:
        self._found["prefill"] = endpoints
        self.core.set_prefill_pool(endpoints)
        self.fleet.update({**self._found["decode"], **self._found["prefill"]})

    async def _sweep_tickets(self) -> None:
        while True:
            await asyncio.sleep(min(TICKET_SWEEP_S, self.config.ticket_ttl_s))
            expired = self.core.expire_tickets(self.config.ticket_ttl_s)
            if expired:
                log.warning("%d routed requests were never reported finished; stopped counting them", expired)

    async def _sample_rate(self) -> None:
        counters = self.fleet.counters
        while True:
            self.metrics.rate.sample(time.monotonic(), counters.events, counters.blocks)
            await asyncio.sleep(RATE_INTERVAL_S)

    # -- Router protocol ---------------------------------------------------------------------------

    async def route(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Decision:
        return await _route(self.core, self.metrics, request, exclude)

    async def finish(self, decision: Decision) -> None:
        await self.core.finish(decision)

    async def worker_failed(self, worker: str) -> None:
        self.report_failed(worker)

    def report_failed(self, worker: str) -> None:
        self.core.fail_worker(worker)
        self.fleet.report_failed(worker)  # it re-probes and, if it answers, resyncs

    def url(self, worker: str) -> str | None:
        return self.fleet.url(worker)


async def _route(
    core: RouterCore, metrics: RouterMetrics | None, request: RouteRequest, exclude: frozenset[str]
) -> Decision:
    wait: float | None = None
    try:
        if core.saturated(exclude):
            t0 = time.perf_counter()
            await core.admit(request.priority, exclude)
            wait = time.perf_counter() - t0
        t1 = time.perf_counter()
        decision = core.decide(request, exclude)
        decide_s = time.perf_counter() - t1
    except NoWorkerError:
        if metrics is not None:
            metrics.route_errors.labels("no_worker").inc()
        raise
    except OverloadedError:
        if metrics is not None:
            metrics.route_errors.labels("overloaded").inc()
        raise
    if metrics is not None:
        metrics.observe(decision, decide_s, wait)
    return decision


def _pod_namespace() -> str:
    try:
        return _SA_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


class EngineRouter:
    """Routing over engines in this process (`agentserve up`): events from `Engine.kv_events()`.

    Each engine joins the core once its subscription is open and its snapshot applied. An engine
    reported failed is resynced at once if it is still ready (the failure was the request's),
    otherwise it leaves routing until it is ready again.
    """

    def __init__(self, engines: Mapping[str, Engine], config: RouterConfig) -> None:
        self.config = config
        self.engines = dict(engines)
        self.core = RouterCore(config)
        self.counters = IngestCounters()
        self._syncs: dict[str, WorkerSync] = {}
        self._rank_syncs: dict[str, dict[int | None, WorkerSync]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for name, engine in self.engines.items():
            self._tasks.append(asyncio.create_task(self._follow(name, engine), name=f"kv-{name}"))
        for _ in range(500):  # the subscriptions open on the tasks' first run (bounded wait)
            if len(self._syncs) == len(self.engines) or not any(e.ready for e in self.engines.values()):
                break
            await asyncio.sleep(0.002)

    async def aclose(self) -> None:
        await cancel_and_wait(self._tasks)

    async def _follow(self, name: str, engine: Engine) -> None:
        while True:
            while not engine.ready:
                await asyncio.sleep(0.1)
            events = engine.kv_events()  # subscribe first: nothing after the snapshot is missed
            ranks: list[int | None] = list(range(getattr(engine, "dp_ranks", 1)))
            if len(ranks) == 1:
                ranks = [None]
            # One sync per attention-DP rank (each rank's events are numbered on their own).
            syncs = {r: WorkerSync(self.core, name, self.counters, dp_rank=r) for r in ranks}
            for rank, sync in syncs.items():
                sync.on_snapshot(_snapshot(engine, rank))
            self._syncs[name] = syncs[ranks[0]]
            self._rank_syncs[name] = syncs
            async for batch in events:
                for rank, part in split_by_rank(batch).items() if batch else ():
                    rank_sync = syncs.get(rank)
                    if rank_sync is not None:
                        rank_sync.on_message(part[0].seq, part)
                for rank, sync in syncs.items():
                    if sync.wants_snapshot:
                        sync.on_snapshot(_snapshot(engine, rank))
            # The subscription ended: the engine stopped.
            self._syncs.pop(name, None)
            self._rank_syncs.pop(name, None)
            self.core.remove_worker(name)

    async def route(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Decision:
        return await _route(self.core, None, request, exclude)

    async def finish(self, decision: Decision) -> None:
        await self.core.finish(decision)

    async def worker_failed(self, worker: str) -> None:
        await self.core.worker_failed(worker)
        engine, syncs = self.engines.get(worker), self._rank_syncs.get(worker)
        if engine is not None and syncs is not None and engine.ready:
            for rank, sync in syncs.items():
                sync.member = False  # rejoin with a fresh snapshot
                sync.on_snapshot(_snapshot(engine, rank))


def _snapshot(engine: Engine, dp_rank: int | None) -> KvSnapshot:
    return engine.kv_snapshot() if dp_rank is None else engine.kv_snapshot(dp_rank)
