"""A paged KV block pool with prefix reuse: the simulated engine's KV cache (pure, no I/O).

The pool has `num_blocks` blocks of `block_size` tokens. A block is either unallocated, private
(allocated to one sequence and still filling, or not yet hashed), or cached: a full block known by
its chained block hash (`agentserve.prompt.hashing.block_hashes`), with a reference count. Cached
blocks whose count drops to zero stay cached (a later prompt with the same prefix reuses them) on
an LRU list and are evicted, oldest first, only when an allocation needs the room.

Every change to the set of cached blocks is recorded as a `KvEvent` with a sequence number, the
same stream a real engine publishes; `take_events` hands them out in order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from agentserve.worker.engine import AllCleared, BlockRemoved, BlockStored, KvEvent, KvSnapshot


class KvPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refs: dict[int, int] = {}  # cached block hash -> reference count
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks with count 0, oldest first
        self._private = 0
        self._seq = 0
        self._events: list[KvEvent] = []

    # -- state ------------------------------------------------------------------------------------

    @property
    def used(self) -> int:
        """Blocks referenced by sequences (private or cached with a count above zero)."""
        return len(self._refs) - len(self._lru) + self._private

    @property
    def cached_free(self) -> int:
        """Blocks nobody references that still hold a reusable prefix (evictable)."""
        return len(self._lru)

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

    def refcount(self, block_hash: int) -> int:
        return self._refs.get(block_hash, 0)

    def snapshot(self) -> KvSnapshot:
        return KvSnapshot(self._seq, self.block_size, tuple(self._refs))

    def take_events(self) -> list[KvEvent]:
        events, self._events = self._events, []
        return events

    # -- operations -------------------------------------------------------------------------------

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a chained hash list are cached (the reusable prefix)."""
        n = 0
        refs = self._refs
        for h in hashes:
            if h not in refs:
                break
            n += 1
        return n

    def acquire(self, hashes: Sequence[int]) -> None:
        """Reference cached blocks (all must be cached); they can no longer be evicted."""
        for h in hashes:
            count = self._refs[h]
            if count == 0:
                del self._lru[h]
            self._refs[h] = count + 1

    def allocate(self, n: int) -> bool:
        """Reserve `n` private blocks, evicting least recently used free blocks if needed."""
        if n <= 0:
            return True
        if n > self.available:
            return False
        unallocated = self.num_blocks - len(self._refs) - self._private
        evict = n - unallocated
        if evict > 0:
            removed = []
            for _ in range(evict):
                h, _none = self._lru.popitem(last=False)
                del self._refs[h]
                removed.append(h)
            self._events.append(BlockRemoved(self._next_seq(), tuple(removed)))
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
        sequence computed the same prefix meanwhile) is shared instead and the private copy freed.
        Runs of newly cached blocks are recorded as `stored` events.
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
            else:
                if run:
                    self._stored(run, run_parent)
                    run = []
                if count == 0:
                    del self._lru[h]
                self._refs[h] = count + 1
            prev = h
        if run:
            self._stored(run, run_parent)

    def release(self, hashes: Sequence[int]) -> None:
        """Drop one reference to each block of a chain; unreferenced blocks become evictable.

        The chain's last block is released first so it sits older on the LRU list than its
        parents: eviction takes the tail of a prefix before its head, keeping the head reusable.
        """
        for h in reversed(hashes):
            count = self._refs[h] - 1
            self._refs[h] = count
            if count == 0:
                self._lru[h] = None

    def clear(self) -> None:
        """Drop every cached block (nothing may be referenced) and record `cleared`."""
        if self.used:
            raise ValueError("cannot clear a pool with referenced blocks")
        self._refs.clear()
        self._lru.clear()
        self._events.append(AllCleared(self._next_seq()))

    # -- events -----------------------------------------------------------------------------------

    def _stored(self, run: list[int], parent: int | None) -> None:
        self._events.append(BlockStored(self._next_seq(), tuple(run), parent, len(run) * self.block_size))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq
