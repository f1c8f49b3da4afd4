"""KvPool priority classes, expiry and the host tier; the scheduler's use of them; the wire's tier."""

from __future__ import annotations

import pytest

from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import (
    BlockRemoved,
    BlockStored,
    Retention,
    TokenRangeRetention,
)
from agentserve.worker.kvpool import KvPool, block_retentions
from agentserve.worker.kvwire import KvWireError, decode_batch, encode_batch
from agentserve.worker.profiles import default_timing
from agentserve.worker.scheduler import Scheduler, SchedulerConfig, SimSequence
from agentserve.worker.timing import StepWork

BS = 4


def chain(start: int, blocks: int) -> list[int]:
    return block_hashes(list(range(start, start + blocks * BS)), BS)


def cache(pool: KvPool, hashes: list[int], prio: int = 35, duration: float | None = None) -> None:
    assert pool.allocate(len(hashes))
    pool.commit(hashes, None)
    pool.release(hashes, [(prio, duration)] * len(hashes))


def test_lowest_priority_class_is_evicted_first_then_lru_within_a_class() -> None:
    pool = KvPool(6, BS)
    high, low_old, low_new = chain(0, 2), chain(100, 2), chain(200, 2)
    cache(pool, high, 80)
    cache(pool, low_old, 35)
    cache(pool, low_new, 35)
    pool.take_events()
    assert pool.allocate(3)
    # The two default-class chains go first, the older one entirely, then the newer one's tail.
    assert all(h not in pool for h in low_old)
    assert low_new[0] in pool and low_new[1] not in pool
    assert all(h in pool for h in high)
    assert pool.take_events() == [BlockRemoved(4, (low_old[1], low_old[0], low_new[1]))]


def test_expired_retention_falls_back_to_the_default_class() -> None:
    pool = KvPool(4, BS)
    kept, plain = chain(0, 2), chain(100, 2)
    cache(pool, kept, 90, duration=10.0)
    cache(pool, plain, 35)
    assert pool.priority_of(kept[0]) == 90
    assert pool.retained == 2  # what the planner counts as held for sessions
    assert pool.pinned == 0  # they expire: a session's, not the pinned prefix
    pool.now = 10.0
    assert pool.priority_of(kept[0]) == 35
    assert pool.retained == 0
    # Expired blocks count as the least recently used of the default class.
    assert pool.allocate(2)
    assert all(h not in pool for h in kept) and all(h in pool for h in plain)


def test_retention_without_duration_never_expires() -> None:
    pool = KvPool(4, BS)
    pinned, plain = chain(0, 2), chain(100, 2)
    cache(pool, pinned, 90)
    cache(pool, plain, 35)
    pool.now = 1e9
    assert pool.retained == pool.pinned == 2  # kept for the deployment, not for a session
    assert pool.allocate(2)
    assert all(h in pool for h in pinned)


def test_evicted_blocks_spill_to_host_and_come_back_with_tiered_events() -> None:
    pool = KvPool(2, BS, host_blocks=2)
    hashes = chain(0, 2)
    cache(pool, hashes)
    pool.take_events()
    other = chain(100, 2)
    assert pool.allocate(2)
    events = pool.take_events()
    assert events == [BlockStored(2, (hashes[1], hashes[0]), None, 2 * BS, "cpu")]
    assert pool.on_host(hashes[0]) and hashes[0] not in pool
    assert pool.match_tiers(hashes) == (2, 2)
    assert pool.snapshot().host_block_hashes == (hashes[1], hashes[0])
    pool.commit(other, None)
    pool.release(other)
    # Bringing them back evicts `other` to host in turn.
    assert pool.acquire(hashes)
    assert pool.refcount(hashes[0]) == 1 and not pool.on_host(hashes[0])
    events = pool.take_events()
    assert events[-1] == BlockStored(events[-1].seq, tuple(hashes), None, 2 * BS, "gpu")
    assert all(pool.on_host(h) for h in other)


def test_host_tier_drops_its_oldest_blocks_when_full() -> None:
    pool = KvPool(1, BS, host_blocks=1)
    a, b, c = chain(0, 1), chain(100, 1), chain(200, 1)
    cache(pool, a)
    cache(pool, b)  # a -> host
    cache(pool, c)  # b -> host, a dropped
    assert not pool.on_host(a[0]) and pool.on_host(b[0]) and c[0] in pool
    removed = [e for e in pool.take_events() if isinstance(e, BlockRemoved)]
    assert removed == [BlockRemoved(removed[0].seq, (a[0],), "cpu")]


def test_acquire_refuses_without_gpu_room_and_changes_nothing() -> None:
    pool = KvPool(1, BS, host_blocks=2)
    hashes = chain(0, 1)
    cache(pool, hashes)
    assert pool.allocate(1)  # hashes -> host; the only GPU block is now private
    assert not pool.acquire(hashes)
    assert pool.on_host(hashes[0])


