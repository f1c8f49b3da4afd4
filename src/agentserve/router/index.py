"""The router's view of which worker holds which KV blocks, built from the workers' KV events.

Each block hash identifies a whole prefix (hashes are chained), so a worker's useful cache for a
request is the number of the request's *leading* blocks it holds. The index maps a block hash to a
bitmask of worker slots; a lookup walks the request's hashes once, narrowing the mask, so its cost
grows with the request's blocks and the worker count, never with the size of the index.

Keys are workers, or one attention-DP rank of a worker (`target`): ranks cache apart.

Per key it tracks the events' sequence numbers: a gap means events were lost, and the worker's
entries can no longer be trusted until it is resynced from the worker's snapshot.

A block a worker holds in its host tier (KV events with medium "cpu") counts as held, with its bit
also set in a second map: `host_overlaps` says how many of a worker's leading blocks must come back
from host memory, which the placement prices between a GPU hit and a miss.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Attention data parallelism: each rank of a worker holds its own KV cache, so the index keys blocks by
# (worker, rank). A key is the worker id itself for a worker without ranks, else the id and the rank
# joined by a separator no URL or pod name contains.
_RANK_SEP = "\x1f"


def target(worker: str, dp_rank: int | None) -> str:
    """The index key of `worker`'s attention-DP rank (`worker` itself without ranks)."""
    return worker if dp_rank is None else f"{worker}{_RANK_SEP}{dp_rank}"


def split_target(key: str) -> tuple[str, int | None]:
    """(worker, attention-DP rank or None) of an index key."""
    worker, sep, rank = key.rpartition(_RANK_SEP)
    return (worker, int(rank)) if sep else (key, None)


@dataclass(frozen=True, slots=True)
class IndexStats:
    blocks: int  # distinct block hashes indexed
    entries: int  # (worker, block) pairs
    workers: int
    dropped: int  # stored blocks refused because the index was full


