"""A typed client for a worker service: the network transport of the `Engine` protocol's generate.

`await client.generate(request)` returns a `StepStream` like `Engine.generate` does, once the
worker accepted the request (errors map to the engine's exceptions: 400 → `InvalidRequestError`,
409 → `DuplicateRequestError`, 503 → `EngineNotReadyError`). Closing the stream before its last
step closes the HTTP response, and the worker aborts the engine request. Frames that arrive in
one read are merged into one step, as an engine merges steps for a consumer that lags.
Frames are msgpack by default: decoding NDJSON lines was ~14 % of the frontend's CPU under
bench/peers.py at 256 streams (and encoding them ~13 % of the worker's).

Transports: `"mux"` (the default) carries every stream to a worker on one connection
(`POST /generate/mux`, agentserve.worker.mux): the worker writes one engine step's frames for all
streams in one write, and this client reads and demultiplexes them in one callback, instead of a
write and a read per token per stream. `"http"` is one `POST /generate` response per request; a
worker without the mux route (404/405) is served that way. `AGENTSERVE_WORKER_TRANSPORT` sets the
default for every client (`http` turns the mux off).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal

import msgpack

from agentserve.worker.engine import (
    DuplicateRequestError,
    EngineError,
    EngineNotReadyError,
    GenerateRequest,
    InvalidRequestError,
    KvSnapshot,
    KvTransfer,
    Load,
    Step,
    TokenLogprob,
)
from agentserve.worker.http1 import Http1Pool, Http1Response, HttpConnectionError, _Connection
from agentserve.worker.mux import (
    MEDIA_TYPE as MUX_MEDIA_TYPE,
)
from agentserve.worker.mux import (
    PATH as MUX_PATH,
)
from agentserve.worker.mux import (
    Accepted,
    Refused,
    Steps,
    WorkerMessageDecoder,
    chunk,
    encode_cancel,
    encode_open,
)
from agentserve.worker.wire import (
    MEDIA_TYPES,
    FrameDecoder,
    Framing,
    encode_request,
    frame_decoder,
    frame_to_step,
)


class WorkerError(EngineError):
    """The worker answered with an error status (or could not be reached: status None)."""

    def __init__(self, status: int | None, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}" if status is None else f"{status} {kind}: {message}")
        self.status = status
        self.kind = kind
        self.message = message


class InvalidWorkerRequest(WorkerError, InvalidRequestError):
    pass


class DuplicateWorkerRequest(WorkerError, DuplicateRequestError):
    pass


class WorkerNotReady(WorkerError, EngineNotReadyError):
    pass


def _error_for(status: int, body: bytes) -> WorkerError:
    kind, message = "http_error", body[:200].decode("utf-8", "replace")
    try:
        err = json.loads(body)["error"]
        kind, message = str(err["type"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        pass
    return _error_of(status, kind, message)


def _error_of(status: int, kind: str, message: str) -> WorkerError:
    cls = {400: InvalidWorkerRequest, 409: DuplicateWorkerRequest, 503: WorkerNotReady}.get(
        status, WorkerError
    )
    return cls(status, kind, message)


def merge_steps(steps: Sequence[Step]) -> Step:
    """One step carrying several consecutive steps' output."""
    if len(steps) == 1:
        return steps[0]
    ids: list[int] = []
    logprobs: list[TokenLogprob] | None = None  # None unless a step carries them
    for s in steps:
        ids += s.token_ids
        if s.logprobs is not None:
            logprobs = [*(logprobs or ()), *s.logprobs]
    first, last = steps[0], steps[-1]
    return Step(
        ids,
        "".join(s.text for s in steps),
        first.cached_tokens,
        last.finish_reason,
        last.usage,
        logprobs,
        last.kv_transfer,  # named on the last step of a context-only request
        first.received_tokens,  # told with the first step
    )


