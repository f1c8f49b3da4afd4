"""`agentserve frontend --processes N`: N processes on one SO_REUSEPORT port, one signing key."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from stack import serving

from agentserve.config import WorkerConfig
from agentserve.worker.main import build_engine
from agentserve.worker.publisher import KvEventPublisher
from agentserve.worker.service import create_app as worker_app
from redisproc import redis_server

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT load balancing is Linux's")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    out = subprocess.run(
        check=False, args=["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True, text=True
    ).stdout
    return [int(x) for x in out.split()]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENTSERVE_SIGNING_KEY"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3] / "src")
    return env


def test_more_than_one_process_needs_a_shared_state_store() -> None:
    cmd = [sys.executable, "-m", "agentserve", "frontend", "--worker-urls", "http://127.0.0.1:1"]
    done = subprocess.run(
        [*cmd, "--processes", "2"], check=False, capture_output=True, text=True, env=_env(), timeout=60
    )
    assert done.returncode == 2
    assert "needs a shared state store" in done.stderr


def test_two_processes_share_the_port_and_the_signing_key(tmp_path: Any) -> None:
    engine = build_engine(WorkerConfig.model_validate({"family": "qwen3", "sim_speedup": 0}))
    port = _free_port()
    with (
        redis_server() as redis,
        serving(worker_app(engine, publisher=KvEventPublisher("tcp://127.0.0.1:*"))) as (worker_url, _),
    ):
        cmd = [sys.executable, "-m", "agentserve", "frontend", "--model", "qwen3-sim", "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--worker-urls", worker_url, "--state-url", redis.url]
        cmd += ["--processes", "2", "--drain-delay-s", "0"]
        log = open(tmp_path / "frontend.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env())
        try:
            url = f"http://127.0.0.1:{port}"
            fingerprints = set()
            deadline = time.monotonic() + 60
            answered = 0
            while answered < 40 and time.monotonic() < deadline:
                try:
                    # A new connection each time: the kernel picks a process per connection.
                    r = httpx.get(url + "/ready", headers={"connection": "close"})
                except httpx.TransportError:
                    time.sleep(0.1)
                    continue
                if r.status_code == 200:
                    fingerprints.add(r.json()["signing_key"])
                    answered += 1
                else:
                    time.sleep(0.1)
            assert answered == 40, (tmp_path / "frontend.log").read_text()
            assert len(_children(proc.pid)) == 2
            assert len(fingerprints) == 1  # a signature made by one process verifies on the other
            body = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
            for _ in range(6):
                r = httpx.post(url + "/v1/chat/completions", json=body, headers={"connection": "close"})
                assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
            proc.send_signal(signal.SIGTERM)  # forwarded: each child drains and exits
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            log.close()
