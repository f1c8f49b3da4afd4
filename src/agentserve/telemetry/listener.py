"""The ZeroMQ edge for harness tool events: a PULL socket on a thread of its own.

Harnesses connect a PUSH socket (with a high-water mark, so a stalled frontend never blocks them)
and send one JSON tool event (or an array) per message. The socket is bound here, so a frontend
restart is just a reconnect for them. `ZMQ_MAXMSGSIZE` makes libzmq disconnect a peer that sends an
oversized frame before it is ever buffered; everything else is validated by the pure core.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import zmq

from agentserve.telemetry.tool_events import MAX_BODY_BYTES

log = logging.getLogger(__name__)

_POLL_MS = 100  # how quickly `stop` is noticed


class ToolEventListener:
    def __init__(
        self,
        endpoint: str,
        handle: Callable[[list[bytes]], object],
        *,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        high_water_mark: int = 10_000,
        max_message_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self._requested = endpoint
        self._handle = handle
        self._context = context or zmq.Context.instance()
        self._hwm = high_water_mark
        self._max_bytes = max_message_bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._socket: zmq.Socket[bytes] | None = None
        self.endpoint: str | None = None  # the bound endpoint (a `tcp://…:*` request resolved to its port)

    def start(self) -> str:
        """Bind (errors raise here, in the caller) and start receiving. Returns the bound endpoint."""
        if self._thread is not None:
            raise RuntimeError("listener already started")
        sock = self._context.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, self._hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self._max_bytes)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(self._requested)
        except zmq.ZMQError:
            sock.close()
            raise
        last = sock.getsockopt(zmq.LAST_ENDPOINT)
        self.endpoint = last.decode() if isinstance(last, bytes) else str(last)
        self._socket = sock
        self._thread = threading.Thread(target=self._loop, name="tool-events-zmq", daemon=True)
        self._thread.start()  # the socket is used only by that thread from here on
        return self.endpoint

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        sock = self._socket
        assert sock is not None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if not dict(poller.poll(_POLL_MS)):
                    continue
                while True:  # drain what is there before polling again
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        self._handle(frames)
                    except Exception:  # a bug in a handler must not end the listener
                        log.exception("tool event handler failed")
        finally:
            sock.close(linger=0)