class RemoteStepStream:
    """The steps of one request on a worker (see the module docstring)."""

    def __init__(self, response: Http1Response, decoder: FrameDecoder) -> None:
        self._response = response
        self._decoder = decoder
        self._done = False

    def __aiter__(self) -> RemoteStepStream:
        return self

    async def __anext__(self) -> Step:
        while not self._done:
            try:
                chunk = await self._response.read_some()
            except HttpConnectionError as exc:
                await self.aclose()
                raise WorkerError(None, "connection_error", str(exc)) from exc
            if chunk is None:
                await self.aclose()
                raise EngineError("the worker closed the stream before the last step")
            frames = self._decoder.feed(chunk)
            if not frames:
                continue
            try:
                steps = [frame_to_step(f) for f in frames]
            except Exception:
                await self.aclose()
                raise
            step = merge_steps(steps)
            if step.finish_reason is not None:
                await self.aclose()
            return step
        raise StopAsyncIteration

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._response.close()

    async def __aenter__(self) -> RemoteStepStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class MuxStepStream:
    """The steps of one request on a multiplexed worker connection (`_MuxConnection`)."""

    __slots__ = ("_conn", "_done", "_error", "_frames", "_waiter", "sid")

    def __init__(self, conn: _MuxConnection, sid: int) -> None:
        self._conn = conn
        self.sid = sid
        # Frames, or (token_ids, text) of TOKENS/STEPS messages.
        self._frames: list[dict[str, Any] | tuple[list[int], str]] = []
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._done = False

    # -- connection side ----------------------------------------------------------------------------

    def _push(self, frame: dict[str, Any] | tuple[list[int], str]) -> None:
        self._frames.append(frame)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- consumer side ------------------------------------------------------------------------------

    def __aiter__(self) -> MuxStepStream:
        return self

    async def __anext__(self) -> Step:
        while not self._frames:
            if self._done:
                raise StopAsyncIteration
            if self._error is not None:
                self._done = True
                self._conn.forget(self.sid)
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._done:
            raise StopAsyncIteration
        frames, self._frames = self._frames, []
        if len(frames) == 1 and type(frames[0]) is tuple:
            return Step(frames[0][0], frames[0][1])  # one plain step: the most common read
        if len(frames) > 1 and all(type(f) is tuple for f in frames):
            # Plain token messages only (the usual case): one merged step, no Step per token.
            ids: list[int] = []
            for f in frames:
                ids += f[0]  # type: ignore[index]
            return Step(ids, "".join(f[1] for f in frames))  # type: ignore[index]
        try:
            steps = [_to_step(f) for f in frames]
        except Exception:
            await self.aclose()
            raise
        step = merge_steps(steps)
        if step.finish_reason is not None:
            self._done = True
            self._conn.forget(self.sid)
        return step

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._conn.cancel(self.sid)
            # A read pending on this stream ends (the router interrupts a hung worker's streams so).
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def __aenter__(self) -> MuxStepStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _to_step(item: dict[str, Any] | tuple[list[int], str]) -> Step:
    if type(item) is tuple:
        return Step(item[0], item[1])
    return frame_to_step(item)  # type: ignore[arg-type]


