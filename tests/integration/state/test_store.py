"""One contract, two stores: the in-process store and Redis (a real redis-server on loopback)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from agentserve.state import InProcessStore, RedisStore, StateStore, StoreUnavailable, open_store
from redisproc import RedisProcess, redis_server

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisProcess]:
    with redis_server() as server:
        yield server


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis: RedisProcess) -> AsyncIterator[StateStore]:
    s: StateStore = InProcessStore(100) if request.param == "memory" else RedisStore(redis.url)
    if isinstance(s, RedisStore):
        await s._client.flushdb()
    yield s
    await s.close()


@pytest.mark.parametrize("kind", ["turn", "resp"])
async def test_put_get_delete_per_scope(store: StateStore, kind: str) -> None:
    await store.put(kind, "keyA", "x1", b"value-a", 60)
    assert await store.get(kind, "keyA", "x1") == b"value-a"
    assert await store.get(kind, "keyB", "x1") is None  # another API key never reads it
    assert await store.get(kind, "", "x1") is None
    assert await store.get("other" + kind, "keyA", "x1") is None
    assert await store.delete(kind, "keyB", "x1") is False
    assert await store.delete(kind, "keyA", "x1") is True
    assert await store.get(kind, "keyA", "x1") is None


async def test_many(store: StateStore) -> None:
    await store.put_many("turn", "s", [("a", b"1"), ("b", b"2")], 60)
    assert await store.get_many("turn", "s", ["b", "zz", "a"]) == [b"2", None, b"1"]
    assert await store.get_many("turn", "s", []) == []


async def test_entries_expire(store: StateStore) -> None:
    await store.put("resp", "s", "short", b"x", 0.05)
    await store.put("resp", "s", "long", b"y", 60)
    await asyncio.sleep(0.15)
    assert await store.get("resp", "s", "short") is None
    assert await store.get("resp", "s", "long") == b"y"


async def test_in_process_store_is_bounded_and_sized() -> None:
    s = InProcessStore(3)
    for i in range(5):
        await s.put("turn", "", str(i), b"x" * 10, 60)
    assert len(s) == 3 and s.size_bytes == 30
    assert await s.get("turn", "", "0") is None and await s.get("turn", "", "4") == b"x" * 10
    by_bytes = InProcessStore(100, max_bytes=25)
    for i in range(5):
        await by_bytes.put("resp", "", str(i), b"y" * 10, 60)
    assert len(by_bytes) == 2 and by_bytes.size_bytes == 20
    await by_bytes.put("resp", "", "big", b"z" * 40, 60)  # larger than the bound: kept alone
    assert len(by_bytes) == 1 and await by_bytes.get("resp", "", "big") == b"z" * 40


async def test_redis_outage_raises_store_unavailable() -> None:
    with redis_server() as server:
        s = RedisStore(server.url, timeout_s=0.2)
        await s.put("turn", "", "k", b"v", 60)
        server.stop()
        with pytest.raises(StoreUnavailable):
            await s.get("turn", "", "k")
        with pytest.raises(StoreUnavailable):
            await s.put("turn", "", "k", b"v", 60)
        server.start_again()
        assert await s.get("turn", "", "k") is None  # no persistence: the restart lost it
        await s.put("turn", "", "k", b"v2", 60)
        assert await s.get("turn", "", "k") == b"v2"
        await s.close()


def test_open_store_by_url() -> None:
    assert isinstance(open_store(None), InProcessStore)
    assert isinstance(open_store("memory://"), InProcessStore)
    assert isinstance(open_store("redis://127.0.0.1:1/0"), RedisStore)
    assert isinstance(open_store("valkey://127.0.0.1:1/0"), RedisStore)
    with pytest.raises(ValueError, match="unsupported scheme"):
        open_store("mysql://x")
