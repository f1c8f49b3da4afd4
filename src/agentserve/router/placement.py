"""Choosing a worker for a request: follow the cache, weigh the load, keep sessions together.

`kv` cost of a worker = overlap_weight × (prompt blocks it would have to prefill (not cached there)
                                         + host_hit_weight × cached blocks it holds only on host)
                      + load_weight × blocks its in-flight requests occupy (prompt + expected output).
The lowest cost wins (temperature 0), or a worker is sampled by softmax over normalised costs.
Ties go to the worker the session last used, while that affinity is fresh. An in-flight request
counts its prompt blocks plus its expected output (`agent_hints.osl`, else a default) so that long
generations weigh on a worker before they have produced anything.

Subagent trees (docs/subagents.md): a request that names its parent session (a subagent's turn)
keeps the parent's affinity fresh, so the parent returns to its worker however long its children
run; and where the parent's worker lacks the room the child would take (free blocks beyond those
running requests use and those retained for sessions, from the workers' load reports) while
another candidate has it, the blocks the child would push out of retention there are priced like
a miss (they will be recomputed when the parent resumes). Siblings follow their shared prefix by
the overlap term like every request.

`round-robin`, `random` and `least-loaded` exist for comparison (bench/routing.py).
Pure: time and randomness are injected.
"""

from __future__ import annotations

import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count

from agentserve.config import RouterConfig
from agentserve.router.disagg import PrefillPlan
from agentserve.router.index import split_target

DEFAULT_OSL_TOKENS = 256  # expected output when the request gives no osl hint


@dataclass(frozen=True, slots=True)
class RouteRequest:
    block_hashes: Sequence[int]
    prompt_tokens: int
    session_id: str | None = None
    priority: int = 0
    osl: int | None = None  # expected output length in tokens (agent_hints.osl)
    parent_session_id: str | None = None  # a subagent's turn: the session waiting on it


@dataclass(frozen=True, slots=True)
class Decision:
    worker: str
    overlap_blocks: int  # leading prompt blocks already cached on the worker
    prompt_blocks: int
    cost: float
    policy: str
    ticket: int  # pass to Placement.finish when the request completes
    costs: Mapping[str, float] = field(default_factory=dict)
    # The attention-DP rank of `worker` chosen (None: the worker has no ranks); the worker pins
    # the request to it.
    dp_rank: int | None = None
    # Where the prompt is prefilled (None: no prefill workers, the decode worker prefills it).
    prefill: PrefillPlan | None = None


class NoWorkerError(RuntimeError):
    """No worker can take the request (none registered, or all excluded)."""


@dataclass(slots=True)
class _InFlight:
    target: str  # the worker, or one attention-DP rank of it (index.target)
    worker: str
    blocks: int
    since: float