class _MuxProtocol(_Connection):
    """An HTTP/1.1 connection whose response body, once the head arrived, goes to `sink` as it
    is parsed (in the transport's callback: no task wake-up per read)."""

    def __init__(self) -> None:
        super().__init__()
        self.sink: _MuxConnection | None = None

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is None:
            super().on_body(body)
        else:
            sink.on_data(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.sink is not None:
            self.sink.on_end(WorkerError(None, "connection_error", "the worker ended the mux connection"))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.sink is not None:
            self.sink.on_end(
                WorkerError(None, "connection_error", f"connection to the worker lost ({exc or 'EOF'})")
            )


class _MuxConnection:
    """Many streams on one `POST /generate/mux` exchange (agentserve.worker.mux)."""

    def __init__(self, proto: _MuxProtocol) -> None:
        self._proto = proto
        self._decoder = WorkerMessageDecoder()
        self._streams: dict[int, MuxStepStream] = {}
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._sids = itertools.count()
        self.dead = False
        self.used = False  # a stream was accepted on it (a failure then may be a stale connection)
        self.closing = False
        proto.sink = self

    # -- from the worker ----------------------------------------------------------------------------

    def on_data(self, data: bytes) -> None:
        try:
            messages = self._decoder.feed(data)
        except Exception as exc:
            self.on_end(WorkerError(None, "protocol_error", str(exc)))
            return
        streams = self._streams
        for m in messages:
            if type(m) is Steps:
                # The per-token path: `_push` inlined (one engine step's plain steps, all streams).
                for sid, ids, text in zip(m.sids, m.token_ids, m.texts):  # noqa: B905 - checked
                    stream = streams.get(sid)
                    if stream is not None:
                        stream._frames.append((ids, text))
                        waiter = stream._waiter
                        if waiter is not None and not waiter.done():
                            waiter.set_result(None)
            elif type(m) is tuple:
                stream = streams.get(m[0])
                if stream is not None:
                    stream._push(m[1] if len(m) == 2 else (m[1], m[2]))
            elif isinstance(m, Accepted):
                fut = self._pending.pop(m.sid, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            elif isinstance(m, Refused):
                streams.pop(m.sid, None)
                fut = self._pending.pop(m.sid, None)
                if fut is not None and not fut.done():
                    fut.set_exception(_error_of(m.status, m.kind, m.message))

    def on_end(self, exc: WorkerError) -> None:
        """The exchange ended or the connection broke: every stream on it fails."""
        if self.dead:
            return
        self.dead = True
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()
        for stream in self._streams.values():
            stream._fail(exc)
        self._streams.clear()
        self._proto.close()

    # -- from the streams ---------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        transport = self._proto.transport
        if transport is not None and not self.dead:
            transport.write(chunk(data))

    async def open(self, payload: dict[str, Any]) -> MuxStepStream:
        if self.dead:
            raise WorkerError(None, "connection_error", "the mux connection is closed")
        sid = next(self._sids)
        stream = MuxStepStream(self, sid)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._streams[sid] = stream
        self._pending[sid] = fut
        self._write(encode_open(sid, payload))
        try:
            await fut
        except BaseException:
            self._pending.pop(sid, None)
            if self._streams.pop(sid, None) is not None:
                self._write(encode_cancel(sid))  # cancelled while the worker was accepting
            self._maybe_close()
            raise
        self.used = True
        return stream

    def forget(self, sid: int) -> None:
        self._streams.pop(sid, None)
        self._maybe_close()

    def cancel(self, sid: int) -> None:
        if self._streams.pop(sid, None) is not None:
            self._write(encode_cancel(sid))
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self.closing and not self._streams and not self._pending:
            self.close()

    def close(self) -> None:
        self.on_end(WorkerError(None, "connection_error", "the client closed the mux connection"))

    @property
    def open_streams(self) -> int:
        return len(self._streams)


def _default_transport() -> Literal["mux", "http"]:
    return "http" if os.environ.get("AGENTSERVE_WORKER_TRANSPORT", "").lower() == "http" else "mux"


class WorkerClient:
    def __init__(
        self,
        base_url: str,
        *,
        framing: Framing = "msgpack",
        body: Literal["json", "msgpack"] = "msgpack",
        connect_timeout_s: float = 5.0,
        transport: Literal["mux", "http"] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.framing: Framing = framing
        self.body = body
        self.transport: Literal["mux", "http"] = transport or _default_transport()
        self._pool = Http1Pool(self.base_url, connect_timeout_s=connect_timeout_s)
        self._mux: _MuxConnection | None = None
        self._mux_connecting: asyncio.Future[_MuxConnection | None] | None = None
        self._closed = False

    async def _request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> Http1Response:
        try:
            return await self._pool.request(method, path, headers=headers, body=body)
        except HttpConnectionError as exc:
            raise WorkerError(None, "connection_error", str(exc)) from exc

    async def _read(self, response: Http1Response) -> bytes:
        try:
            return await response.read()
        except HttpConnectionError as exc:
            raise WorkerError(None, "connection_error", str(exc)) from exc

    async def _mux_connection(self) -> _MuxConnection | None:
        """The live mux connection (made on first use), or None: the worker has no mux route."""
        if self._mux is not None and not self._mux.dead:
            return self._mux
        if self._mux_connecting is None:
            self._mux_connecting = asyncio.ensure_future(self._mux_connect())
        connecting = self._mux_connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if self._mux_connecting is connecting and connecting.done():
                self._mux_connecting = None

    async def _mux_connect(self) -> _MuxConnection | None:
        loop = asyncio.get_running_loop()
        pool = self._pool
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(_MuxProtocol, pool.host, pool.port), pool.connect_timeout_s
            )
        except (TimeoutError, OSError) as exc:
            raise WorkerError(
                None, "connection_error", f"cannot connect to {pool.host}:{pool.port}: {exc}"
            ) from exc
        head = pool._encode(
            "POST",
            MUX_PATH,
            {"content-type": MUX_MEDIA_TYPE, "accept": MUX_MEDIA_TYPE, "transfer-encoding": "chunked"},
            b"",
        ).replace(b"content-length: 0\r\n", b"")
        proto.send(head)
        try:
            status, _ = await proto.read_head()
        except HttpConnectionError as exc:
            proto.close()
            raise WorkerError(None, "connection_error", str(exc)) from exc
        if status != 200:
            body = b""
            try:
                while (data := await proto.read_some()) is not None and len(body) < 65536:
                    body += data
            except HttpConnectionError:
                pass
            proto.close()
            if status in (404, 405):
                self.transport = "http"  # an older worker: one HTTP response per request
                return None
            raise _error_for(status, body)
        conn = _MuxConnection(proto)
        if self._closed:
            conn.closing = True
        self._mux = conn
        return conn

    async def _generate_mux(self, payload: dict[str, Any]) -> MuxStepStream | None:
        for attempt in range(2):
            conn = await self._mux_connection()
            if conn is None:
                return None
            try:
                return await conn.open(payload)
            except WorkerError as exc:
                # A connection that had served streams may have died unnoticed (the worker
                # restarted): the open never reached an engine, try once on a new connection.
                if exc.status is None and conn.used and attempt == 0:
                    continue
                raise
        raise WorkerError(None, "connection_error", "unreachable")  # the loop returns or raises

    async def generate(self, request: GenerateRequest) -> RemoteStepStream | MuxStepStream:
        payload = encode_request(request)
        if self.transport == "mux":
            stream = await self._generate_mux(payload)
            if stream is not None:
                return stream
        if self.body == "msgpack":
            content, ctype = msgpack.packb(payload), "application/x-msgpack"
        else:
            content, ctype = json.dumps(payload).encode(), "application/json"
        headers = {"content-type": ctype, "accept": MEDIA_TYPES[self.framing]}
        response = await self._request("POST", "/generate", headers, content)
        if response.status != 200:
            raise _error_for(response.status, await self._read(response))
        return RemoteStepStream(response, frame_decoder(self.framing))

    async def _get(self, path: str) -> tuple[int, bytes]:
        response = await self._request("GET", path)
        return response.status, await self._read(response)

    async def _json(self, path: str) -> Any:
        status, body = await self._get(path)
        if status != 200:
            raise _error_for(status, body)
        return json.loads(body)

    async def health(self) -> bool:
        """The worker process answers (liveness)."""
        try:
            return (await self._get("/health"))[0] == 200
        except WorkerError:
            return False

    async def ready(self) -> bool:
        """The worker's model is loaded."""
        return await self.readiness() == "ready"

    async def readiness(self) -> str:
        """ "ready", "draining" (SIGTERM: finishing its streams, taking no new ones) or "not_ready"."""
        try:
            status, body = await self._get("/ready")
        except WorkerError:
            return "not_ready"
        if status == 200:
            return "ready"
        return "draining" if status == 503 and b'"draining"' in body else "not_ready"

    async def load(self) -> Load:
        return Load(**await self._json("/load"))

    async def kv_pull(self, transfer: KvTransfer) -> int | None:
        """Take the KV the worker holds under `transfer.handle` (disaggregated prefill): the tokens
        it covers, None when it holds nothing under it (or cannot be reached)."""
        body = json.dumps({"handle": transfer.handle}).encode()
        try:
            response = await self._request(
                "POST", "/kv/pull", headers={"content-type": "application/json"}, body=body
            )
            status, data = response.status, await self._read(response)
        except WorkerError:
            return None
        if status != 200:
            return None
        tokens = json.loads(data).get("tokens")
        return tokens if type(tokens) is int and tokens >= 0 else None

    async def kv_snapshot(self, dp_rank: int | None = None) -> KvSnapshot:
        path = "/kv/snapshot" if dp_rank is None else f"/kv/snapshot?dp_rank={int(dp_rank)}"
        data = await self._json(path)
        return KvSnapshot(
            data["seq"],
            data["block_size"],
            tuple(data["block_hashes"]),
            tuple(data.get("host_block_hashes", ())),
            dp_rank,
        )

    async def info(self) -> dict[str, Any]:
        data = await self._json("/info")
        return dict(data)

    async def aclose(self) -> None:
        """Close idle connections; streams still open keep theirs until they end."""
        self._closed = True
        await self._pool.aclose()
        if self._mux is not None:
            self._mux.closing = True
            self._mux._maybe_close()

    async def __aenter__(self) -> WorkerClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


__all__ = ["MuxStepStream", "RemoteStepStream", "WorkerClient", "WorkerError", "merge_steps"]


class KvPuller:
    """A decode worker's side of a KV transfer across processes: `POST /kv/pull` on the prefill
    worker named by the transfer's `source` URL (one client per prefill worker, kept)."""

    def __init__(self, max_clients: int = 256) -> None:
        self._clients: dict[str, WorkerClient] = {}
        self._max = max_clients

    async def __call__(self, transfer: KvTransfer) -> int | None:
        source = transfer.source
        if not source.startswith(("http://", "https://")):
            return None  # not a network address: nothing to pull from
        client = self._clients.get(source)
        if client is None:
            if len(self._clients) >= self._max:
                _, oldest = self._clients.popitem()
                await oldest.aclose()
            client = self._clients[source] = WorkerClient(source)
        return await client.kv_pull(transfer)
