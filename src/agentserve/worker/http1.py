"""A lean HTTP/1.1 client for talking to workers: keep-alive pool, streaming bodies, httptools.

Worker streams cost one HTTP chunk per frame, and the frontend reads every stream of every
worker: a general-purpose client's per-chunk overhead (several async layers and a pure-Python
parser) dominated the transport cost, so this one is an `asyncio.Protocol` feeding the C parser
of `httptools` (the parser uvicorn's fast path uses) and handing whole reads to the caller.

Scope: plain `http://` to a known worker (no TLS, proxies or redirects). A request on a reused
keep-alive connection that the server had already closed is retried once on a new connection,
only if no response byte arrived (the server never saw it). Closing a response before its end
closes the connection: that is how a caller tells a worker to abort.
"""

from __future__ import annotations

import asyncio
import collections
from typing import cast
from urllib.parse import urlsplit

import httptools

from agentserve.eventloop import Wakeup

HIGH_WATER = 256 * 1024  # buffered body bytes above which reading pauses until the caller catches up


class HttpConnectionError(ConnectionError):
    """The connection failed, closed early, or the server's response was not valid HTTP/1.1."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._status = 0
        self._headers_done = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._complete = False
        self._error: BaseException | None = None
        self._wakeup = Wakeup()
        self.got_bytes = False
        self.keep_alive = False

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HttpConnectionError(f"invalid HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._complete:
            self._fail(HttpConnectionError(f"connection closed before the response ended ({exc or 'EOF'})"))

    # -- httptools callbacks ----------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._headers_done = True
        self._wakeup.set()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wakeup.set()

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        self._complete = True
        self._wakeup.set()

    # -- caller side ------------------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._wakeup.set()

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        await self._wakeup.wait()

    def send(self, request: bytes) -> None:
        self._reset()
        if self.closed or self.transport is None:
            self._fail(HttpConnectionError("connection closed"))
            return
        self.transport.write(request)

    async def read_head(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        while not self._headers_done:
            await self._wait()
        return self._status, self._headers

    async def read_some(self) -> bytes | None:
        """Everything buffered so far (one bytes object), or None once the body ended."""
        while not self._chunks:
            if self._complete:
                return None
            await self._wait()
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    @property
    def complete(self) -> bool:
        return self._complete

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Http1Response:
    def __init__(self, pool: Http1Pool, conn: _Connection, status: int, headers: list[tuple[bytes, bytes]]):
        self._pool = pool
        self._conn = conn
        self.status = status
        self.headers = headers
        self._done = False

    def header(self, name: str) -> str | None:
        key = name.lower().encode()
        for k, v in self.headers:
            if k == key:
                return v.decode("latin-1")
        return None

    async def read_some(self) -> bytes | None:
        """The next bytes of the body (as much as has arrived), None at its end."""
        if self._done:
            return None
        data = await self._conn.read_some()
        if data is None:
            self.close()
        return data

    async def read(self) -> bytes:
        parts = []
        while (data := await self.read_some()) is not None:
            parts.append(data)
        return b"".join(parts)

    def close(self) -> None:
        """Done with the response: a finished one returns its connection to the pool, an unfinished
        one closes it (the server sees the caller leave)."""
        if not self._done:
            self._done = True
            self._pool._release(self._conn)


class Http1Pool:
    """Keep-alive connections to one `http://host:port`."""

    def __init__(self, base_url: str, *, connect_timeout_s: float = 5.0) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"a worker URL is http://host:port, not {base_url!r}")
        self.host = url.hostname
        self.port = url.port or 80
        self._host_header = f"{self.host}:{self.port}".encode()
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_Connection] = []
        self._closed = False

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port), self.connect_timeout_s
            )
        except (TimeoutError, OSError) as exc:
            raise HttpConnectionError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return conn

    def _encode(self, method: str, target: str, headers: dict[str, str], body: bytes) -> bytes:
        lines = [f"{method} {target} HTTP/1.1".encode(), b"host: " + self._host_header]
        lines += [f"{k}: {v}".encode("latin-1") for k, v in headers.items()]
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(b"content-length: %d" % len(body))
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    async def request(
        self, method: str, target: str, *, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> Http1Response:
        if self._closed:
            raise HttpConnectionError("the client is closed")
        data = self._encode(method, target, headers or {}, body)
        for attempt in range(2):
            conn = None
            while self._idle:
                candidate = self._idle.pop()
                if not candidate.closed:
                    conn = candidate
                    break
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            conn.send(data)
            try:
                status, head = await conn.read_head()
            except HttpConnectionError:
                conn.close()
                if reused and not conn.got_bytes and attempt == 0:
                    continue  # a stale keep-alive connection: the server never saw this request
                raise
            except BaseException:
                conn.close()
                raise
            return Http1Response(self, conn, status, head)
        raise HttpConnectionError("unreachable")  # the loop returns or raises

    def _release(self, conn: _Connection) -> None:
        if conn.complete and conn.keep_alive and not conn.closed and not self._closed:
            self._idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        self._closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()