class Placement:
    def __init__(
        self,
        config: RouterConfig,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_sessions: int = 100_000,
    ) -> None:
        self.config = config
        self._rng = rng or random.Random()
        self._clock = clock
        # A random start keeps tickets of different router replicas apart: one that reaches the
        # wrong replica (a frontend's connection moved) finishes nothing there.
        self._tickets = count(self._rng.getrandbits(62))
        self._inflight: dict[int, _InFlight] = {}
        self._load: dict[str, int] = {}  # target (worker or worker rank) -> in-flight blocks
        self._worker_load: dict[str, int] = {}  # worker -> in-flight blocks, all ranks
        self._requests: dict[str, int] = {}  # worker -> in-flight requests
        # Load the workers report that this router did not route (requests, KV blocks): what a
        # restarted router, or one replica among several, rebuilds its view from (`observe`).
        self._untracked: dict[str, tuple[int, int]] = {}
        # Blocks a worker can allocate without evicting retained KV (its last load report; absent:
        # not known, and then no worker is priced for it).
        self._room: dict[str, int] = {}
        self._affinity: OrderedDict[str, tuple[str, float]] = OrderedDict()  # session -> (worker, expiry)
        self._max_sessions = max_sessions
        self._rr = 0

    # -- load --------------------------------------------------------------------------------------

    def load(self, worker: str) -> int:
        """Blocks that requests on `worker` occupy now: those routed here (prompt + expected
        output, all ranks) plus the untracked ones the worker reported."""
        return self._worker_load.get(worker, 0) + self._untracked.get(worker, (0, 0))[1]

    def inflight(self, worker: str) -> int:
        """Requests on `worker`: those this router routed there and has not seen finish, plus
        those the worker reported beyond them (another replica's, or from before a restart)."""
        return self._requests.get(worker, 0) + self._untracked.get(worker, (0, 0))[0]

    def tracked(self, worker: str) -> tuple[int, int]:
        """(requests, blocks) this router routed to `worker` and has not seen finish."""
        return self._requests.get(worker, 0), self._worker_load.get(worker, 0)

    def observe(
        self, worker: str, requests: int, blocks: int, tracked: tuple[int, int], room: int | None = None
    ) -> None:
        """The worker's own count of the requests it holds (running + waiting) and the KV blocks
        they use, asked when this router tracked `tracked` (= `self.tracked(worker)` then).

        Tickets die with a router process; the worker's count does not. What the worker holds
        beyond this router's tickets is load routed elsewhere (another replica, or this one
        before it restarted): it counts until the next report replaces it, so a restarted router
        starts from what the worker really runs. Comparing with the tickets of the moment of the
        question (not of the answer) keeps a request that finished meanwhile from counting twice.
        `room`: blocks it can allocate without evicting retained KV (total − used − retained)."""
        if room is not None:
            self._room[worker] = max(0, room)
        extra = (max(0, requests - tracked[0]), max(0, blocks - tracked[1]))
        if extra == (0, 0):
            self._untracked.pop(worker, None)
        else:
            self._untracked[worker] = extra

    def expire(self, max_age_s: float) -> int:
        """Finish tickets older than `max_age_s` (their caller vanished without `finish`)."""
        cutoff = self._clock() - max_age_s
        old = [t for t, f in self._inflight.items() if f.since < cutoff]
        for ticket in old:
            self.finish(ticket)
        return len(old)

    def forget_worker(self, worker: str) -> None:
        self._room.pop(worker, None)
        for ticket in [t for t, f in self._inflight.items() if f.worker == worker]:
            self.finish(ticket)
        for session in [s for s, (w, _) in self._affinity.items() if split_target(w)[0] == worker]:
            del self._affinity[session]
        self._untracked.pop(worker, None)

    # -- decisions ---------------------------------------------------------------------------------

    def choose(
        self,
        request: RouteRequest,
        workers: Sequence[str],
        overlaps: Mapping[str, int],
        exclude: frozenset[str] = frozenset(),
        host_overlaps: Mapping[str, int] | None = None,
    ) -> Decision:
        candidates = [w for w in workers if w not in exclude]
        if not candidates:
            raise NoWorkerError("no worker available")
        bs = self.config.block_size
        prompt_blocks = -(-request.prompt_tokens // bs)
        policy = self.config.policy
        costs: dict[str, float] = {}
        parent_worker = self._hold_parent(request.parent_session_id)
        if policy == "round-robin":
            worker = candidates[self._rr % len(candidates)]
            self._rr += 1
        elif policy == "random":
            worker = self._rng.choice(candidates)
        else:
            for w in candidates:
                load = self._target_load(w)
                if policy == "least-loaded":
                    costs[w] = float(load)
                else:
                    cached = min(overlaps.get(w, 0), prompt_blocks)
                    uncached: float = prompt_blocks - cached
                    if host_overlaps:
                        # A host hit is a copy back (~2 µs/token), not a recompute (~15+ µs/token).
                        uncached += self.config.host_hit_weight * min(host_overlaps.get(w, 0), cached)
                    costs[w] = self.config.overlap_weight * uncached + self.config.load_weight * load
            if parent_worker is not None and policy == "kv":
                self._spare_parent(costs, parent_worker, request, overlaps, prompt_blocks)
            worker = self._select(costs, request.session_id)
        overlap = min(overlaps.get(worker, 0), prompt_blocks)
        osl = request.osl if request.osl is not None else DEFAULT_OSL_TOKENS
        ticket = self.begin(worker, prompt_blocks + -(-osl // bs))
        self._remember(request.session_id, worker)
        pod, rank = split_target(worker)
        return Decision(pod, overlap, prompt_blocks, costs.get(worker, 0.0), policy, ticket, costs, rank)

    def active(self, ticket: int) -> bool:
        """`ticket` is counted (not finished, not expired)."""
        return ticket in self._inflight

    def finish(self, ticket: int) -> None:
        """The request of `ticket` completed (or failed): its blocks stop counting as load."""
        flight = self._inflight.pop(ticket, None)
        if flight is None:
            return
        self._load[flight.target] -= flight.blocks
        self._worker_load[flight.worker] -= flight.blocks
        self._requests[flight.worker] -= 1

    def begin(self, target: str, blocks: int) -> int:
        """Count `blocks` as load on `target` until `finish(ticket)` (a request placed there)."""
        ticket = next(self._tickets)
        worker = split_target(target)[0]
        self._inflight[ticket] = _InFlight(target, worker, blocks, self._clock())
        self._load[target] = self._load.get(target, 0) + blocks
        self._worker_load[worker] = self._worker_load.get(worker, 0) + blocks
        self._requests[worker] = self._requests.get(worker, 0) + 1
        return ticket

    def _target_load(self, target: str) -> int:
        own = self._load.get(target, 0)
        if not self._untracked:
            return own
        worker, rank = split_target(target)
        untracked = self._untracked.get(worker)
        if untracked is None or rank is not None:  # a worker's report does not say which rank
            return own
        return own + untracked[1]

    def _select(self, costs: dict[str, float], session: str | None) -> str:
        sticky = self._sticky_worker(session)
        temperature = self.config.temperature
        if temperature > 0 and len(costs) > 1:
            # Softmax over costs normalised to [0, 1], so temperature means the same at any scale.
            lo, hi = min(costs.values()), max(costs.values())
            span = (hi - lo) or 1.0
            weights = [math.exp(-(c - lo) / span / temperature) for c in costs.values()]
            return self._rng.choices(list(costs), weights)[0]
        best = min(costs.values())
        tied = [w for w, c in costs.items() if c <= best + 1e-9]
        if sticky in tied:
            return sticky
        return tied[0] if len(tied) == 1 else self._rng.choice(tied)

    # -- subagent trees ----------------------------------------------------------------------------

    def _hold_parent(self, parent: str | None) -> str | None:
        """The parent's worker, its affinity refreshed: it holds for as long as children keep coming."""
        worker = self._sticky_worker(parent)
        if worker is not None:
            self._remember(parent, worker)
        return worker

    def _spare_parent(
        self,
        costs: dict[str, float],
        parent_target: str,
        request: RouteRequest,
        overlaps: Mapping[str, int],
        prompt_blocks: int,
    ) -> None:
        """Price the retained blocks a child would evict on its parent's worker, when another
        candidate has the room to take it without evicting any."""
        bs = self.config.block_size
        osl = request.osl if request.osl is not None else DEFAULT_OSL_TOKENS

        def needs(target: str) -> int:
            return prompt_blocks - min(overlaps.get(target, 0), prompt_blocks) + -(-osl // bs)

        parent_worker = split_target(parent_target)[0]
        room = self._room.get(parent_worker)
        if room is None:
            return
        for target in costs:
            if split_target(target)[0] != parent_worker:
                continue
            pushed_out = needs(target) - room
            elsewhere = any(
                split_target(t)[0] != parent_worker and self._room.get(split_target(t)[0], -1) >= needs(t)
                for t in costs
            )
            if pushed_out > 0 and elsewhere:
                costs[target] += self.config.overlap_weight * pushed_out

    # -- session affinity --------------------------------------------------------------------------

    def _sticky_worker(self, session: str | None) -> str | None:
        if session is None:
            return None
        entry = self._affinity.get(session)
        if entry is None:
            return None
        worker, expiry = entry
        if expiry < self._clock():
            del self._affinity[session]
            return None
        return worker

    def _remember(self, session: str | None, worker: str) -> None:
        if session is None or self.config.affinity_ttl_s <= 0:
            return
        self._affinity[session] = (worker, self._clock() + self.config.affinity_ttl_s)
        self._affinity.move_to_end(session)
        while len(self._affinity) > self._max_sessions:
            self._affinity.popitem(last=False)
