"""`agentserve frontend --processes N`: N frontend processes on one port (SO_REUSEPORT).

One Python process uses one core; the frontend's work is per request and per frame, with no state
that must live in one process once the call memory and the response store are in the shared store
(`--state-url`). So the supervisor (this module, the process started as `agentserve frontend`)
re-runs the same command N times with `AGENTSERVE_FRONTEND_PROCESS=i`; each child binds its own
listening socket to the same address with SO_REUSEPORT and the kernel spreads connections over
them. The supervisor holds the port with a bound, non-listening socket of its own (so port 0 picks
one port for all), forwards SIGTERM/SIGINT (each child drains as a single frontend does) and
restarts a child that dies unexpectedly.

What each process keeps to itself: its embedded router's view of the workers (each subscribes to
the KV events: the same stream, so the same view), its metrics (`/metrics` answers for the process
the scrape reached), the drift detector's last prompt per session, and a trace file of its own
(`trace_sink` + `.pN`). Harness tool events (`tool_events_zmq`) must reach the process that
dispatched the call, so they cannot be combined with N > 1.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType

from agentserve.config import ConfigError, FrontendConfig
from agentserve.frontend.up import SIGNING_KEY_ENV

log = logging.getLogger("agentserve.frontend")

PROCESS_ENV = "AGENTSERVE_FRONTEND_PROCESS"  # set in a child: its index
PORT_ENV = "AGENTSERVE_FRONTEND_PORT"  # set in a child: the port the supervisor reserved
RESTART_DELAY_S = 1.0


def check(config: FrontendConfig, environ: Mapping[str, str] = os.environ) -> None:
    """Refuse settings that N processes would silently break."""
    if config.processes <= 1:
        return
    if not (config.state_url or config.state_url_file):
        raise ConfigError(
            f"processes={config.processes} needs a shared state store (--state-url redis://…): without "
            "one each process keeps its own call memory and response store, and a client's next turn "
            "lands on a process that does not know its previous one"
        )
    if config.tool_events_zmq:
        raise ConfigError(
            "tool_events_zmq cannot be used with processes > 1: harness tool events must reach the "
            "process that dispatched the call"
        )


def child_index(environ: Mapping[str, str] = os.environ) -> int | None:
    raw = environ.get(PROCESS_ENV)
    return int(raw) if raw is not None and raw.isdigit() else None


def child_config(config: FrontendConfig, index: int) -> FrontendConfig:
    """A child's own settings: its trace file."""
    if config.trace_sink is None:
        return config
    return config.model_copy(update={"trace_sink": f"{config.trace_sink}.p{index}"})


def _reuseport(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def listening_socket(host: str, environ: Mapping[str, str] = os.environ) -> socket.socket:
    """A child's listening socket on the supervisor's port (SO_REUSEPORT)."""
    sock = _reuseport(host, int(environ[PORT_ENV]))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Supervisor:
    def __init__(self, config: FrontendConfig, argv: Sequence[str]) -> None:
        self.config = config
        self.argv = list(argv)
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping: int | None = None  # the signal being forwarded, once one arrived
        self.holder = _reuseport(config.host, config.port)  # reserves the port; never listens
        self.port = int(self.holder.getsockname()[1])
        self.env = dict(os.environ)
        self.env[PORT_ENV] = str(self.port)
        if config.signing_key_file is None and not self.env.get(SIGNING_KEY_ENV):
            # One random key for all processes: a signature made by one must verify on another.
            self.env[SIGNING_KEY_ENV] = secrets.token_hex(32)

    def _start(self, index: int) -> None:
        env = {**self.env, PROCESS_ENV: str(index)}
        self.children[index] = subprocess.Popen([sys.executable, "-m", "agentserve", *self.argv], env=env)

    def _signal(self, sig: int, frame: FrameType | None) -> None:
        self.stopping = sig
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(sig)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        for i in range(self.config.processes):
            self._start(i)
        log.warning(
            "agentserve frontend: %d processes on %s:%d (SO_REUSEPORT)",
            self.config.processes,
            self.config.host,
            self.port,
        )
        try:
            while True:
                live = 0
                for i, child in list(self.children.items()):
                    code = child.poll()
                    if code is None:
                        live += 1
                    elif self.stopping is None and code == 2:  # a configuration error: same for all
                        log.error("frontend process %d refused its configuration: stopping", i)
                        self._signal(signal.SIGTERM, None)
                        return 2
                    elif self.stopping is None:
                        log.error("frontend process %d exited (%s): restarting it", i, code)
                        time.sleep(RESTART_DELAY_S)
                        self._start(i)
                        live += 1
                if live == 0:
                    return 0
                time.sleep(0.2)
        finally:
            self.holder.close()


__all__ = ["Supervisor", "check", "child_config", "child_index", "listening_socket"]
