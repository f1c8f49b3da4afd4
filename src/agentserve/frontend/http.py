"""The HTTP edge: bodies with a size limit, API keys, errors in each API's shape, SSE responses."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agentserve.api._check import check_surrogates
from agentserve.api.errors import (
    ApiError,
    ApiKind,
    AuthenticationError,
    InvalidRequestError,
    OverloadedError,
    RateLimitError,
    RequestTooLargeError,
)
from agentserve.api.ids import new_id
from agentserve.api.sse import dumps
from agentserve.asgi import until_disconnect

log = logging.getLogger("agentserve.frontend")

API_KEYS_ENV = "AGENTSERVE_API_KEYS"  # comma-separated; added to the keys of `api_keys_file`

SSE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # nginx and most proxies: do not buffer this response
)


def new_request_id() -> str:
    return new_id("req_")


def id_headers(request_id: str) -> dict[str, str]:
    # Anthropic clients read `request-id`, OpenAI clients `x-request-id`.
    return {"request-id": request_id, "x-request-id": request_id}


def json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    # backslashreplace: a lone surrogate that reached a body (an echoed value) becomes its JSON
    # escape instead of an exception; valid text costs nothing extra.
    content = dumps(body).encode("utf-8", "backslashreplace")
    return Response(content, status, headers=dict(headers or {}), media_type="application/json")


def error_response(error: ApiError, kind: ApiKind, request_id: str, *, close: bool = False) -> Response:
    body = error.anthropic_body(request_id) if kind == "anthropic" else error.openai_body()
    headers = id_headers(request_id)
    if isinstance(error, OverloadedError | RateLimitError):
        headers["retry-after"] = "1"
    if close:
        headers["connection"] = "close"  # the unread rest of the body is not worth draining
    return json_response(body, error.status_for(kind), headers)


def error_kind_for(path: str, headers: Mapping[str, str]) -> ApiKind:
    """Which API's error shape a request gets when its route does not decide (404, 405, auth)."""
    if path.startswith("/v1/messages") or "anthropic-version" in headers:
        return "anthropic"
    return "openai"


