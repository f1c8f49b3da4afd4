"""Workers over the network behind the frontend's embedded router (`agentserve frontend`).

Per worker URL (an `agentserve worker`): a `WorkerClient` for generate, and one task that keeps the
router's view of the worker current. It reads `/info` for the worker's KV event endpoint, subscribes
(ZeroMQ SUB), takes `/kv/snapshot` as the starting point, then applies events in sequence order; a
gap or a jump back (the worker restarted) is a resync from the snapshot. A worker that stops
answering `/ready` is removed from the router (its blocks purged) and comes back when it answers
again. The dispatcher's retry-before-first-token covers the requests caught in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from agentserve.config import RouterConfig
from agentserve.router.core import RouterCore
from agentserve.router.dispatch import ClientTransport, DispatchedStream, Dispatcher, WorkerTransport
from agentserve.router.placement import RouteRequest
from agentserve.worker.client import WorkerClient, WorkerError
from agentserve.worker.engine import GenerateRequest
from agentserve.worker.kvwire import DEFAULT_TOPIC, KvWireError, decode_batch

log = logging.getLogger("agentserve.frontend")


def kv_endpoint(worker_url: str, advertised: str) -> str:
    """The worker's KV endpoint as seen from here: a wildcard bind address becomes the worker's host."""
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    scheme, sep, rest = advertised.partition("://")
    if scheme != "tcp" or not sep:
        return advertised
    bind_host, _, port = rest.rpartition(":")
    if bind_host in ("0.0.0.0", "*", "[::]", "::", ""):
        bind_host = f"[{host}]" if ":" in host else host
    return f"tcp://{bind_host}:{port}"


class WorkerSetBackend:
    """Network workers (`worker_urls`) routed by a `RouterCore` in this process."""

    def __init__(
        self,
        urls: Sequence[str],
        router_config: RouterConfig | None = None,
        *,
        poll_s: float = 2.0,
        max_attempts: int = 3,
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.router = RouterCore(router_config or RouterConfig.model_validate({}))
        self.clients = {u: WorkerClient(u) for u in self.urls}
        self._transports: dict[str, WorkerTransport] = {}  # only the workers now in the router
        self.dispatcher = Dispatcher(
            self.router, lambda: self._transports, max_attempts=max_attempts, on_worker_failed=self._lost
        )
        self._poll_s = poll_s
        self._ctx = zmq.asyncio.Context()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for url in self.urls:
            self._tasks.append(asyncio.create_task(self._follow(url), name=f"worker-{url}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for client in self.clients.values():
            await client.aclose()
        self._ctx.term()

    @property
    def ready(self) -> bool:
        return bool(self._transports)

    async def generate(self, request: GenerateRequest, route: RouteRequest) -> DispatchedStream:
        return await self.dispatcher.generate(request, route)

    def describe(self) -> dict[str, Any]:
        stats = self.router.stats()
        return {
            "router": "embedded",
            "workers": {u: {"ready": u in self._transports} for u in self.urls},
            "routed_workers": len(self.router.workers),
            "queued": stats.queued,
            "decisions": stats.decisions,
        }

    def _lost(self, url: str) -> None:
        self._transports.pop(url, None)

    async def _follow(self, url: str) -> None:
        """Keep one worker in the router while it is ready; bounded waits between attempts."""
        client = self.clients[url]
        while True:
            try:
                if await client.ready():
                    await self._serve(url, client)
            except (WorkerError, OSError, KvWireError, zmq.ZMQError, ValueError, KeyError, TypeError) as exc:
                # Unreachable, or answers we cannot read (/info, /kv/snapshot, events): not routable.
                log.warning("worker %s: %s", url, exc)
            if url in self._transports:
                self._lost(url)
                await self.router.worker_failed(url)
                log.warning("worker %s left the router", url)
            await asyncio.sleep(self._poll_s)

    async def _serve(self, url: str, client: WorkerClient) -> None:
        info = await client.info()
        endpoint = info.get("kv_events_endpoint")
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            if isinstance(endpoint, str):
                topic = info.get("kv_events_topic")
                sock.setsockopt(zmq.SUBSCRIBE, topic.encode() if isinstance(topic, str) else DEFAULT_TOPIC)
                sock.connect(kv_endpoint(url, endpoint))
            self.router.resync(url, await client.kv_snapshot())
            self.router.add_worker(url)
            self._transports[url] = ClientTransport(client)
            log.info("worker %s joined the router", url)
            await self._events(url, client, sock, subscribed=isinstance(endpoint, str))
        finally:
            sock.close(linger=0)

    async def _events(
        self, url: str, client: WorkerClient, sock: zmq.asyncio.Socket, *, subscribed: bool
    ) -> None:
        poll_ms = int(self._poll_s * 1000)
        while True:
            if subscribed and await sock.poll(poll_ms):
                frames = await sock.recv_multipart()
                if not self.router.apply_events(url, decode_batch(frames)):
                    self.router.resync(url, await client.kv_snapshot())
                continue
            if not subscribed:
                await asyncio.sleep(self._poll_s)
            if url not in self._transports or not await client.ready():
                return  # the dispatcher saw it fail, or it stopped answering
