"""WorkerSync: a worker's KV events reconciled with its snapshots, by sequence number.

The property test drives a real `KvPool` (the sim's cache, which numbers its events as engines
do) and plays every delivery a subscriber can see: joining late, losing messages, snapshots taken
some time after they were asked for, with the events published meanwhile arriving either before
the snapshot (held) or after it (stale). Whatever happens, the router must end up with exactly
the pool's blocks.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agentserve.config import RouterConfig
from agentserve.router.core import RouterCore
from agentserve.router.sync import BlockSizeMismatchError, WorkerSync
from agentserve.worker.engine import AllCleared, BlockRemoved, BlockStored, KvEvent, KvSnapshot
from agentserve.worker.kvpool import KvPool

BS = 4


def core() -> RouterCore:
    return RouterCore(RouterConfig(block_size=BS))


def stored(seq: int, *hashes: int) -> BlockStored:
    return BlockStored(seq, hashes, None, len(hashes) * BS)


def snap(seq: int, *hashes: int) -> KvSnapshot:
    return KvSnapshot(seq, BS, hashes)


def feed(sync: WorkerSync, *events: KvEvent) -> None:
    sync.on_message(events[0].seq, list(events))


def test_not_routable_until_the_first_snapshot_and_held_events_replay_after_it() -> None:
    c = core()
    sync = WorkerSync(c, "w")
    feed(sync, stored(5, 1))  # covered by the snapshot below
    feed(sync, stored(6, 2), BlockRemoved(7, (1,)))  # after it
    assert c.workers == () and sync.wants_snapshot
    sync.on_snapshot(snap(5, 1, 9))
    assert c.workers == ("w",) and sync.live
    assert c.index.held("w") == {2, 9}
    assert c.index.last_seq("w") == 7
    assert sync.counters.resyncs == 1 and sync.counters.events == 2


def test_events_published_after_the_snapshot_but_numbered_before_it_are_stale() -> None:
    c = core()
    sync = WorkerSync(c, "w")
    sync.on_snapshot(snap(10, 1, 2))
    feed(sync, BlockRemoved(9, (1,)), stored(10, 2), stored(11, 3))  # 9 and 10 are in the snapshot
    assert c.index.held("w") == {1, 2, 3}
    assert sync.counters.stale == 2 and not sync.wants_snapshot


def test_a_jump_forward_asks_for_a_snapshot_and_holds_until_it() -> None:
    c = core()
    sync = WorkerSync(c, "w")
    sync.on_snapshot(snap(1))
    feed(sync, stored(2, 1))
    feed(sync, stored(5, 4))  # 3 and 4 were lost
    assert sync.wants_snapshot and sync.counters.gaps == 1
    assert c.workers == ("w",)  # still routable meanwhile, on what it knew
    feed(sync, stored(6, 5))
    assert 4 not in c.index.held("w")
    sync.on_snapshot(snap(5, 1, 3, 4))
    assert c.index.held("w") == {1, 3, 4, 5} and sync.live


def test_a_heartbeat_past_the_last_event_reveals_lost_trailing_events() -> None:
    c = core()
    sync = WorkerSync(c, "w")
    sync.on_snapshot(snap(3))
    sync.on_message(4, [])  # next is 4: nothing lost
    assert not sync.wants_snapshot
    sync.on_message(3, [])  # an old heartbeat (raced the snapshot): harmless
    assert not sync.wants_snapshot
    sync.on_message(6, [])  # events 4 and 5 went out and never arrived
    assert sync.wants_snapshot


def test_a_restart_resets_the_worker_even_below_the_last_number() -> None:
    c = core()
    sync = WorkerSync(c, "w")
    sync.on_snapshot(snap(40, 1, 2, 3))
    feed(sync, AllCleared(1), stored(2, 7))  # the engine restarted: numbering starts over
    assert c.index.held("w") == {7}
    assert c.index.last_seq("w") == 2
    assert sync.counters.restarts == 1 and not sync.wants_snapshot
    feed(sync, stored(3, 8))
    assert c.index.held("w") == {7, 8}


def test_the_hold_buffer_is_bounded_and_a_hole_it_leaves_asks_for_another_snapshot() -> None:
    c = core()
    sync = WorkerSync(c, "w", max_held_events=2)
    feed(sync, stored(1, 1))
    feed(sync, stored(2, 2))
    feed(sync, stored(3, 3))  # pushes out event 1
    assert sync.counters.dropped == 1
    sync.on_snapshot(snap(0))  # older than the dropped event: the replay sees the hole
    assert sync.wants_snapshot
    sync.on_snapshot(snap(3, 1, 2, 3))
    assert sync.live and c.index.held("w") == {1, 2, 3}


def test_a_worker_with_another_block_size_is_refused() -> None:
    sync = WorkerSync(core(), "w")
    with pytest.raises(BlockSizeMismatchError, match="block_size"):
        sync.on_snapshot(KvSnapshot(1, BS * 2, ()))
    assert sync.core.workers == ()


# -- property: any delivery converges to the pool's state ------------------------------------------


def pool_history(ops: list[tuple[int, list[int], bool]]) -> tuple[list[list[KvEvent]], list[KvSnapshot]]:
    """Batches of events from a real pool driven by `ops`, and the snapshot after each batch."""
    pool = KvPool(num_blocks=12, block_size=BS)
    pool.clear()
    batches, snapshots = [pool.take_events()], [pool.snapshot()]
    referenced: list[list[int]] = []
    for n_release, chain, keep in ops:
        for _ in range(min(n_release, len(referenced))):
            pool.release(referenced.pop(0))
        chain = [h for h in dict.fromkeys(chain) if h not in pool][:4]
        if chain and pool.allocate(len(chain)):
            pool.commit(chain, None)
            if keep:
                referenced.append(chain)
            else:
                pool.release(chain)
        events = pool.take_events()
        if events:
            batches.append(events)
            snapshots.append(pool.snapshot())
    return batches, snapshots


ops_strategy = st.lists(
    st.tuples(st.integers(0, 2), st.lists(st.integers(1, 30), min_size=1, max_size=4), st.booleans()),
    min_size=1,
    max_size=40,
)


@given(
    ops=ops_strategy,
    join=st.integers(0, 50),
    lost=st.one_of(st.just(set()), st.sets(st.integers(0, 50), max_size=6)),
    lose_last=st.booleans(),
    timing=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=8
    ),
)
@example(  # events published after the snapshot reach us before its reply: held, then replayed
    ops=[(0, [1], False), (0, [2], False), (0, [3], False), (0, [4], False)],
    join=0,
    lost=set(),
    lose_last=False,
    timing=[(0, 2, 2)],
)
def test_any_delivery_converges_to_the_workers_blocks(
    ops: list[tuple[int, list[int], bool]],
    join: int,
    lost: set[int],
    lose_last: bool,
    timing: list[tuple[int, int, int]],
) -> None:
    batches, snapshots = pool_history(ops)
    last = len(batches) - 1
    if lose_last:
        lost = lost | {last}  # only the heartbeat can reveal this loss
    c = core()
    sync = WorkerSync(c, "w")
    pending: list[int] = []  # messages received, not yet processed (in order)
    i = 0  # next message to publish

    def publish() -> None:
        nonlocal i
        if i >= join and i not in lost:
            pending.append(i)
        i += 1

    def process() -> None:
        m = pending.pop(0)
        sync.on_message(batches[m][0].seq, batches[m])

    asks = 0
    while i <= last or pending:
        if i <= last:
            publish()
            if not pending:
                continue
        process()
        if sync.wants_snapshot:
            # Asked now; the worker takes the snapshot `lag` publications later, publishes `early`
            # more before its reply arrives, and `hold` of the messages received by then are
            # processed (held) before the reply, the rest after it.
            lag, early, hold = timing[asks % len(timing)]
            asks += 1
            while i <= min(i - 1 + lag, last):
                publish()
            taken = i - 1
            for _ in range(early):
                if i <= last:
                    publish()
            for _ in range(min(hold, len(pending))):
                process()
            sync.on_snapshot(snapshots[taken])
    # The publisher's idle heartbeat, then a last resync if it revealed a loss (or is the first
    # message this subscriber ever got).
    sync.on_message(snapshots[last].seq + 1, [])
    if sync.wants_snapshot:
        sync.on_snapshot(snapshots[last])
    assert sync.live
    assert c.index.held("w") == set(snapshots[last].block_hashes)
    assert c.index.last_seq("w") == snapshots[last].seq
    if not lost or join > last:
        assert sync.counters.gaps == 0  # nothing lost: one snapshot, never a resync for a gap
