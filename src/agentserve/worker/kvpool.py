"""A paged KV block pool with prefix reuse, retention priorities and a host tier: the simulated
engine's KV cache (pure, no I/O).

The pool has `num_blocks` GPU blocks of `block_size` tokens. A block is either unallocated, private
(allocated to one sequence and still filling, or not yet hashed), or cached: a full block known by
its chained block hash (`agentserve.prompt.hashing.block_hashes`), with a reference count. Cached
blocks whose count drops to zero stay cached (a later prompt with the same prefix reuses them) and
are evicted only when an allocation needs the room.

Eviction follows TensorRT-LLM's priority-based scheme: a released block carries a retention
priority (0..100, default 35) and an expiry; the lowest priority class goes first, least recently
released first within a class; a retention past its expiry (`now`, the caller's clock) falls back
to the default class.

With `host_blocks` > 0 an evicted GPU block spills to a host tier (LRU) instead of being dropped; a
prompt whose prefix continues on host brings those blocks back (`acquire`), which costs a transfer
rather than a recompute (the scheduler hands the count to the timing model).

Every change to the set of cached blocks is recorded as a `KvEvent` with a sequence number and the
tier (`medium`), the same stream a real engine publishes; `take_events` hands them out in order.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence

from agentserve.worker.engine import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    RETENTION_PRIORITY_DEFAULT,
    AllCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvSnapshot,
    Retention,
)

# (priority, seconds to keep it after release; None: no expiry) for one block.
BlockRetention = tuple[int, float | None]
DEFAULT_BLOCK_RETENTION: BlockRetention = (RETENTION_PRIORITY_DEFAULT, None)


def block_retentions(
    retention: Retention | None, num_blocks: int, block_size: int, prompt_len: int
) -> list[BlockRetention] | None:
    """Each full block's retention under a request's `Retention` (None: all default).

    A block takes the highest priority among the token ranges that overlap it (as TensorRT-LLM
    applies a range to every block it touches); blocks past the prompt hold generated tokens and
    take `decode_priority`.
    """
    if retention is None or (not retention.ranges and retention.decode_priority is None):
        return None
    out: list[BlockRetention] = []
    for i in range(num_blocks):
        lo, hi = i * block_size, (i + 1) * block_size
        best: BlockRetention | None = None
        if hi > prompt_len and retention.decode_priority is not None:
            best = (retention.decode_priority, retention.decode_duration_s)
        if lo < prompt_len:
            for r in retention.ranges:
                end = prompt_len if r.end is None else r.end
                if r.start < hi and lo < end and (best is None or r.priority > best[0]):
                    best = (r.priority, r.duration_s)
        out.append(best or DEFAULT_BLOCK_RETENTION)
    return out


class KvPool:
    def __init__(self, num_blocks: int, block_size: int, host_blocks: int = 0) -> None:
        if num_blocks <= 0 or block_size <= 0 or host_blocks < 0:
            raise ValueError("num_blocks and block_size must be positive, host_blocks not negative")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.host_blocks = host_blocks
        self.now = 0.0  # the caller's clock (seconds), read for retention expiry
        self._refs: dict[int, int] = {}  # GPU-cached block hash -> reference count
        # Unreferenced GPU blocks by priority class, least recently released first.
        self._free: dict[int, OrderedDict[int, None]] = {}
        self._class: dict[int, int] = {}  # unreferenced block -> its class
        self._expiry: list[tuple[float, int, int]] = []  # heap of (expires at, block, class)
        self._expires: dict[int, float] = {}  # unreferenced retained block -> its current expiry
        self._host: OrderedDict[int, None] = OrderedDict()  # host tier, least recently spilled first
        self._num_free = 0
        self._private = 0
        self._seq = 0
        self._events: list[KvEvent] = []

    # -- state ------------------------------------------------------------------------------------

    @property
    def used(self) -> int:
        """Blocks referenced by sequences (private or cached with a count above zero)."""
        return len(self._refs) - self._num_free + self._private

    @property
    def cached_free(self) -> int:
        """Blocks nobody references that still hold a reusable prefix (evictable)."""
        return self._num_free

    @property
    def retained(self) -> int:
        """Unreferenced blocks kept above the default class (retention: sessions in a tool gap, the
        shared prefix) whose retention has not run out."""
        self._expire()
        return sum(len(cls) for prio, cls in self._free.items() if prio > RETENTION_PRIORITY_DEFAULT)

    @property
    def pinned(self) -> int:
        """Of the retained blocks, those kept without expiry (the deployment-wide shared prefix); the
        rest (sessions in a tool gap) expire."""
        retained = self.retained  # expires what ran out first
        return retained - len(self._expires)

    @property
    def host_used(self) -> int:
        return len(self._host)

    @property
    def available(self) -> int:
        """Blocks an allocation can get: unallocated plus evictable."""
        return self.num_blocks - self.used

    @property
    def seq(self) -> int:
        """Sequence number of the last event recorded."""
        return self._seq

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._refs

    def on_host(self, block_hash: int) -> bool:
        return block_hash in self._host

    def refcount(self, block_hash: int) -> int:
        return self._refs.get(block_hash, 0)

    def priority_of(self, block_hash: int) -> int | None:
        """The class of an unreferenced GPU block (expired retentions already demoted)."""
        self._expire()
        return self._class.get(block_hash)

    def snapshot(self) -> KvSnapshot:
        return KvSnapshot(self._seq, self.block_size, tuple(self._refs), tuple(self._host))

    def take_events(self) -> list[KvEvent]:
        events, self._events = self._events, []
        return events

    # -- operations -------------------------------------------------------------------------------

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a chained hash list are cached in either tier."""
        return self.match_tiers(hashes)[0]

    def match_tiers(self, hashes: Sequence[int]) -> tuple[int, int]:
        """(leading blocks cached in either tier, how many of them are on host)."""
        n = on_host = 0
        refs, host = self._refs, self._host
        for h in hashes:
            if h in refs:
                pass
            elif h in host:
                on_host += 1
            else:
                break
            n += 1
        return n, on_host

    def acquire(self, hashes: Sequence[int]) -> bool:
        """Reference cached blocks (all must be in a tier); they can no longer be evicted.

        Host blocks come back to GPU first (False, and nothing changed, when the GPU lacks the
        room for them); a `stored` event with medium gpu records each run brought back.
        """
        refs, host = self._refs, self._host
        back = [h for h in hashes if h not in refs]
        idle = sum(1 for h in hashes if refs.get(h) == 0)  # evictable now, referenced below
        if len(back) + idle > self.available:
            return False
        for h in hashes:
            count = refs.get(h)
            if count is None:
                continue
            if count == 0:
                self._unfree(h)
            refs[h] = count + 1
        if back:
            for h in back:
                del host[h]  # out of the host tier first: spills below must not push them out
            self._make_room(len(back))
            run: list[int] = []
            run_parent: int | None = None
            prev: int | None = None
            for h in hashes:
                if h in refs:
                    if run:
                        self._stored(run, run_parent, MEDIUM_GPU)
                        run = []
                else:
                    if not run:
                        run_parent = prev
                    run.append(h)
                    refs[h] = 1
                prev = h
            if run:
                self._stored(run, run_parent, MEDIUM_GPU)
        return True

    def allocate(self, n: int) -> bool:
        """Reserve `n` private blocks, evicting unreferenced blocks (lowest priority, oldest) if needed."""
        if n <= 0:
            return True
        if n > self.available:
            return False
        self._make_room(n)
        self._private += n
        return True

    def free(self, n: int) -> None:
        """Return `n` private blocks."""
        if n > self._private:
            raise ValueError("freeing more private blocks than allocated")
        self._private -= n

    def commit(self, hashes: Sequence[int], parent: int | None) -> None:
        """Turn `len(hashes)` private blocks, now full, into cached blocks referenced once.

        `hashes` continue the chain after `parent`. A block whose hash is already cached (another
        sequence computed the same prefix meanwhile) is shared instead and the private copy freed;
        a copy held on host is dropped from it (the GPU copy supersedes it). Runs of newly cached
        blocks are recorded as `stored` events.
        """
        if len(hashes) > self._private:
            raise ValueError("committing more blocks than privately allocated")
        self._private -= len(hashes)
        run: list[int] = []
        run_parent = parent
        prev = parent
        for h in hashes:
            count = self._refs.get(h)
            if count is None:
                if not run:
                    run_parent = prev
                run.append(h)
                self._refs[h] = 1
                self._host.pop(h, None)
            else:
                if run:
                    self._stored(run, run_parent, MEDIUM_GPU)
                    run = []
                if count == 0:
                    self._unfree(h)
                self._refs[h] = count + 1
            prev = h
        if run:
            self._stored(run, run_parent, MEDIUM_GPU)

    def release(self, hashes: Sequence[int], retentions: Sequence[BlockRetention] | None = None) -> None:
        """Drop one reference to each block of a chain; unreferenced blocks become evictable.

        `retentions[i]` is block i's (priority, duration) from the request's retention (None: the
        default class); the last release of a shared block decides its class. The chain's last
        block is released first so it sits older in its class
        than its parents: eviction takes the tail of a prefix before its head.
        """
        for i in range(len(hashes) - 1, -1, -1):
            h = hashes[i]
            count = self._refs[h] - 1
            self._refs[h] = count
            if count == 0:
                prio, duration = retentions[i] if retentions is not None else DEFAULT_BLOCK_RETENTION
                if prio != RETENTION_PRIORITY_DEFAULT and duration is not None:
                    at = self.now + duration
                    self._expires[h] = at
                    heapq.heappush(self._expiry, (at, h, prio))
                self._put_free(h, prio)

    def clear(self) -> None:
        """Drop every cached block in both tiers (nothing may be referenced) and record `cleared`."""
        if self.used:
            raise ValueError("cannot clear a pool with referenced blocks")
        self._refs.clear()
        self._free.clear()
        self._class.clear()
        self._expiry.clear()
        self._expires.clear()
        self._host.clear()
        self._num_free = 0
        self._events.append(AllCleared(self._next_seq()))

    # -- internals --------------------------------------------------------------------------------

    def _put_free(self, h: int, prio: int) -> None:
        cls = self._free.get(prio)
        if cls is None:
            cls = self._free[prio] = OrderedDict()
        cls[h] = None
        self._class[h] = prio
        self._num_free += 1

    def _unfree(self, h: int) -> None:
        self._expires.pop(h, None)
        prio = self._class.pop(h)
        del self._free[prio][h]
        self._num_free -= 1

    def _expire(self) -> None:
        """Demote blocks whose retention ran out to the default class (as least recently used)."""
        heap, now = self._expiry, self.now
        while heap and heap[0][0] <= now:
            at, h, prio = heapq.heappop(heap)
            if self._class.get(h) != prio or self._expires.get(h) != at:
                continue  # referenced again, evicted, or re-released (a later expiry) since
            del self._expires[h]
            del self._free[prio][h]
            self._class[h] = RETENTION_PRIORITY_DEFAULT
            default = self._free.setdefault(RETENTION_PRIORITY_DEFAULT, OrderedDict())
            default[h] = None
            default.move_to_end(h, last=False)

    def _make_room(self, n: int) -> None:
        """Evict until `n` GPU blocks are unallocated (the caller checked `available`)."""
        evict = n - (self.num_blocks - len(self._refs) - self._private)
        if evict <= 0:
            return
        self._expire()
        removed: list[int] = []
        for _ in range(evict):
            prio = min(p for p, cls in self._free.items() if cls)
            h, _none = self._free[prio].popitem(last=False)
            del self._class[h]
            del self._refs[h]
            self._expires.pop(h, None)
            removed.append(h)
        self._num_free -= evict
        if not self.host_blocks:
            self._events.append(BlockRemoved(self._next_seq(), tuple(removed), MEDIUM_GPU))
            return
        # Spill to host; the host tier drops its oldest blocks to make room.
        host = self._host
        spilled = removed[-self.host_blocks :]
        lost = removed[: len(removed) - len(spilled)]
        overflow = len(host) + len(spilled) - self.host_blocks
        dropped = [host.popitem(last=False)[0] for _ in range(max(overflow, 0))]
        if lost:
            self._events.append(BlockRemoved(self._next_seq(), tuple(lost), MEDIUM_GPU))
        if dropped:
            self._events.append(BlockRemoved(self._next_seq(), tuple(dropped), MEDIUM_CPU))
        for h in spilled:
            host[h] = None
        self._stored(spilled, None, MEDIUM_CPU)

    def _stored(self, run: list[int], parent: int | None, medium: str) -> None:
        self._events.append(
            BlockStored(self._next_seq(), tuple(run), parent, len(run) * self.block_size, medium)
        )

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq
