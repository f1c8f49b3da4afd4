"""The router's HTTP edge: the route API for frontends, worker list, health, readiness, metrics.

Routes (bodies: `agentserve.router.wire`):

- `POST /route` — place a request: worker id, its URL, overlap, ticket. While every worker is
  saturated the call waits in the priority queue (a long poll); a caller that disconnects
  leaves the queue. 503 `no_worker` when no worker is routable, 503 `overloaded` when the queue
  is full, 400 for a body it cannot read.
- `POST /finish` — the request of a ticket ended (its load stops counting). 204.
- `POST /worker_failed` — a frontend could not reach a worker: purged, then re-probed. 204.
- `GET /workers` — every known worker: id, URL, KV endpoint, state, in-flight load, cached blocks.
- `GET /health` — the process is up. `GET /ready` — at least one worker is routable (503 before).
- `GET /metrics` — Prometheus text (`agentserve.router.metrics`).

`/route` and `/finish` are raw ASGI: they sit on every request, and the framework's request and
response objects cost more than the decision itself (docs/router.md has the numbers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from agentserve.asgi import error_response, json_exception_handlers, until_disconnect
from agentserve.router.core import OverloadedError
from agentserve.router.ingest import State
from agentserve.router.local import LocalRouter
from agentserve.router.placement import NoWorkerError
from agentserve.router.wire import (
    Encoding,
    RouteWireError,
    decode_route,
    decode_ticket,
    decode_worker,
    encode_decision,
    encoding_of,
    error_body,
    media_type,
)

log = logging.getLogger("agentserve.router")

RawEndpoint = Callable[[Scope, Receive, Send], Awaitable[None]]
T = TypeVar("T")

MAX_BODY_BYTES = 4 * 1024 * 1024  # 500K block hashes: far beyond any context window


async def _respond(send: Send, status: int, body: bytes = b"", content_type: str | None = None) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if content_type is not None:
        headers.append((b"content-type", content_type.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _error(send: Send, status: int, kind: str, message: str) -> None:
    await _respond(send, status, error_body(kind, message), "application/json")


async def _read_body(scope: Scope, receive: Receive) -> tuple[bytes, Encoding] | str | None:
    """(body, encoding); an error message for a bad request; None if the caller left."""
    content_type = None
    for key, value in scope["headers"]:
        if key == b"content-type":
            content_type = value.decode("latin-1")
    try:
        encoding = encoding_of(content_type)
    except RouteWireError as exc:
        return str(exc)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return f"the body exceeds {MAX_BODY_BYTES} bytes"
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), encoding


def create_app(router: LocalRouter, *, manage_router: bool = True) -> ASGIApp:
    """The router app over `router`; its lifespan starts and stops the router unless told not to."""
    core, fleet = router.core, router.fleet

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_router:
            await router.start()
        try:
            yield
        finally:
            if manage_router:
                await router.aclose()

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        read = await _read_body(scope, receive)
        if read is None:
            return
        if isinstance(read, str):
            await _error(send, 400, "invalid_request", read)
            return
        body, encoding = read
        try:
            call = decode_route(body, encoding)
        except RouteWireError as exc:
            await _error(send, 400, "invalid_request", str(exc))
            return
        try:
            if core.saturated(call.exclude):
                # Queued: leave the queue if the caller goes away meanwhile.
                placing = asyncio.ensure_future(router.route(call.request, call.exclude))
                gone = asyncio.ensure_future(until_disconnect(receive))
                try:
                    await asyncio.wait({placing, gone}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    gone.cancel()
                if not placing.done():
                    placing.cancel()
                    with contextlib.suppress(asyncio.CancelledError, NoWorkerError, OverloadedError):
                        await placing
                    return
                decision = placing.result()
            else:
                decision = await router.route(call.request, call.exclude)
        except NoWorkerError as exc:
            await _error(send, 503, "no_worker", str(exc))
            return
        except OverloadedError as exc:
            await _error(send, 503, "overloaded", str(exc))
            return
        url = fleet.url(decision.worker) or ""
        prefill = decision.prefill.prefill_worker if decision.prefill is not None else None
        prefill_url = (fleet.url(prefill) or "") if prefill is not None else ""
        await _respond(send, 200, encode_decision(decision, url, encoding, prefill_url), media_type(encoding))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        live = len(fleet.live_urls())
        if live:
            return JSONResponse({"status": "ready", "workers": live})
        return error_response(503, "no_workers", f"no routable worker yet ({len(fleet.members())} known)")

    async def workers(request: Request) -> Response:
        placement = core.placement
        return JSONResponse(
            {
                "workers": [
                    {
                        "id": m.id,
                        "url": m.url,
                        "kv_endpoint": m.kv_endpoint,
                        "state": m.state.value,
                        "since": m.since,
                        "last_removal": m.last_removal,
                        "inflight_requests": placement.inflight(m.id),
                        "load_blocks": placement.load(m.id),
                        "cached_blocks": core.held_count(m.id),
                        # Attention-DP ranks followed (one KV stream and index key each); 0: none yet.
                        "dp_ranks": sum(1 for k in core.targets(m.id) if k != m.id),
                    }
                    for m in fleet.members()
                ],
                "routable": sum(1 for m in fleet.members() if m.state is State.LIVE),
                "policy": router.config.policy,
                "block_size": router.config.block_size,
            }
        )

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
            Route("/workers", workers, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers=json_exception_handlers(log),
        lifespan=lifespan,
    )
    raw: dict[str, RawEndpoint] = {
        "/route": route,
        "/finish": _notice(decode_ticket, core.finish_ticket),
        "/worker_failed": _notice(decode_worker, router.report_failed),
    }

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        handler = raw.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None:
            await app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await _error(send, 405, "method_not_allowed", "use POST")
            return
        try:
            await handler(scope, receive, send)
        except Exception:  # never a traceback to the caller; a 500 if nothing was sent yet
            log.exception("%s failed", scope["path"])
            with contextlib.suppress(Exception):
                await _error(send, 500, "internal_error", "internal error")

    return asgi


def _notice(decode: Callable[[bytes, Encoding], T], act: Callable[[T], None]) -> RawEndpoint:
    """A POST that tells the router something (a ticket finished, a worker failed): its body is
    decoded, acted on, and answered 204."""

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        read = await _read_small(scope, receive, send)
        if read is None:
            return
        try:
            notice = decode(*read)
        except RouteWireError as exc:
            await _error(send, 400, "invalid_request", str(exc))
            return
        act(notice)
        await _respond(send, 204)

    return endpoint


async def _read_small(scope: Scope, receive: Receive, send: Send) -> tuple[bytes, Encoding] | None:
    read = await _read_body(scope, receive)
    if isinstance(read, str):
        await _error(send, 400, "invalid_request", read)
        return None
    return read
