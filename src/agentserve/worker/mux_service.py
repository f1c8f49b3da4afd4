"""The worker's side of a multiplexed generate connection (`POST /generate/mux`, agentserve.worker.mux).

One `MuxSession` per connection: it reads the client's OPEN/CANCEL messages from the request body,
consumes every engine stream, and writes what they produced in one chunk per event-loop pass (one
engine step advances all its streams in the same pass, so a step's frames for all streams on the
connection leave in one write). Streams with a push mode (`listen`/`take`, the sim's) cost a
callback per step; others get a consumer task each. The connection ending aborts every stream on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol, cast

from starlette.types import Receive, Send

from agentserve.drain import DrainState
from agentserve.worker.engine import EngineError, Step, StepStream
from agentserve.worker.mux import (
    MEDIA_TYPE,
    Cancel,
    ClientMessageDecoder,
    Open,
    encode_accept,
    encode_frame,
    encode_refuse,
    encode_step,
    encode_steps,
    plain,
)
from agentserve.worker.wire import WireError, error_frame

log = logging.getLogger("agentserve.worker")

# Open a stream from a decoded request body: the engine's stream, or (status, kind, message).
Opener = Callable[[object], StepStream | tuple[int, str, str]]


class PushStream(Protocol):
    """A stream that can call back when a step is ready instead of being awaited."""

    def listen(self, listener: Callable[[], None]) -> None: ...

    def take(self) -> Step | None: ...


class MuxSession:
    def __init__(
        self, opener: Opener, send: Send, *, abort: bool = True, drain: DrainState | None = None
    ) -> None:
        self._opener = opener
        self._send = send
        self._abort = abort
        self._drain = drain
        self._streams: dict[int, StepStream] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._push: dict[int, PushStream] = {}  # push-mode streams until their last step
        self._ready: set[int] = set()
        self._out: list[bytes] = []
        self._wake = asyncio.Event()

    # -- output -------------------------------------------------------------------------------------

    def _emit(self, data: bytes) -> None:
        self._out.append(data)
        if len(self._out) == 1:
            self._wake.set()

    def _on_ready(self, sid: int) -> None:
        ready = self._ready
        if not ready:
            self._wake.set()
        ready.add(sid)

    def _take_ready(self) -> None:
        ready, self._ready = self._ready, set()
        sids: list[int] = []
        ids: list[object] = []
        texts: list[str] = []
        for sid in ready:
            stream = self._push.get(sid)
            if stream is None:
                continue
            step = stream.take()
            if step is None:
                continue
            if step.finish_reason is not None:
                del self._push[sid]
            if sid in self._streams:  # else cancelled with abort off: consumed unsent
                if plain(step):  # most steps: all of them go in one STEPS message
                    sids.append(sid)
                    ids.append(step.token_ids)
                    texts.append(step.text)
                    continue
                if step.finish_reason is not None:
                    del self._streams[sid]
                self._out.append(encode_step(sid, step))
        if sids:
            # A stream has at most one step per pass (`take` merges), and its ACCEPT went out
            # before: the order of this pass's messages does not matter.
            self._out.append(encode_steps(sids, ids, texts))

    @property
    def _active(self) -> bool:
        return bool(self._tasks or self._push)

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            # The streams one engine step advanced all ran before this task: their frames go together.
            if self._ready:
                self._take_ready()
            if self._out:
                body = b"".join(self._out)
                self._out.clear()
                await self._send({"type": "http.response.body", "body": body, "more_body": True})
            if self._drain is not None and self._drain.draining and not self._active:
                return

    async def _drain_watch(self) -> None:
        # A draining worker ends idle mux connections, so the server can close them.
        if self._drain is None:
            return
        while not (self._drain.draining and not self._active):
            await asyncio.sleep(0.25)
        self._wake.set()

    # -- streams ------------------------------------------------------------------------------------

    async def _pump(self, sid: int, stream: StepStream) -> None:
        gone = False
        try:
            async for step in stream:
                if sid not in self._streams:
                    gone = True  # cancelled with abort off: consume unsent to the end
                if not gone:
                    self._emit(encode_step(sid, step))
        except EngineError as exc:
            if sid in self._streams:
                self._emit(encode_frame(sid, error_frame("engine_error", str(exc))))
        except Exception:
            log.exception("mux stream %d failed", sid)
            if sid in self._streams:
                self._emit(encode_frame(sid, error_frame("internal_error", "internal error")))
        finally:
            self._streams.pop(sid, None)
            self._tasks.pop(sid, None)
            if not self._tasks:
                self._wake.set()  # a draining connection may end now

    def _open(self, message: Open) -> None:
        if message.sid in self._streams:
            self._emit(encode_refuse(message.sid, 409, "duplicate_request", "stream id in use"))
            return
        try:
            result = self._opener(message.body)
        except Exception:
            log.exception("mux open failed")
            result = (500, "internal_error", "internal error")
        if isinstance(result, tuple):
            self._emit(encode_refuse(message.sid, *result))
            return
        sid = message.sid
        self._streams[sid] = result
        self._emit(encode_accept(sid))
        if hasattr(result, "listen") and hasattr(result, "take"):
            push = cast(PushStream, result)
            self._push[sid] = push
            push.listen(lambda: self._on_ready(sid))
        else:
            self._tasks[sid] = asyncio.get_running_loop().create_task(self._pump(sid, result))

    async def _cancel(self, sid: int) -> None:
        stream = self._streams.pop(sid, None)
        if stream is not None and self._abort:
            self._push.pop(sid, None)
            await stream.aclose()

    # -- the connection -----------------------------------------------------------------------------

    async def run(self, receive: Receive) -> None:
        await self._send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", MEDIA_TYPE.encode()), (b"cache-control", b"no-store")],
            }
        )
        decoder = ClientMessageDecoder()
        writer = asyncio.ensure_future(self._writer())
        watch = asyncio.ensure_future(self._drain_watch())
        reader = asyncio.ensure_future(self._read(receive, decoder))
        try:
            await asyncio.wait([writer, reader], return_when=asyncio.FIRST_COMPLETED)
            if writer.done() and not writer.cancelled() and writer.exception() is None:
                await self._send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            for task in (writer, watch, reader):
                task.cancel()
            await self._close_all()

    async def _read(self, receive: Receive, decoder: ClientMessageDecoder) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            if body:
                try:
                    events = decoder.feed(body)
                except WireError as exc:
                    log.warning("mux connection: %s", exc)
                    return
                for event in events:
                    if isinstance(event, Cancel):
                        await self._cancel(event.sid)
                    else:
                        self._open(event)
            if not message.get("more_body", False):
                return  # the client ended its side: no more opens or cancels

    async def _close_all(self) -> None:
        streams = list(self._streams.values())
        self._streams.clear()
        if self._abort:
            self._push.clear()
            for stream in streams:
                with contextlib.suppress(Exception):
                    await stream.aclose()
        else:
            return  # abort off: the pumps consume their streams to the end, unsent
        for task in list(self._tasks.values()):
            task.cancel()
