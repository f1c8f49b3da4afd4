"""The shared state store: one small async key-value interface, two implementations.

`InProcessStore` (the default; `agentserve up` and single-replica frontends) keeps entries in a
bounded dict in this process. `RedisStore` (`--state-url redis://host:port/db`, Redis or Valkey)
lets every frontend replica see what another stored. Entries live under `kind` (what it is),
`scope` (the caller's API-key digest, so no key reads another's entries) and `key`, each with a
TTL. A store that cannot answer raises `StoreUnavailable`; callers degrade (see `state.shared`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from agentserve.config import ConfigError, FrontendConfig


class StoreUnavailable(Exception):
    """The store did not answer (connection refused, timeout, server error)."""


def entry_key(prefix: str, kind: str, scope: str, key: str) -> str:
    return f"{prefix}{kind}:{scope or '-'}:{key}"


class StateStore(Protocol):
    name: str

    async def get(self, kind: str, scope: str, key: str) -> bytes | None: ...

    async def get_many(self, kind: str, scope: str, keys: Sequence[str]) -> list[bytes | None]: ...

    async def put(self, kind: str, scope: str, key: str, value: bytes, ttl_s: float) -> None: ...

    async def put_many(
        self, kind: str, scope: str, items: Sequence[tuple[str, bytes]], ttl_s: float
    ) -> None: ...

    async def delete(self, kind: str, scope: str, key: str) -> bool: ...

    async def close(self) -> None: ...


class InProcessStore:
    """Entries in this process, least recently used dropped past `max_entries` or `max_bytes`
    (a stored response holds its whole history, so a long chain's entries grow with each turn),
    expired on read."""

    name = "memory"

    def __init__(self, max_entries: int = 8192, max_bytes: int = 256 << 20) -> None:
        self._max = max_entries
        self._max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._bytes = 0
        self._now = time.monotonic

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def _get(self, k: str) -> bytes | None:
        entry = self._items.get(k)
        if entry is None:
            return None
        if entry[0] <= self._now():
            self._drop(k)
            return None
        self._items.move_to_end(k)
        return entry[1]

    def _drop(self, k: str) -> bool:
        entry = self._items.pop(k, None)
        if entry is None:
            return False
        self._bytes -= len(entry[1])
        return True

    def _put(self, k: str, value: bytes, ttl_s: float) -> None:
        self._drop(k)
        self._items[k] = (self._now() + ttl_s, value)
        self._bytes += len(value)
        while len(self._items) > self._max or (self._bytes > self._max_bytes and len(self._items) > 1):
            _, (_, old) = self._items.popitem(last=False)
            self._bytes -= len(old)

    async def get(self, kind: str, scope: str, key: str) -> bytes | None:
        return self._get(entry_key("", kind, scope, key))

    async def get_many(self, kind: str, scope: str, keys: Sequence[str]) -> list[bytes | None]:
        return [self._get(entry_key("", kind, scope, k)) for k in keys]

    async def put(self, kind: str, scope: str, key: str, value: bytes, ttl_s: float) -> None:
        self._put(entry_key("", kind, scope, key), value, ttl_s)

    async def put_many(self, kind: str, scope: str, items: Sequence[tuple[str, bytes]], ttl_s: float) -> None:
        for key, value in items:
            self._put(entry_key("", kind, scope, key), value, ttl_s)

    async def delete(self, kind: str, scope: str, key: str) -> bool:
        return self._drop(entry_key("", kind, scope, key))

    async def close(self) -> None:
        self._items.clear()
        self._bytes = 0


class RedisStore:
    """Redis or Valkey through redis-py's asyncio client: one GET/MGET per lookup, one pipelined
    SET … PX per write, never a round trip per token. Short socket timeouts so an outage degrades
    a request by milliseconds, not by the OS's connect timeout."""

    name = "redis"

    def __init__(self, url: str, *, prefix: str = "agentserve:", timeout_s: float = 0.5) -> None:
        import redis.asyncio as aioredis  # the client is only needed with --state-url
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError

        self.url = url
        self._prefix = prefix
        self._errors = (aioredis.RedisError, OSError, TimeoutError)
        self._client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=30,
            retry_on_timeout=False,
            # One reconnect: a pooled connection to a restarted server fails once, then works.
            retry=Retry(NoBackoff(), 1),
            retry_on_error=[RedisConnectionError],
        )

    def _k(self, kind: str, scope: str, key: str) -> str:
        return entry_key(self._prefix, kind, scope, key)

    async def get(self, kind: str, scope: str, key: str) -> bytes | None:
        try:
            value = await self._client.get(self._k(kind, scope, key))
        except self._errors as exc:
            raise StoreUnavailable(str(exc)) from None
        return value if isinstance(value, bytes) else None

    async def get_many(self, kind: str, scope: str, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        try:
            values = await self._client.mget([self._k(kind, scope, k) for k in keys])
        except self._errors as exc:
            raise StoreUnavailable(str(exc)) from None
        return [v if isinstance(v, bytes) else None for v in values]

    async def put(self, kind: str, scope: str, key: str, value: bytes, ttl_s: float) -> None:
        await self.put_many(kind, scope, [(key, value)], ttl_s)

    async def put_many(self, kind: str, scope: str, items: Sequence[tuple[str, bytes]], ttl_s: float) -> None:
        if not items:
            return
        ttl_ms = max(1, int(ttl_s * 1000))
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key, value in items:
                    pipe.set(self._k(kind, scope, key), value, px=ttl_ms)
                await pipe.execute()
        except self._errors as exc:
            raise StoreUnavailable(str(exc)) from None

    async def delete(self, kind: str, scope: str, key: str) -> bool:
        try:
            return bool(await self._client.delete(self._k(kind, scope, key)))
        except self._errors as exc:
            raise StoreUnavailable(str(exc)) from None

    async def close(self) -> None:
        await self._client.aclose()


def state_url(config: FrontendConfig) -> str | None:
    """`state_url`, else the first line of `state_url_file` (a mounted Secret). Raises ConfigError
    when the file cannot be read: a replica must not silently run with state of its own."""
    if config.state_url or not config.state_url_file:
        return config.state_url
    try:
        text = Path(config.state_url_file).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read state_url_file: {exc}") from exc
    if not text:
        raise ConfigError(f"state_url_file {config.state_url_file} is empty")
    return text.splitlines()[0].strip()


def open_store(url: str | None, max_entries: int = 8192, max_bytes: int = 256 << 20) -> StateStore:
    """The store a `state_url` names: None or "memory://" → in-process; redis:// rediss:// unix://
    → Redis/Valkey. Raises ValueError for any other scheme."""
    if not url or url.startswith("memory:"):
        return InProcessStore(max_entries, max_bytes)
    scheme = urlsplit(url).scheme
    if scheme in ("redis", "rediss", "unix", "valkey", "valkeys"):
        if scheme.startswith("valkey"):
            url = "redis" + url[len("valkey") :]
        return RedisStore(url)
    raise ValueError(f"state_url: unsupported scheme {scheme!r} (redis://host:port/db or memory://)")
