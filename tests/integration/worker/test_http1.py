"""The lean HTTP/1.1 client against small raw servers on 127.0.0.1 (behaviour a worker relies on)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from agentserve.worker.http1 import HIGH_WATER, Http1Pool, HttpConnectionError

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + (await reader.readexactly(length) if length else b"")


def chunked(*parts: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"


async def test_keep_alive_reuses_one_connection_and_streams_chunks() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        for _ in range(3):
            request = await read_request(reader)
            assert request.startswith(b"POST /x HTTP/1.1\r\n") and request.endswith(b"hello")
            writer.write(chunked(b"ab", b"cd"))
            await writer.drain()
        writer.close()

    async with raw_server(handler) as url:
        pool = Http1Pool(url)
        for _ in range(3):
            response = await pool.request("POST", "/x", body=b"hello")
            assert response.status == 200 and response.header("Transfer-Encoding") == "chunked"
            assert await response.read() == b"abcd"
        await pool.aclose()
    assert connections == 1


async def test_a_stale_keep_alive_connection_is_retried_once() -> None:
    served = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        await read_request(reader)
        served += 1
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # the server drops keep-alive connections right away

    async with raw_server(handler) as url:
        pool = Http1Pool(url)
        assert await (await pool.request("GET", "/")).read() == b"ok"
        await asyncio.sleep(0.05)
        assert await (await pool.request("GET", "/")).read() == b"ok"
        await pool.aclose()
    assert served == 2


async def test_closing_a_response_early_closes_the_connection() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        assert await reader.read() == b""  # EOF: the client left
        closed.set()

    async with raw_server(handler) as url:
        pool = Http1Pool(url)
        response = await pool.request("GET", "/stream")
        assert await response.read_some() == b"first"
        response.close()
        await asyncio.wait_for(closed.wait(), 5)
        await pool.aclose()


async def test_large_bodies_pause_reading_until_consumed() -> None:
    blob = bytes(range(256)) * 4096  # 1 MiB, more than the high-water mark

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked(*(blob[i : i + 65536] for i in range(0, len(blob), 65536))))
        await writer.drain()
        writer.close()

    assert len(blob) > HIGH_WATER
    async with raw_server(handler) as url:
        pool = Http1Pool(url)
        response = await pool.request("GET", "/big")
        await asyncio.sleep(0.1)  # let the server push until reading pauses
        assert response._conn._paused
        assert await response.read() == blob
        await pool.aclose()


async def test_broken_responses_and_refused_connections_raise() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        writer.close()

    async with raw_server(garbage) as url:
        pool = Http1Pool(url)
        with pytest.raises(HttpConnectionError):
            await pool.request("GET", "/")
        await pool.aclose()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        writer.close()

    async with raw_server(cut) as url:
        pool = Http1Pool(url)
        response = await pool.request("GET", "/")
        assert await response.read_some() == b"abc"
        with pytest.raises(HttpConnectionError, match="closed before"):
            await response.read_some()
        await pool.aclose()

    with pytest.raises(HttpConnectionError, match="cannot connect"):
        await Http1Pool("http://127.0.0.1:9").request("GET", "/")
    with pytest.raises(ValueError, match="http://"):
        Http1Pool("https://127.0.0.1:9")
