"""Workers' KV events into the router, over ZeroMQ, with liveness: the I/O edge of `sync.WorkerSync`.

`Fleet` holds one member per discovered worker (`update` applies a discovery result). A member's
life is a loop:

1. **probe** `GET /ready` every `health_interval_s` until the worker answers;
2. **subscribe**: a ZeroMQ SUB socket on the worker's KV endpoint (from discovery, or its
   `/info`); batches received before the snapshot are held;
3. **resync** from `GET /kv/snapshot` once the first message arrived — a message proves the
   subscription is in place, so nothing published after the snapshot can be missed — then
   replay the held batches (`WorkerSync` drops what the snapshot covers). The worker is routable
   from here on. A later gap (lost events) resyncs the same way without leaving the fleet;
4. **watch**: the session ends, and the worker is removed from the core (blocks purged, in-flight
   load forgotten), when the socket is silent for `kv_events_timeout_s` (workers send a heartbeat
   every 0.5 s while idle: silence means the publisher or its process is gone), when two
   consecutive `/ready` probes fail, or when a frontend reports it failed (`report_failed`).
   Then back to 1: a worker that comes back is resynced and routable again.

The same code feeds the router service and a frontend that embeds the router. Receiving drains
every queued message per wake-up, so a burst costs one await, not one per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import zmq
import zmq.asyncio

from agentserve.router.core import RouterCore
from agentserve.router.discovery import WorkerEndpoint, diff, kv_endpoint_for
from agentserve.router.sync import BlockSizeMismatchError, IngestCounters, WorkerSync
from agentserve.worker.client import WorkerClient
from agentserve.worker.engine import EngineError, KvSnapshot
from agentserve.worker.kvwire import DEFAULT_TOPIC, KvWireError, decode_message, topic_rank

log = logging.getLogger("agentserve.router")

HEALTH_FAILURES = 2  # consecutive failed /ready probes that remove a worker
# Removals that mean the worker is gone or hung (not merely reported by one frontend): streams
# still open on it will never end by themselves, so frontends interrupt them.
DEAD = frozenset({"silent", "unhealthy"})
DRAIN_MAX = 4096  # messages handled per wake-up before yielding to the event loop


class WorkerProbe(Protocol):
    """What a member needs from a worker's HTTP API (`WorkerClient` has it)."""

    async def ready(self) -> bool: ...

    async def kv_snapshot(self) -> KvSnapshot: ...

    # (Optional, `WorkerClient` has them: `kv_snapshot(dp_rank)` for workers with attention-DP
    # ranks, `load()` for the in-flight view a restarted router rebuilds.)

    async def info(self) -> dict[str, object]: ...

    async def aclose(self) -> None: ...


class State(StrEnum):
    PROBING = "probing"  # waiting for /ready
    SYNCING = "syncing"  # subscribed, first snapshot pending: not routable yet
    LIVE = "live"  # routable (a resync after a gap keeps it live)


@dataclass(frozen=True, slots=True)
class MemberView:
    id: str
    url: str
    kv_endpoint: str | None
    state: State
    since: float  # time.time() of the last state change
    last_removal: str | None  # why the last session ended


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and wait for them, cancelling again any that swallowed the cancellation
    (Python 3.11's `asyncio.wait_for` can, when its inner call completes at the same moment)."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(50):  # bounded: 5 s at most
        if not pending:
            return
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.1)


