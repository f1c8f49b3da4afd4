from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from agentserve.router.index import KvIndex


def test_overlap_counts_leading_blocks_per_worker() -> None:
    index = KvIndex()
    index.stored("a", [1, 2, 3])
    index.stored("b", [1, 2])
    index.stored("c", [2, 3])  # holds later blocks but not the first: no usable prefix
    assert index.overlaps([1, 2, 3, 4]) == {"a": 3, "b": 2, "c": 0}


def test_unknown_request_has_zero_overlap_everywhere() -> None:
    index = KvIndex()
    index.stored("a", [1])
    assert index.overlaps([9, 1]) == {"a": 0}
    assert index.overlaps([]) == {"a": 0}


def test_removed_and_cleared_blocks_stop_counting() -> None:
    index = KvIndex()
    index.stored("a", [1, 2, 3])
    index.stored("b", [1, 2, 3])
    index.removed("a", [2])
    assert index.overlaps([1, 2, 3]) == {"a": 1, "b": 3}
    index.clear("b")
    assert index.overlaps([1, 2, 3]) == {"a": 1, "b": 0}
    assert index.stats().entries == 2


def test_removing_a_worker_purges_its_blocks_and_frees_its_slot() -> None:
    index = KvIndex()
    index.stored("a", [1, 2])
    index.stored("b", [1])
    index.remove_worker("a")
    assert index.overlaps([1, 2]) == {"b": 1}
    assert index.stats().blocks == 1
    index.stored("c", [1, 2])  # reuses a's slot; a's old bits must not leak into c
    assert index.overlaps([1, 2]) == {"b": 1, "c": 2}


def test_sequence_gaps_are_detected_and_resync_replaces_state() -> None:
    index = KvIndex()
    assert index.check_sequence("a", 0)
    assert index.check_sequence("a", 1)
    assert not index.check_sequence("a", 5)  # events 2..4 were lost
    index.stored("a", [1, 2, 3])
    index.resync("a", [7, 8], seq=10)
    assert index.overlaps([1]) == {"a": 0}
    assert index.overlaps([7, 8]) == {"a": 2}
    assert index.check_sequence("a", 11)


def test_memory_is_bounded_and_refusals_are_counted() -> None:
    index = KvIndex(max_entries=3)
    index.stored("a", [1, 2, 3, 4, 5])
    stats = index.stats()
    assert stats.entries == 3 and stats.dropped == 2


@given(
    st.dictionaries(st.sampled_from("abcdefgh"), st.lists(st.integers(0, 30), max_size=30), max_size=8),
    st.lists(st.integers(0, 30), max_size=20),
)
def test_overlaps_match_a_naive_model(held: dict[str, list[int]], request: list[int]) -> None:
    index = KvIndex()
    for worker, hashes in held.items():
        index.stored(worker, hashes)
    expected = {}
    for worker, hashes in held.items():
        n = 0
        while n < len(request) and request[n] in set(hashes):
            n += 1
        expected[worker] = n
    assert index.overlaps(request) == expected


def test_lookup_cost_does_not_grow_with_index_size() -> None:
    """Operation count, not time: lookups touch only the request's blocks."""
    small, big = KvIndex(), KvIndex()
    request = list(range(10))
    small.stored("w", request)
    big.stored("w", request)
    rng = random.Random(0)
    big.stored("w", (rng.getrandbits(63) for _ in range(100_000)))
    calls = {"n": 0}

    class Counting(dict[int, int]):
        def get(self, key: int, default: int = 0) -> int:  # type: ignore[override]
            calls["n"] += 1
            return super().get(key, default)

    for index in (small, big):
        index._blocks = Counting(index._blocks)
        calls["n"] = 0
        assert index.overlaps(request) == {"w": 10}
        assert calls["n"] == len(request)
