"""The router's state machine, without transport: KV index + placement + admission queue.

`RouterCore` is what both deployments share. Embedded in the frontend (`agentserve up`), it is fed
KV events straight from in-process engines; as the router service, from the workers' ZeroMQ
sockets, and frontends reach it over its route API (`RouterClient`). Either way callers see the
`Router` protocol: `route` a request (waiting in the priority queue while every worker is
saturated), `finish` it, and report a worker that failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from agentserve.config import RouterConfig
from agentserve.router.disagg import PrefillCandidate, decide_prefill, default_threshold
from agentserve.router.index import IndexStats, KvIndex, target
from agentserve.router.placement import Decision, NoWorkerError, Placement, RouteRequest
from agentserve.router.queue import AdmissionQueue
from agentserve.worker.engine import MEDIUM_CPU, AllCleared, BlockRemoved, BlockStored, KvEvent, KvSnapshot
from agentserve.worker.kvtransfer import kv_link
from agentserve.worker.profiles import DEFAULT_PROFILE, load_profile

# A worker's role: `both` prefills and decodes (aggregated, the default); `prefill` only prefills
# requests whose KV then moves to a decode worker; `decode` serves requests, prefilling short
# uncached spans itself (as `both` does) but never taking a remote prefill.
Role = Literal["prefill", "decode", "both"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "both")


class Router(Protocol):
    """What a frontend needs from a router, in-process or remote."""

    async def route(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Decision: ...

    async def finish(self, decision: Decision) -> None: ...

    async def worker_failed(self, worker: str) -> None: ...


class OverloadedError(RuntimeError):
    """The admission queue is full: the API answers 529 / 503 with a retry hint."""


@dataclass(frozen=True, slots=True)
class RouterStats:
    index: IndexStats
    workers: int
    queued: int
    decisions: int
    resyncs: int


class RouterCore:
    """Routing state for one set of workers. Not thread-safe: use from one event loop."""

    def __init__(self, config: RouterConfig, placement: Placement | None = None) -> None:
        self.config = config
        self.index = KvIndex()
        self.placement = placement or Placement(config)
        self._workers: list[str] = []
        # Per worker its index keys: [the worker] without attention DP, else one per rank known.
        self._targets: dict[str, list[str]] = {}
        self._queue: AdmissionQueue[asyncio.Future[None]] = AdmissionQueue(config.queue_max)
        self.decisions = 0
        self.resyncs = 0
        # Roles by worker: the static prefill pool from the configuration, others as they join.
        # The prefill pool: static URLs (ids as discovery makes them) and what discovery found.
        self._static_prefill = {w.strip().rstrip("/") for w in config.prefill_workers}
        self._prefill_pool = set(self._static_prefill)
        self._roles: dict[str, Role] = dict.fromkeys(self._prefill_pool, "prefill")
        # The prefill decision's model: the engine profile's timing and the KV link (router/disagg).
        self.timing = load_profile(config.profile or DEFAULT_PROFILE).timing
        self.kv_link = kv_link(config.kv_link)
        threshold = config.prefill_threshold_tokens
        self.prefill_threshold = default_threshold(self.timing) if threshold is None else threshold
        self.prefill_decisions: dict[str, int] = {"local": 0, "remote": 0}
        # Remote prefills not finished: ticket -> (prefill worker, its predicted prefill seconds).
        self._prefilling: dict[int, tuple[str, float]] = {}

    # -- membership --------------------------------------------------------------------------------

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(self._workers)

    def add_worker(self, worker: str, dp_rank: int | None = None, role: Role | None = None) -> None:
        """Make `worker` routable, or one more attention-DP rank of it (each rank is placed and
        indexed on its own: ranks do not share KV blocks). A `prefill` worker only takes remote
        prefills (the requests' decode goes elsewhere); `role` None keeps the role it has (from
        `prefill_workers`, or an earlier add), else `both`."""
        if role is not None:
            if role not in ROLES:
                raise ValueError(f"unknown worker role {role!r}")
            self._roles[worker] = role
        key = target(worker, dp_rank)
        keys = self._targets.setdefault(worker, [])
        if key not in keys:
            keys.append(key)
            keys.sort(key=lambda k: (len(k), k))
            self.index.add_worker(key)
        if worker not in self._workers:
            self._workers.append(worker)
            self._admit_waiting()

    def remove_worker(self, worker: str) -> None:
        """Forget a worker that left or failed: its blocks (every rank's) and in-flight load are
        purged."""
        for ticket in [t for t, (w, _) in self._prefilling.items() if w == worker]:
            del self._prefilling[ticket]
        if worker in self._workers:
            self._workers.remove(worker)
        if worker not in self._prefill_pool:
            self._roles.pop(worker, None)
        for key in self._targets.pop(worker, [worker]):
            self.index.remove_worker(key)
        self.placement.forget_worker(worker)

    def set_prefill_pool(self, workers: Iterable[str]) -> None:
        """The prefill workers discovery found (beside the static ones): their role, whenever they
        join. Workers that left the pool keep routing as they are until they leave."""
        self._prefill_pool = self._static_prefill | set(workers)
        for worker in self._prefill_pool:
            self._roles[worker] = "prefill"

    def role(self, worker: str) -> Role:
        return self._roles.get(worker, "both")

    def targets(self, worker: str) -> tuple[str, ...]:
        """`worker`'s index keys: itself, or one per attention-DP rank."""
        return tuple(self._targets.get(worker, ()))

    def held_count(self, worker: str) -> int:
        """Blocks `worker` holds, all ranks together."""
        return sum(self.index.held_count(k) for k in self._targets.get(worker, [worker]))

    # -- KV events ---------------------------------------------------------------------------------

    def apply_events(self, worker: str, events: Iterable[KvEvent], dp_rank: int | None = None) -> bool:
        """Apply a worker's (or one of its attention-DP ranks') events in order; False when a
        sequence gap means it needs `resync`."""
        index = self.index
        key = target(worker, dp_rank)
        for event in events:
            if not index.check_sequence(key, event.seq):
                return False
            if isinstance(event, BlockStored):
                index.stored(key, event.block_hashes, event.medium == MEDIUM_CPU)
            elif isinstance(event, BlockRemoved):
                index.removed(key, event.block_hashes)
            elif isinstance(event, AllCleared):
                index.clear(key)
        return True

    def resync(self, worker: str, snapshot: KvSnapshot, dp_rank: int | None = None) -> None:
        key = target(worker, dp_rank)
        self.index.resync(key, snapshot.block_hashes, snapshot.seq, snapshot.host_block_hashes)
        self.resyncs += 1

    # -- Router protocol ---------------------------------------------------------------------------

    async def route(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Decision:
        await self.admit(request.priority, exclude)
        return self.decide(request, exclude)

    async def admit(self, priority: int = 0, exclude: frozenset[str] = frozenset()) -> None:
        """Return once some worker outside `exclude` has room, waiting in the priority queue while
        all are saturated (returns without suspending when one has room)."""
        while self.saturated(exclude):
            if not [w for w in self._serving() if w not in exclude]:
                raise NoWorkerError("no worker available")
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            try:
                entry = self._queue.push(waiter, priority)
            except OverflowError as exc:
                raise OverloadedError("all workers are saturated and the queue is full") from exc
            try:
                await waiter
            finally:
                self._queue.cancel(entry)

    def decide(self, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Decision:
        """Place now, ignoring saturation (the route API and benchmarks use it directly): a decode
        worker, and where prefill workers exist, where the prompt is prefilled."""
        overlaps = self.index.overlaps(request.block_hashes) if self.config.policy == "kv" else {}
        on_host = self.index.host_overlaps(request.block_hashes, overlaps) if overlaps else {}
        targets = self._targets
        candidates = [k for w in self._serving() if w not in exclude for k in targets.get(w, (w,))]
        decision = self.placement.choose(request, candidates, overlaps, frozenset(), on_host)
        self.decisions += 1
        pool = [w for w in self._workers if self._roles.get(w) == "prefill"]
        if not pool:
            return decision  # aggregated serving: no decision to make
        prefill = [w for w in pool if w not in exclude]
        bs = self.config.block_size
        plan = decide_prefill(
            self.timing,
            self.kv_link,
            prompt_tokens=request.prompt_tokens,
            decode_cached_tokens=decision.overlap_blocks * bs,
            decoding=max(0, self.placement.inflight(decision.worker) - 1),
            threshold=self.prefill_threshold,
            candidates=[PrefillCandidate(w, overlaps.get(w, 0) * bs, self.backlog(w)) for w in prefill],
            compare_costs=self.config.prefill_policy == "cost",
        )
        if plan.where == "remote" and plan.prefill_worker is not None:
            # The prefill worker's load until its prefill ends (the dispatcher finishes the ticket).
            ticket = self.placement.begin(plan.prefill_worker, decision.prompt_blocks)
            own = (plan.remote_ttft_s or 0.0) - plan.transfer_s - self.backlog(plan.prefill_worker)
            self._prefilling[ticket] = (plan.prefill_worker, max(0.0, own))
            plan = replace(plan, ticket=ticket)
        self.prefill_decisions[plan.where] += 1
        return replace(decision, prefill=plan)

    def backlog(self, worker: str) -> float:
        """Predicted seconds of remote prefill routed to `worker` and not finished."""
        return sum(s for w, s in self._prefilling.values() if w == worker)

    def _serving(self) -> list[str]:
        """Workers that take requests end to end (roles decode and both)."""
        return [w for w in self._workers if self._roles.get(w, "both") != "prefill"]

    async def finish(self, decision: Decision) -> None:
        self.finish_ticket(decision.ticket)

    def finish_ticket(self, ticket: int) -> None:
        self._prefilling.pop(ticket, None)
        self.placement.finish(ticket)
        self._admit_waiting()

    async def worker_failed(self, worker: str) -> None:
        self.fail_worker(worker)

    def fail_worker(self, worker: str) -> None:
        self.remove_worker(worker)
        self._admit_waiting()

    def observe_load(
        self, worker: str, requests: int, blocks: int, tracked: tuple[int, int], room: int | None = None
    ) -> None:
        """What `worker` reports it holds (see `Placement.observe`); waiters may fit now."""
        self.placement.observe(worker, requests, blocks, tracked, room)
        self._admit_waiting()

    def expire_tickets(self, max_age_s: float) -> int:
        """Stop counting requests whose caller never reported them finished (a frontend that died)."""
        expired = self.placement.expire(max_age_s)
        for ticket in [t for t in self._prefilling if not self.placement.active(t)]:
            del self._prefilling[ticket]
        if expired:
            self._admit_waiting()
        return expired

    def stats(self) -> RouterStats:
        return RouterStats(
            self.index.stats(), len(self._workers), len(self._queue), self.decisions, self.resyncs
        )

    # -- saturation --------------------------------------------------------------------------------

    def saturated(self, exclude: frozenset[str] = frozenset()) -> bool:
        limit = self.config.max_inflight_per_worker
        candidates: Sequence[str] = [w for w in self._serving() if w not in exclude]
        return not candidates or all(self.placement.inflight(w) >= limit for w in candidates)

    def _admit_waiting(self) -> None:
        # Wake waiters while some worker has room; each re-checks and re-queues if it lost the race.
        room = sum(
            max(0, self.config.max_inflight_per_worker - self.placement.inflight(w)) for w in self._serving()
        )
        while room > 0:
            waiter = self._queue.pop()
            if waiter is None:
                return
            if not waiter.done():
                waiter.set_result(None)
                room -= 1
