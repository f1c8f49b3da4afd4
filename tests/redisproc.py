"""A real redis-server on a free loopback port for one test module (Debian's `redis-server`, which
scripts/test installs). Started without persistence, killed afterwards; skips with the reason when
the binary is missing."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass
class RedisProcess:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def start_again(self) -> None:
        """Restart on the same port (an outage that ends)."""
        self.stop()
        self.process = _spawn(self.port)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(port: int) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    assert binary is not None
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as c:
            c.sendall(b"PING\r\n")
            if c.recv(16).startswith(b"+PONG"):
                return process
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode}")
        time.sleep(0.02)
    process.kill()
    raise RuntimeError("redis-server did not answer PING")


@contextlib.contextmanager
def redis_server() -> Iterator[RedisProcess]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/install-redis installs Debian's package)")
    port = _free_port()
    server = RedisProcess(port, _spawn(port))
    try:
        yield server
    finally:
        server.stop()
