"""ASGI pieces the frontend, router and worker servers share: JSON error responses and the wait
for a client's disconnect."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]

# The error kind a framework-raised HTTP status answers with (anything else: `http_error`).
_HTTP_ERROR_KINDS = {404: "not_found", 405: "method_not_allowed"}


def error_response(status: int, kind: str, message: str) -> JSONResponse:
    """The internal services' error body: `{"error": {"type": kind, "message": message}}`."""
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


def json_exception_handlers(log: logging.Logger) -> Mapping[type[Exception], ExceptionHandler]:
    """Starlette exception handlers that answer with `error_response`: the framework's HTTP errors
    with their status, anything unhandled as a 500 (logged on `log`, its details kept from the
    client)."""

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = _HTTP_ERROR_KINDS.get(exc.status_code, "http_error")
        return error_response(exc.status_code, kind, str(exc.detail))

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error")
        return error_response(500, "internal_error", "internal error")

    return {HTTPException: http_error, Exception: internal_error}


async def until_disconnect(receive: Receive) -> None:
    """Return once the client has gone (`http.disconnect`); a request body still arriving is
    read and dropped."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