class _SessionEnd(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Fleet:
    def __init__(
        self,
        core: RouterCore,
        *,
        kv_events_timeout_s: float = 5.0,
        health_interval_s: float = 1.0,
        snapshot_timeout_s: float = 10.0,
        client_factory: Callable[[str], WorkerProbe] = WorkerClient,
        context: zmq.asyncio.Context | None = None,
        on_change: Callable[[], None] = lambda: None,
        on_removed: Callable[[str, str], None] = lambda worker, reason: None,
    ) -> None:
        self.core = core
        self.kv_events_timeout_s = kv_events_timeout_s
        self.health_interval_s = health_interval_s
        self.snapshot_timeout_s = snapshot_timeout_s
        self.client_factory = client_factory
        self.on_change = on_change  # membership or a routable set changed (transport registries)
        self.on_removed = on_removed  # (worker, reason kind) after a routable worker was removed
        self.counters = IngestCounters()
        self.removals: Counter[str] = Counter()  # reason -> count
        self._own_context = context is None
        self._ctx = context or zmq.asyncio.Context()
        self._members: dict[str, _Member] = {}
        self._retired: set[asyncio.Task[None]] = set()  # stopped members still winding down
        self._closed = False

    # -- membership --------------------------------------------------------------------------------

    def update(self, endpoints: Mapping[str, WorkerEndpoint] | Iterable[WorkerEndpoint]) -> None:
        """Make the members the given workers (a discovery result): start, stop or reconnect."""
        if self._closed:
            return
        new = dict(endpoints) if isinstance(endpoints, Mapping) else {e.id: e for e in endpoints}
        change = diff({w: m.endpoint for w, m in self._members.items()}, new)
        for worker in change.removed:
            self._retire(self._members.pop(worker))
        for endpoint in change.changed:
            self._retire(self._members.pop(endpoint.id))
        for endpoint in (*change.added, *change.changed):
            self._members[endpoint.id] = _Member(self, endpoint)
        if not change.empty:
            log.info(
                "workers: +%d -%d ~%d (now %d)",
                len(change.added),
                len(change.removed),
                len(change.changed),
                len(self._members),
            )
            self.on_change()

    def report_failed(self, worker: str) -> None:
        """A frontend could not reach `worker`: end its session now (it re-probes and resyncs)."""
        member = self._members.get(worker)
        if member is not None and member.state is not State.PROBING:
            member.reported.set()
            member._set(State.PROBING)  # not routable from now, though its session ends a bit later

    def url(self, worker: str) -> str | None:
        member = self._members.get(worker)
        return member.endpoint.url if member is not None else None

    def live_urls(self) -> dict[str, str]:
        """Routable workers: id -> URL."""
        return {w: m.endpoint.url for w, m in self._members.items() if m.state is State.LIVE}

    def members(self) -> list[MemberView]:
        return [m.view() for m in self._members.values()]

    async def wait_live(self, count: int = 1, timeout_s: float = 30.0) -> bool:
        """Wait until at least `count` workers are routable (startup, tests)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.live_urls()) >= count:
                return True
            await asyncio.sleep(0.02)
        return len(self.live_urls()) >= count

    async def aclose(self) -> None:
        self._closed = True
        members, self._members = list(self._members.values()), {}
        for member in members:
            self._retire(member)
        await cancel_all(list(self._retired))
        if self._own_context:
            self._ctx.destroy(linger=0)  # closes any socket still open, never blocks

    def _retire(self, member: _Member) -> None:
        member.stop()
        self._retired.add(member.task)
        member.task.add_done_callback(self._retired.discard)

    # -- called by members -------------------------------------------------------------------------

    def _removed(self, worker: str, reason: str) -> None:
        self.core.remove_worker(worker)
        kind = reason.split(":", 1)[0]
        self.removals[kind] += 1
        log.warning("worker %s removed: %s", worker, reason)
        self.on_change()
        self.on_removed(worker, kind)


class _Member:
    def __init__(self, fleet: Fleet, endpoint: WorkerEndpoint) -> None:
        self.fleet = fleet
        self.endpoint = endpoint
        self.state = State.PROBING
        self.since = time.time()
        self.last_removal: str | None = None
        self.joined = False  # this session made the worker routable (its removal is counted)
        self.reported = asyncio.Event()
        self.stopped = False
        self.task = asyncio.create_task(self._run(), name=f"worker-{endpoint.id}")

    def view(self) -> MemberView:
        e = self.endpoint
        return MemberView(e.id, e.url, e.kv_endpoint, self.state, self.since, self.last_removal)

    def stop(self) -> None:
        self.stopped = True  # also ends the loops should a cancellation be swallowed
        self.task.cancel()

    def _set(self, state: State) -> None:
        if state is not self.state:
            self.state = state
            self.since = time.time()
            self.fleet.on_change()

    async def _run(self) -> None:
        fleet = self.fleet
        client = fleet.client_factory(self.endpoint.url)
        try:
            while not self.stopped:
                self._set(State.PROBING)
                await self._until_ready(client)
                try:
                    await self._session(client)
                except _SessionEnd as end:
                    reason = end.reason
                self.last_removal = reason
                self._set(State.PROBING)
                if self.joined:
                    fleet._removed(self.endpoint.id, reason)
                else:
                    fleet.core.remove_worker(self.endpoint.id)
                    log.info("worker %s not synced: %s", self.endpoint.id, reason)
                self.reported.clear()
                await asyncio.sleep(fleet.health_interval_s)
        finally:
            fleet.core.remove_worker(self.endpoint.id)
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _probe(self, client: WorkerProbe) -> bool:
        try:
            return await asyncio.wait_for(client.ready(), self.fleet.health_interval_s)
        except (TimeoutError, OSError, EngineError):
            return False

    async def _until_ready(self, client: WorkerProbe) -> None:
        while not await self._probe(client):
            if self.stopped:
                raise asyncio.CancelledError
            await asyncio.sleep(self.fleet.health_interval_s)

    async def _session(self, client: WorkerProbe) -> None:
        """Subscribe, resync, follow: returns only by raising `_SessionEnd` with the reason."""
        fleet = self.fleet
        kv = self.endpoint.kv_endpoint
        topic = DEFAULT_TOPIC
        if kv is None:
            try:
                info = await asyncio.wait_for(client.info(), fleet.snapshot_timeout_s)
                advertised = info.get("kv_events_endpoint")
                if not isinstance(advertised, str):
                    raise _SessionEnd("no kv events: the worker publishes none (/info)")
                kv = kv_endpoint_for(self.endpoint.url, advertised)
                if isinstance(info.get("kv_events_topic"), str):
                    topic = str(info["kv_events_topic"]).encode()
            except (TimeoutError, OSError, EngineError, ValueError) as exc:
                raise _SessionEnd(f"info failed: {exc!r}") from exc
        sock = fleet._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 1_000_000)
        sock.setsockopt(zmq.SUBSCRIBE, topic)
        sock.connect(kv)
        syncs: dict[int | None, WorkerSync] = {}
        self.joined = False
        self._set(State.SYNCING)
        tasks = [
            asyncio.create_task(self._receive(sock, syncs, topic, client)),
            asyncio.create_task(self._health(client)),
            asyncio.create_task(self._reported()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # raises the _SessionEnd
            raise _SessionEnd("session ended")  # unreachable: every task ends by raising
        finally:
            sock.close(linger=0)  # first: the await below may be interrupted by a cancellation
            await cancel_all(tasks)

    async def _receive(
        self, sock: zmq.asyncio.Socket, syncs: dict[int | None, WorkerSync], topic: bytes, client: WorkerProbe
    ) -> None:
        """Follow the worker's KV events: one `WorkerSync` per stream, i.e. per attention-DP rank
        (the message's topic names it; a worker without ranks has one stream)."""
        fleet = self.fleet
        loop = asyncio.get_running_loop()
        timeout = fleet.kv_events_timeout_s
        heard = loop.time()
        raw: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)  # plain non-blocking reads
        while True:
            remaining = timeout - (loop.time() - heard)
            if remaining <= 0:
                raise _SessionEnd(f"silent: no KV events or heartbeat for {timeout:g} s")
            if not await sock.poll(remaining * 1000):
                continue
            heard = loop.time()
            for _ in range(DRAIN_MAX):
                try:
                    frames = raw.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    rank = topic_rank(frames[0], topic) if frames else None
                    first, events = decode_message(frames)
                    sync = syncs.get(rank)
                    if sync is None:
                        if rank is not None:
                            # An engine with ranks: a plain-topic stream seen before its first
                            # event (a heartbeat of the publisher's idle start) is not one.
                            plain = syncs.get(None)
                            if plain is not None and not plain.member:
                                del syncs[None]
                        elif not events and any(r is not None for r in syncs):
                            continue
                        sync = WorkerSync(fleet.core, self.endpoint.id, fleet.counters, dp_rank=rank)
                        syncs[rank] = sync
                except KvWireError as exc:
                    log.warning("worker %s sent a bad KV message (%s); resyncing", self.endpoint.id, exc)
                    for each in syncs.values():
                        each.request_resync()
                    continue
                sync.on_message(first, events)
            for sync in list(syncs.values()):
                if sync.wants_snapshot:
                    await self._resync(sync, client)

    async def _resync(self, sync: WorkerSync, client: WorkerProbe) -> None:
        try:
            if sync.dp_rank is None:
                fetch = client.kv_snapshot()
            else:
                fetch = client.kv_snapshot(sync.dp_rank)  # type: ignore[call-arg]
            snapshot = await asyncio.wait_for(fetch, self.fleet.snapshot_timeout_s)
            sync.on_snapshot(snapshot)
        except BlockSizeMismatchError as exc:
            raise _SessionEnd(f"misconfigured: {exc}") from exc
        except (TimeoutError, OSError, EngineError, KeyError, ValueError) as exc:
            raise _SessionEnd(f"snapshot failed: {exc!r}") from exc
        if not self.joined:
            await self._observe_load(client)  # before the first route: what the worker runs now
        self.joined = True
        if not self.reported.is_set():
            self._set(State.LIVE)

    async def _observe_load(self, client: WorkerProbe) -> None:
        """Tell the placement how many requests the worker holds, from the worker itself: a router
        that restarted (or one replica of several) sees load it never routed."""
        load = getattr(client, "load", None)
        if load is None:
            return
        placement = self.fleet.core.placement
        tracked = placement.tracked(self.endpoint.id)  # as the question leaves (see `observe`)
        try:
            current = await asyncio.wait_for(load(), self.fleet.health_interval_s)
        except (TimeoutError, OSError, EngineError, TypeError, ValueError, KeyError):
            return
        core = self.fleet.core
        if self.stopped or self.endpoint.id not in core.workers:
            return  # removed meanwhile: its load was forgotten with it
        # Room a subagent can take without evicting retained KV (router/placement.py, trees).
        room = current.kv_blocks_total - current.kv_blocks_used - current.kv_blocks_retained
        core.observe_load(
            self.endpoint.id, current.running + current.waiting, current.kv_blocks_used, tracked, room
        )

    async def _health(self, client: WorkerProbe) -> None:
        failures = 0
        readiness = getattr(client, "readiness", None)  # WorkerClient's; test fakes may lack it
        while not self.stopped:
            await asyncio.sleep(self.fleet.health_interval_s)
            if readiness is None:
                ok = await self._probe(client)
            else:
                try:
                    state = await asyncio.wait_for(readiness(), self.fleet.health_interval_s)
                except (TimeoutError, OSError, EngineError):
                    state = "not_ready"
                if state == "draining":
                    # Not dead: route around it, and let its open streams finish there.
                    raise _SessionEnd("draining: the worker is shutting down")
                ok = state == "ready"
            failures = 0 if ok else failures + 1
            if ok and self.joined:
                await self._observe_load(client)
            if failures >= HEALTH_FAILURES:
                raise _SessionEnd(f"unhealthy: {failures} /ready probes failed")

    async def _reported(self) -> None:
        await self.reported.wait()
        raise _SessionEnd("reported: a frontend could not reach it")