# -- bodies ------------------------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing more than `limit` bytes (before reading, when the length is sent)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(f"request body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"request body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(body: bytes) -> Any:
    if not body.strip():
        raise InvalidRequestError("the request body is empty; expected a JSON object")
    try:
        value = json.loads(body)
    except RecursionError:
        raise InvalidRequestError("the request body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from None
    check_surrogates(value, body)  # json.loads lets lone surrogates through; nothing after us can
    return value


# -- API keys ----------------------------------------------------------------------------------


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class ApiKeys:
    """Accepted keys, held as SHA-256 digests (the keys themselves are never kept or logged)."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._digests = frozenset(_digest(k) for k in keys if k)

    @classmethod
    def load(cls, path: str | None, environ: Mapping[str, str] = os.environ) -> ApiKeys:
        keys: list[str] = []
        if path is not None:
            for line in Path(path).read_text(encoding="utf-8").splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    keys.append(line)
        keys += [k.strip() for k in environ.get(API_KEYS_ENV, "").split(",") if k.strip()]
        return cls(keys)

    def __bool__(self) -> bool:
        return bool(self._digests)

    @staticmethod
    def presented(headers: Mapping[str, str]) -> str | None:
        """The key a client sent: `x-api-key` (Anthropic) or `Authorization: Bearer` (both)."""
        key = headers.get("x-api-key")
        if key:
            return key.strip()
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        return None

    def check(self, headers: Mapping[str, str]) -> str | None:
        """The caller's scope (a digest of its key, or "" when keys are off); raises on a bad key."""
        if not self._digests:
            return ""
        key = self.presented(headers)
        if key is None:
            raise AuthenticationError("missing API key: send x-api-key or Authorization: Bearer")
        digest = _digest(key)
        if not any(hmac.compare_digest(digest, d) for d in self._digests):
            raise AuthenticationError("invalid API key")
        return digest.hex()[:32]


# -- server-sent events ------------------------------------------------------------------------


# Where the app puts the ASGI server's own `send` (see `app.py`): body frames skip the middleware
# wrappers, which only watch for the response start (measured ~1.4 µs per frame at 256 streams).
RAW_SEND = "agentserve.raw_send"

ChunkWriter = Callable[[bytes], Awaitable[None]]  # one non-empty body chunk onto the wire


class EventStreamResponse(Response):
    """An SSE response written frame by frame by `produce(write)`, with no buffering: each call of
    `write` is one body chunk on the wire. `produce` returns its last chunk, which goes out with
    the end of the body (one write).

    `produce` runs in a task of its own, so an engine step resumes only its frames and not the
    middleware stack above this response (measured ~2 µs per frame at 256 streams). While the
    stream is idle for `ping_interval` seconds a `ping()` frame goes out (keeps proxies and client
    idle timers awake during a long prefill). A client that disconnects stops the stream at once:
    `produce` is cancelled and `on_disconnect` runs (it aborts the engine request). If `produce`
    fails, `on_error()` is the last chunk (the API's error event and terminal frame); a failure of
    that, or of the last write, is logged and the body ended: the server never sees an exception.
    """

    def __init__(
        self,
        produce: Callable[[ChunkWriter], Awaitable[bytes]],
        *,
        headers: Mapping[str, str],
        ping: Callable[[], bytes],
        ping_interval: float,
        on_disconnect: Callable[[], Awaitable[None]],
        on_error: Callable[[], bytes] = lambda: b"",
    ) -> None:
        super().__init__(status_code=200)
        self._on_error = on_error
        self._produce = produce
        self._ping = ping
        self._interval = ping_interval
        self._on_disconnect = on_disconnect
        self.raw_headers = [*SSE_HEADERS, *((k.encode(), v.encode()) for k, v in headers.items())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = False
        sent = 0  # chunks written: the pinger pings only when this did not move for a whole interval
        # The start goes through the middleware (they track that the response started); the body
        # goes straight to the server.
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        raw: Send = scope.get(RAW_SEND, send)

        def write(chunk: bytes) -> Awaitable[None]:
            # Not a coroutine of its own: the server's `send` is the one awaited (one frame less
            # per chunk). `produce` writes no empty chunk.
            nonlocal sent
            sent += 1
            return raw({"type": "http.response.body", "body": chunk, "more_body": True})

        body = asyncio.ensure_future(self._produce(write))

        async def watch() -> None:
            nonlocal gone
            await until_disconnect(receive)
            gone = True
            body.cancel()
            await self._on_disconnect()

        async def pinger() -> None:
            seen = -1
            while True:
                await asyncio.sleep(self._interval)
                if sent == seen and not gone:
                    await write(self._ping())
                seen = sent

        watcher = asyncio.ensure_future(watch())
        tasks = [watcher]
        if self._interval > 0:
            tasks.append(asyncio.ensure_future(pinger()))
        last = b""
        failed = False
        try:
            last = await body
        except asyncio.CancelledError:
            if not gone:
                raise  # this request's task was cancelled (the server is stopping), and `body` with it
        except Exception:
            log.exception("the event stream failed")
            failed = True
        finally:
            for task in tasks:
                if task is not watcher or not gone:  # a watcher that saw the disconnect is aborting
                    task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if gone:
            return
        if failed:
            try:
                last = self._on_error()  # the API's error event and terminal frame
            except Exception:
                log.exception("the event stream's error event failed")
                last = b""
        try:
            await raw({"type": "http.response.body", "body": last, "more_body": False})
        except Exception:  # the connection broke as the stream ended: the server closes it
            log.debug("the event stream's last frame was not sent", exc_info=True)


class DeferredResponse(Response):
    """A response produced when it is sent (a non-streaming generation), abandoned if the client
    disconnects first: `on_disconnect` aborts the engine request instead of finishing it unread."""

    def __init__(
        self, produce: Callable[[], Awaitable[Response]], on_disconnect: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(status_code=200)
        self._produce = produce
        self._on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        work = asyncio.ensure_future(self._produce())
        watcher = asyncio.ensure_future(until_disconnect(receive))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if not work.done():
            await self._on_disconnect()  # the client left: stop generating for nobody
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await work
            return
        await work.result()(scope, receive, send)