def test_block_retentions_take_the_highest_overlapping_range_and_decode_priority() -> None:
    retention = Retention(
        (TokenRangeRetention(0, 6, 90, None), TokenRangeRetention(6, None, 80, 60.0)),
        decode_priority=70,
        decode_duration_s=30.0,
    )
    # prompt of 10 tokens, blocks of 4: [0,4) [4,8) [8,12) [12,16)
    assert block_retentions(retention, 4, BS, 10) == [(90, None), (90, None), (80, 60.0), (70, 30.0)]
    assert block_retentions(None, 4, BS, 10) is None


def test_scheduler_counts_host_hits_as_cached_and_prices_the_transfer() -> None:
    pool = KvPool(8, BS, host_blocks=8)
    sched = Scheduler(pool, SchedulerConfig(max_num_tokens=64))
    prompt = list(range(24))
    sched.add(SimSequence("a", list(prompt), 24, [1], "stop"))
    while sched.has_work:
        sched.step()
    sched.add(SimSequence("b", list(range(1000, 1032)), 32, [1], "stop"))  # evicts a's blocks to host
    while sched.has_work:
        sched.step()
    assert pool.match_tiers(block_hashes(prompt, BS))[1] > 0
    sched.add(SimSequence("c", [*prompt, 7, 7, 7, 7], 28, [1], "stop"))
    outcome = sched.step()
    seq = outcome.started[0]
    assert seq.cached_tokens == 24 and seq.host_tokens > 0
    assert outcome.work.onboard_tokens == seq.host_tokens
    with_copy = default_timing().step_seconds(outcome.work)
    without = default_timing().step_seconds(StepWork(outcome.work.prefill, outcome.work.decode))
    recompute = default_timing().step_seconds(StepWork([(0, 28)], outcome.work.decode))
    assert without < with_copy < recompute


def test_wire_carries_the_tier_and_stays_readable_by_old_decoders() -> None:
    events = [
        BlockStored(1, (5, 6), 4, 8, "cpu"),
        BlockRemoved(2, (7,), "cpu"),
        BlockStored(3, (8,), None, 4),
    ]
    frames = encode_batch(events)
    assert decode_batch(frames) == events
    # A gpu event is encoded exactly as before the tier existed.
    old = encode_batch([BlockStored(1, (5,), None, 4), BlockRemoved(2, (5,))])
    import msgpack

    assert msgpack.unpackb(old[2]) == [["stored", [5], None, 4], ["removed", [5]]]
    bad = encode_batch([BlockStored(1, (5,), None, 4, "disk")])
    with pytest.raises(KvWireError):
        decode_batch(bad)


def test_retention_travels_over_the_generate_wire_in_json_and_msgpack() -> None:
    import json

    from agentserve.worker.engine import GenerateRequest, SamplingParams
    from agentserve.worker.wire import decode_request, encode_request

    retention = Retention(
        (TokenRangeRetention(0, 640, 90, None), TokenRangeRetention(640, None, 80, 600.0)), 80, 600.0
    )
    req = GenerateRequest("r", [1, 2, 3], SamplingParams(max_tokens=4), retention=retention)
    body = encode_request(req)
    assert decode_request(json.loads(json.dumps(body))).retention == retention
    import msgpack

    assert decode_request(msgpack.unpackb(msgpack.packb(body))).retention == retention
    assert "retention" not in encode_request(GenerateRequest("r", [1], SamplingParams(max_tokens=1)))


@pytest.mark.parametrize(
    "raw",
    [
        {"ranges": [[0, None, 101, None]]},
        {"ranges": [[5, 2, 50, None]]},
        {"ranges": [[0, None, 50, -1]]},
        {"ranges": [[0, None, 50]]},
        {"ranges": "x"},
        {"decode_priority": True},
        {"bogus": 1},
        [],
    ],
)
def test_bad_retention_is_a_wire_error(raw: object) -> None:
    from agentserve.worker.wire import WireError, decode_request

    with pytest.raises(WireError):
        decode_request({"token_ids": [1], "sampling": {"max_tokens": 1}, "retention": raw})


@pytest.mark.anyio
async def test_sim_engine_honours_retention_unless_turned_off() -> None:
    from agentserve.worker.engine import GenerateRequest, SamplingParams
    from agentserve.worker.engines.sim import SimConfig, SimEngine

    retention = Retention((TokenRangeRetention(0, None, 90, None),))
    for honour, expected in ((True, 90), (False, 35)):
        engine = SimEngine(SimConfig(num_blocks=64, block_size=4, speedup=0, honour_retention=honour))
        await engine.start()
        prompt = list(range(100, 116))
        stream = engine.generate(
            GenerateRequest("a", prompt, SamplingParams(max_tokens=2), retention=retention)
        )
        async for _ in stream:
            pass
        first = block_hashes(prompt, 4)[0]
        assert engine.pool.priority_of(first) == expected
        await engine.stop()


def test_a_re_released_block_expires_from_its_latest_release_not_its_first() -> None:
    pool = KvPool(4, BS)
    kept = chain(0, 1)
    cache(pool, kept, 80, duration=10.0)
    pool.now = 8.0
    assert pool.acquire(kept)
    pool.release(kept, [(80, 10.0)])
    pool.now = 12.0  # past the first release's expiry, within the second's
    assert pool.priority_of(kept[0]) == 80
    pool.now = 18.0
    assert pool.priority_of(kept[0]) == 35