class KvIndex:
    __slots__ = (
        "_blocks",
        "_dropped",
        "_entries",
        "_free_slots",
        "_held",
        "_host",
        "_last_seq",
        "_slot",
        "max_entries",
    )

    def __init__(self, max_entries: int = 4_000_000) -> None:
        self.max_entries = max_entries  # bound on (worker, block) pairs: memory stays bounded
        self._blocks: dict[int, int] = {}  # block hash -> bitmask of worker slots
        self._host: dict[int, int] = {}  # block hash -> bitmask of the slots holding it on host
        self._held: dict[str, set[int]] = {}  # worker -> block hashes it holds
        self._slot: dict[str, int] = {}  # worker -> bit position
        self._free_slots: list[int] = []
        self._last_seq: dict[str, int] = {}
        self._entries = 0
        self._dropped = 0

    # -- workers -----------------------------------------------------------------------------------

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(self._slot)

    def add_worker(self, worker: str) -> None:
        if worker in self._slot:
            return
        slot = self._free_slots.pop() if self._free_slots else len(self._slot)
        self._slot[worker] = slot
        self._held[worker] = set()

    def remove_worker(self, worker: str) -> None:
        """Forget a worker and purge its blocks (it stopped answering or publishing)."""
        if worker not in self._slot:
            return
        self.clear(worker)
        self._free_slots.append(self._slot.pop(worker))
        del self._held[worker]
        self._last_seq.pop(worker, None)

    # -- events ------------------------------------------------------------------------------------

    def held(self, worker: str) -> frozenset[int]:
        """The block hashes `worker` holds (a copy: for inspection, not the hot path)."""
        return frozenset(self._held.get(worker, ()))

    def held_count(self, worker: str) -> int:
        return len(self._held.get(worker, ()))

    def last_seq(self, worker: str) -> int | None:
        """Sequence number of the last event applied for `worker` (None: none yet)."""
        return self._last_seq.get(worker)

    def check_sequence(self, worker: str, seq: int) -> bool:
        """Record event `seq` of `worker`; False if events were missed (the worker needs a resync)."""
        last = self._last_seq.get(worker)
        self._last_seq[worker] = seq
        return last is None or seq == last + 1

    def stored(self, worker: str, hashes: Iterable[int], on_host: bool = False) -> None:
        """`worker` now holds these blocks, on GPU or (`on_host`) in its host tier: a block it
        already held moved between tiers."""
        self.add_worker(worker)
        bit = 1 << self._slot[worker]
        held = self._held[worker]
        blocks = self._blocks
        host = self._host
        for h in hashes:
            if on_host:
                host[h] = host.get(h, 0) | bit
            elif h in host:
                self._clear_host(h, bit)
            if h in held:
                continue
            if self._entries >= self.max_entries:
                self._dropped += 1
                if on_host:
                    self._clear_host(h, bit)
                continue
            held.add(h)
            blocks[h] = blocks.get(h, 0) | bit
            self._entries += 1

    def removed(self, worker: str, hashes: Iterable[int]) -> None:
        held = self._held.get(worker)
        if held is None:
            return
        mask = ~(1 << self._slot[worker])
        blocks = self._blocks
        host = self._host
        for h in hashes:
            if h not in held:
                continue
            if h in host:
                self._clear_host(h, ~mask)
            held.discard(h)
            self._entries -= 1
            rest = blocks[h] & mask
            if rest:
                blocks[h] = rest
            else:
                del blocks[h]

    def clear(self, worker: str) -> None:
        held = self._held.get(worker)
        if held:
            self.removed(worker, list(held))

    def resync(self, worker: str, hashes: Iterable[int], seq: int, host_hashes: Iterable[int] = ()) -> None:
        """Replace everything known about `worker` with its snapshot taken at event `seq`."""
        self.add_worker(worker)
        self.clear(worker)
        self.stored(worker, hashes)
        self.stored(worker, host_hashes, on_host=True)
        self._last_seq[worker] = seq

    def _clear_host(self, h: int, bit: int) -> None:
        rest = self._host[h] & ~bit
        if rest:
            self._host[h] = rest
        else:
            del self._host[h]

    # -- lookup ------------------------------------------------------------------------------------

    def overlaps(self, hashes: Sequence[int]) -> dict[str, int]:
        """For each worker, how many leading blocks of `hashes` it holds."""
        result = dict.fromkeys(self._slot, 0)
        by_slot = {slot: w for w, slot in self._slot.items()}
        mask = 0
        for slot in by_slot:
            mask |= 1 << slot
        blocks = self._blocks
        for depth, h in enumerate(hashes):
            held = blocks.get(h, 0) & mask
            if held != mask:  # these workers' runs of leading blocks end here
                _credit(mask & ~held, depth, by_slot, result)
                if not held:
                    return result
            mask = held
        _credit(mask, len(hashes), by_slot, result)
        return result

    def host_overlaps(self, hashes: Sequence[int], overlaps: dict[str, int]) -> dict[str, int]:
        """For each worker with a host tier hit, how many of its leading `overlaps[worker]` blocks
        of `hashes` it holds on host (workers with none are left out)."""
        host = self._host
        if not host:
            return {}
        result: dict[str, int] = {}
        slots = self._slot
        for worker, depth in overlaps.items():
            bit = 1 << slots[worker]
            n = sum(1 for h in hashes[:depth] if host.get(h, 0) & bit)
            if n:
                result[worker] = n
        return result

    def stats(self) -> IndexStats:
        return IndexStats(len(self._blocks), self._entries, len(self._slot), self._dropped)


def _credit(bits: int, depth: int, by_slot: dict[int, str], result: dict[str, int]) -> None:
    while bits:
        low = bits & -bits
        worker = by_slot.get(low.bit_length() - 1)
        if worker is not None:
            result[worker] = depth
        bits ^= low
