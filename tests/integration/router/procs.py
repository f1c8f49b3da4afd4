"""Real `agentserve worker` / `agentserve router` processes on 127.0.0.1 ephemeral ports.

`Processes` starts them and, on exit, kills every one still running (SIGKILL after a short grace),
so a failing test never leaves a process behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx

ROOT = Path(__file__).parents[3]


_ISSUED: set[int] = set()


def free_port() -> int:
    """A free ephemeral port not handed out before in this process: a process started with one
    binds it only later, so the kernel may offer the same port again meanwhile (a router given a
    worker's port found that worker's `/ready` and answered its `/workers` with a 404)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _ISSUED:
            _ISSUED.add(port)
            return port


class Processes:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs = tempfile.TemporaryFile()  # noqa: SIM115 - closed in __exit__

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentserve", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._logs,  # a file, not a pipe: nobody has to drain it
        )
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        self._logs.seek(0)
        return self._logs.read().decode("utf-8", "replace")

    def worker(self, *extra: str) -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        proc = self.start(
            "worker", "--engine", "sim", "--host", "127.0.0.1", "--port", str(port),
            "--kv-events-port", str(free_port()),
            *(() if "--drain-delay-s" in extra else ("--drain-delay-s", "0")), *extra,
        )  # fmt: skip
        return f"http://127.0.0.1:{port}", proc

    def router(self, workers: list[str], *extra: str) -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        flags = [a for w in workers for a in ("--workers", w)]
        proc = self.start("router", "--host", "127.0.0.1", "--port", str(port), *flags, *extra)
        return f"http://127.0.0.1:{port}", proc

    def __enter__(self) -> Processes:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._logs.close()


def wait_ready(url: str, path: str = "/ready", timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url}{path} not ready after {timeout_s} s")
