from __future__ import annotations

import pytest

from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import AllCleared, BlockRemoved, BlockStored
from agentserve.worker.kvpool import KvPool

BS = 4


def chain(start: int, blocks: int) -> list[int]:
    return block_hashes(list(range(start, start + blocks * BS)), BS)


def store(pool: KvPool, hashes: list[int]) -> None:
    assert pool.allocate(len(hashes))
    pool.commit(hashes, None)


def test_commit_records_one_stored_event_per_run_with_parent_and_token_count() -> None:
    pool = KvPool(8, BS)
    hashes = chain(0, 3)
    store(pool, hashes[:1])
    assert pool.allocate(2)
    pool.commit(hashes[1:], hashes[0])
    events = pool.take_events()
    assert events == [
        BlockStored(1, (hashes[0],), None, BS),
        BlockStored(2, tuple(hashes[1:]), hashes[0], 2 * BS),
    ]
    assert pool.take_events() == []
    assert pool.used == 3
    assert pool.snapshot().block_hashes == tuple(hashes)
    assert pool.snapshot().seq == 2


def test_commit_of_an_already_cached_block_shares_it_and_splits_the_run() -> None:
    pool = KvPool(8, BS)
    hashes = chain(0, 3)
    store(pool, hashes[1:2])  # block 1 cached alone (as if another sequence computed it)
    pool.take_events()
    assert pool.allocate(3)
    pool.commit(hashes, None)
    assert pool.refcount(hashes[1]) == 2
    assert pool.used == 3  # the private copy of block 1 was freed
    assert pool.take_events() == [
        BlockStored(2, (hashes[0],), None, BS),
        BlockStored(3, (hashes[2],), hashes[1], BS),
    ]


def test_match_counts_the_cached_prefix_only() -> None:
    pool = KvPool(8, BS)
    hashes = chain(0, 4)
    store(pool, hashes[:2])
    assert pool.match(hashes) == 2
    assert pool.match(chain(100, 4)) == 0
    assert pool.match(hashes[1:]) == 1


def test_released_blocks_stay_cached_until_evicted_tail_first() -> None:
    pool = KvPool(4, BS)
    a = chain(0, 3)
    store(pool, a)
    pool.release(a)
    assert pool.used == 0 and pool.cached_free == 3 and pool.available == 4
    pool.take_events()
    # One unallocated block, then the LRU: a's last block goes first, its head survives longest.
    assert pool.allocate(2)
    assert pool.take_events() == [BlockRemoved(2, (a[2],))]
    assert pool.match(a) == 2
    assert pool.allocate(1)
    assert pool.take_events() == [BlockRemoved(3, (a[1],))]
    assert pool.match(a) == 1


def test_acquired_blocks_are_not_evicted_and_allocation_fails_when_full() -> None:
    pool = KvPool(3, BS)
    a = chain(0, 2)
    store(pool, a)
    pool.release(a)
    pool.acquire(a[:1])
    assert pool.used == 1
    assert pool.allocate(2)  # one unallocated + evict a[1]
    assert a[0] in pool and a[1] not in pool
    assert not pool.allocate(1)
    pool.free(2)
    assert pool.available == 2


def test_lru_order_follows_last_release() -> None:
    pool = KvPool(2, BS)
    a, b = chain(0, 1), chain(50, 1)
    store(pool, a)
    store(pool, b)
    pool.release(a)
    pool.release(b)
    pool.acquire(a)  # a used again: most recent once released
    pool.release(a)
    pool.take_events()
    assert pool.allocate(1)
    assert pool.take_events() == [BlockRemoved(3, tuple(b))]


def test_clear_drops_everything_and_needs_no_references() -> None:
    pool = KvPool(4, BS)
    a = chain(0, 2)
    store(pool, a)
    with pytest.raises(ValueError, match="referenced"):
        pool.clear()
    pool.release(a)
    pool.take_events()
    pool.clear()
    assert pool.take_events() == [AllCleared(2)]
    assert pool.snapshot().block_hashes == ()
    assert pool.available == 4


def test_misuse_is_rejected() -> None:
    pool = KvPool(2, BS)
    with pytest.raises(ValueError):
        pool.free(1)
    with pytest.raises(ValueError):
        pool.commit(chain(0, 1), None)
    with pytest.raises(ValueError):
        KvPool(0, BS)
