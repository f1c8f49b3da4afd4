from __future__ import annotations

import pytest

from agentserve.prompt.hashing import block_hashes


def test_only_full_blocks_are_hashed() -> None:
    assert block_hashes(list(range(31)), 32) == []
    assert len(block_hashes(list(range(64)), 32)) == 2
    assert len(block_hashes(list(range(95)), 32)) == 2


def test_hashes_chain_so_equal_hash_means_equal_prefix() -> None:
    a = block_hashes(list(range(96)), 32)
    b = block_hashes([999, *range(1, 96)], 32)  # differs only in the first token
    assert a[0] != b[0] and a[1] != b[1] and a[2] != b[2]


def test_shared_prefix_gives_shared_leading_hashes() -> None:
    a = block_hashes(list(range(96)), 32)
    b = block_hashes([*range(64), *range(1000, 1032)], 32)
    assert a[:2] == b[:2] and a[2] != b[2]


def test_incremental_hashing_with_parent_equals_whole() -> None:
    tokens = list(range(128))
    whole = block_hashes(tokens, 32)
    head = block_hashes(tokens[:64], 32)
    tail = block_hashes(tokens[64:], 32, parent=head[-1])
    assert head + tail == whole


def test_seed_and_block_size_change_the_hashes() -> None:
    tokens = list(range(64))
    assert block_hashes(tokens, 32, seed=1) != block_hashes(tokens, 32, seed=0)
    assert block_hashes(tokens, 16)[1] != block_hashes(tokens, 32)[0]


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        block_hashes([1, 2], 0)
