"""Retention and KV tiers in TensorRT-LLM's terms, on payloads shaped as tensorrt_llm/_utils.py's
KVCacheEventSerializer writes them (TensorRT-LLM 1.2.1)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import BlockRemoved, BlockStored, Retention, TokenRangeRetention
from agentserve.worker.engines.trtllm_mapping import KvEventTranslator
from agentserve.worker.engines.trtllm_retention import (
    host_cache_bytes,
    medium_of,
    retention_args,
    updated_medium,
)

BS = 4


def stored(
    event_id: int, parent: int | None, hashes: list[int], tokens: list[int], level: int
) -> dict[str, object]:
    blocks = [
        {
            "type": "stored_block",
            "block_hash": h,
            "tokens": [
                {"type": "unique_token", "token_id": t, "token_extra_id": 0}
                for t in tokens[i * BS : (i + 1) * BS]
            ],
            "cache_level": level,
            "priority": 35,
        }
        for i, h in enumerate(hashes)
    ]
    return {
        "event_id": event_id,
        "data": {"type": "stored", "parent_hash": parent, "blocks": blocks},
        "window_size": 64,
    }


def updated(event_id: int, block: int, old: int, new: int) -> dict[str, object]:
    diff = {"type": "event_diff", "old_value": old, "new_value": new}
    same = {"type": "event_diff", "old_value": 35, "new_value": 35}
    data = {"type": "updated", "block_hash": block, "cache_level": diff, "priority": same}
    return {"event_id": event_id, "data": data, "window_size": 64}


def test_retention_maps_to_token_ranges_in_milliseconds_and_the_default_decode_priority() -> None:
    r = Retention((TokenRangeRetention(0, 100, 90, None), TokenRangeRetention(100, None, 80, 600.0)))
    assert retention_args(r) == ([(0, 100, 90, None), (100, None, 80, timedelta(seconds=600))], 35, None)
    r = Retention((), decode_priority=80, decode_duration_s=0.0001)
    assert retention_args(r) == ([], 80, timedelta(milliseconds=1))  # never 0 ms: that would expire at once


def test_cache_levels_and_host_pool_size() -> None:
    assert (medium_of(0), medium_of(1)) == ("gpu", "cpu")
    with pytest.raises(ValueError):
        medium_of(2)
    assert host_cache_bytes(10, 32, 98304) == 10 * 32 * 98304
    assert updated_medium({"cache_level": {"old_value": 35, "new_value": 35}}) is None


def test_translator_carries_the_tier_of_stored_and_moved_blocks_into_events_and_snapshots() -> None:
    t = KvEventTranslator(BS)
    tokens = list(range(1, 2 * BS + 1))
    ours = block_hashes(tokens, BS)
    assert t.feed(stored(0, None, [501, 502], tokens, 0)) == [BlockStored(1, tuple(ours), None, 2 * BS)]
    assert t.feed(updated(1, 502, 0, 1)) == [BlockStored(2, (ours[1],), None, BS, "cpu")]
    snap = t.snapshot()
    assert (snap.block_hashes, snap.host_block_hashes) == ((ours[0],), (ours[1],))
    assert t.feed(updated(2, 502, 1, 0)) == [BlockStored(3, (ours[1],), None, BS, "gpu")]
    assert t.feed(updated(3, 999, 0, 1)) == []  # a block we never published
    assert t.feed({"event_id": 4, "data": {"type": "removed", "block_hashes": [501, 502]}}) == [
        BlockRemoved(4, (ours[0], ours[1]))
    ]
    other = list(range(50, 50 + BS))
    assert t.feed(stored(5, None, [700], other, 1)) == [
        BlockStored(5, tuple(block_hashes(other, BS)), None, BS, "cpu")
    ]
    assert t.snapshot().host_block_hashes == tuple(block_hashes(other, BS))
