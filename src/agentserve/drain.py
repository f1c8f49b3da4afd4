"""Graceful drain on SIGTERM, for the frontend and the worker (a rolling upgrade drops nothing).

On the first SIGTERM the process turns *draining*: readiness answers 503 (Kubernetes takes the
pod out of its Service; the router stops routing to a worker), and for `delay_s` the listeners
stay open so requests already on their way are still served. Then the server stops accepting and
gives open requests and streams up to `grace_s` to finish (uvicorn's graceful shutdown) before it
cancels what is left and exits. A second SIGTERM, or SIGINT, exits at once as before.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType

import uvicorn

log = logging.getLogger("agentserve.drain")


class DrainState:
    """Shared by the server and the app: `draining` flips once, on the first SIGTERM."""

    __slots__ = ("draining", "since")

    def __init__(self) -> None:
        self.draining = False
        self.since: float | None = None

    def start(self) -> None:
        if not self.draining:
            self.draining = True
            self.since = time.monotonic()


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: DrainState, *, delay_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.delay_s = delay_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.drain.draining and not self.should_exit:
            self.drain.start()
            log.warning(
                "SIGTERM: draining (not ready; listeners close in %.1f s, open requests get up to %s s)",
                self.delay_s,
                self.config.timeout_graceful_shutdown,
            )
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        since = self.drain.since
        if since is not None and not self.should_exit and time.monotonic() - since >= self.delay_s:
            self.should_exit = True
        return await super().on_tick(counter)


def server(
    app: object,
    host: str,
    port: int,
    drain: DrainState,
    *,
    delay_s: float,
    grace_s: float,
    log_level: str = "warning",
) -> DrainingServer:
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(grace_s)),
    )
    return DrainingServer(config, drain, delay_s=delay_s)
