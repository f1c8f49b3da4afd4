"""Chained block hashes over token ids: the identity of KV-cache blocks for routing and caching.

A prompt's tokens are cut into fixed-size blocks (32 tokens by default, TensorRT-LLM's default
`tokens_per_block`); block k's hash is XXH3-64 over the previous block's hash and block k's token
ids, so equal hashes mean equal whole prefixes. Only full blocks are hashed: a partial last block
cannot be shared. Worker, router and frontend all use this one function.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import xxhash

DEFAULT_BLOCK_SIZE = 32
DEFAULT_SEED = 0


def block_hashes(
    tokens: Sequence[int],
    block_size: int = DEFAULT_BLOCK_SIZE,
    seed: int = DEFAULT_SEED,
    parent: int | None = None,
) -> list[int]:
    """Hashes of the full blocks of `tokens`, each chained to the one before (or to `parent`)."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    full = len(tokens) - len(tokens) % block_size
    if full == 0:
        return []
    ids = array("I", tokens[:full]).tobytes()  # 4 bytes per token id, native order
    step = block_size * 4
    hashes: list[int] = []
    prev = (parent if parent is not None else seed) & 0xFFFFFFFFFFFFFFFF
    h = xxhash.xxh3_64_intdigest
    for off in range(0, len(ids), step):
        prev = h(prev.to_bytes(8, "little") + ids[off : off + step], seed=seed)
        hashes.append(prev)
    return hashes
