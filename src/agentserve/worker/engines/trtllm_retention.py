"""Our `Retention` and KV tiers in TensorRT-LLM's terms (pure; no tensorrt_llm import here).

Facts (TensorRT-LLM 1.2.1, the release images/worker-trtllm pins; docs/worker.md cites the files):

- `tensorrt_llm.llmapi.KvCacheRetentionConfig(token_range_retention_configs,
  decode_retention_priority=35, decode_duration_ms=None, transfer_mode=DRAM, directory=None)` and
  `KvCacheRetentionConfig.TokenRangeRetentionConfig(token_start, token_end, priority,
  duration_ms=None)` (the executor bindings, `cpp/tensorrt_llm/{pybind,nanobind}/executor/
  request.cpp`). `token_end` None = to the end of the prompt; durations are
  `std::chrono::milliseconds`, which the bindings take as `datetime.timedelta`; priorities are
  0..100 (`RetentionPriority`), default 35 (`kDefaultRetentionPriority`). It goes to
  `LLM.generate_async(..., kv_cache_retention_config=...)` per request.
- The host (secondary) block pool is `KvCacheConfig.host_cache_size` in bytes (None/0: none);
  evicted primary blocks are offloaded there and onboarded back (`onboard_blocks`, default True).
- KV events (`tensorrt_llm/_utils.py`, `KVCacheEventSerializer`): each stored block carries
  `cache_level` (0: primary = GPU, 1: secondary = host) and `priority`; an `updated` event carries
  `cache_level` as `{"type": "event_diff", "old_value", "new_value"}` when a block moves tier.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from agentserve.worker.engine import MEDIUM_CPU, MEDIUM_GPU, RETENTION_PRIORITY_DEFAULT, Retention

PRIMARY_CACHE_LEVEL = 0
SECONDARY_CACHE_LEVEL = 1

# (token_start, token_end, priority, duration_ms) as TokenRangeRetentionConfig takes them.
TokenRange = tuple[int, int | None, int, timedelta | None]


def _ms(seconds: float | None) -> timedelta | None:
    # Whole milliseconds, at least one: TensorRT-LLM counts std::chrono::milliseconds.
    return None if seconds is None else timedelta(milliseconds=max(1, round(seconds * 1000)))


def retention_args(retention: Retention) -> tuple[list[TokenRange], int, timedelta | None]:
    """(token ranges, decode_retention_priority, decode_duration_ms) for `KvCacheRetentionConfig`."""
    ranges = [(r.start, r.end, r.priority, _ms(r.duration_s)) for r in retention.ranges]
    decode = RETENTION_PRIORITY_DEFAULT if retention.decode_priority is None else retention.decode_priority
    return ranges, decode, _ms(retention.decode_duration_s)


def build_retention_config(retention: Retention | None, config_cls: Any) -> Any:
    """A `KvCacheRetentionConfig` (class passed in: the engine imports it) or None."""
    if retention is None:
        return None
    ranges, decode, decode_ms = retention_args(retention)
    token_range: Callable[..., Any] = config_cls.TokenRangeRetentionConfig
    return config_cls([token_range(*r) for r in ranges], decode, decode_ms)


def host_cache_bytes(host_blocks: int, block_size: int, kv_bytes_per_token: int) -> int:
    """`KvCacheConfig.host_cache_size` for a host tier of `host_blocks` blocks."""
    return host_blocks * block_size * kv_bytes_per_token


def medium_of(cache_level: Any) -> str:
    """Our tier name for a TensorRT-LLM `cache_level`; anything else is a format change: fail."""
    if cache_level == PRIMARY_CACHE_LEVEL:
        return MEDIUM_GPU
    if cache_level == SECONDARY_CACHE_LEVEL:
        return MEDIUM_CPU
    raise ValueError(f"unknown TensorRT-LLM cache_level {cache_level!r}")


def updated_medium(data: Mapping[str, Any]) -> str | None:
    """The tier an `updated` event moved its block to (None: no tier change, e.g. a priority one)."""
    diff = data.get("cache_level")
    if not isinstance(diff, Mapping):
        return None
    old, new = diff.get("old_value"), diff.get("new_value")
    if old == new:
        return None
    return medium_of(new)
