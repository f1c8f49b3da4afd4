"""A typed client for a worker service: the network transport of the `Engine` protocol's generate.

`await client.generate(request)` returns a `StepStream` like `Engine.generate` does, once the
worker accepted the request (errors map to the engine's exceptions: 400 → `InvalidRequestError`,
409 → `DuplicateRequestError`, 503 → `EngineNotReadyError`). Closing the stream before its last
step closes the HTTP response, and the worker aborts the engine request. Frames that arrive in
one read are merged into one step, as an engine merges steps for a consumer that lags.
Frames are msgpack by default: decoding NDJSON lines was ~14 % of the frontend's CPU under
bench/peers.py at 256 streams (and encoding them ~13 % of the worker's).
"""

from __future__ import annotations

import json
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
    Load,
    Step,
)
from agentserve.worker.http1 import Http1Pool, Http1Response, HttpConnectionError
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
    cls = {400: InvalidWorkerRequest, 409: DuplicateWorkerRequest, 503: WorkerNotReady}.get(
        status, WorkerError
    )
    return cls(status, kind, message)


def merge_steps(steps: Sequence[Step]) -> Step:
    """One step carrying several consecutive steps' output."""
    if len(steps) == 1:
        return steps[0]
    ids: list[int] = []
    for s in steps:
        ids += s.token_ids
    first, last = steps[0], steps[-1]
    return Step(ids, "".join(s.text for s in steps), first.cached_tokens, last.finish_reason, last.usage)


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


class WorkerClient:
    def __init__(
        self,
        base_url: str,
        *,
        framing: Framing = "msgpack",
        body: Literal["json", "msgpack"] = "msgpack",
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.framing: Framing = framing
        self.body = body
        self._pool = Http1Pool(self.base_url, connect_timeout_s=connect_timeout_s)

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

    async def generate(self, request: GenerateRequest) -> RemoteStepStream:
        payload = encode_request(request)
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
        await self._pool.aclose()

    async def __aenter__(self) -> WorkerClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


__all__ = ["RemoteStepStream", "WorkerClient", "WorkerError", "merge_steps"]
