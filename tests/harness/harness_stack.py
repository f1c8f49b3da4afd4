"""`agentserve up` as a subprocess on 127.0.0.1 (ephemeral port), and what it says on /metrics.

The stack runs exactly as a user starts it (`python -m agentserve up …`); the base URL is read from
its banner. It runs in its own process group, so teardown ends it and anything it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
MODEL = "qwen3-sim"  # `agentserve up`'s default model (family qwen3): the scenarios are written for it

_BANNER = re.compile(r"agentserve is up at (http://127\.0\.0\.1:\d+)")
START_TIMEOUT_S = 60.0


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class StackError(RuntimeError):
    pass


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    """How much the samples of `name` whose labels include `labels` grew between two scrapes."""
    want = set(labels.items())
    return sum(v - before.get((n, ls), 0.0) for (n, ls), v in after.items() if n == name and want <= set(ls))


@dataclass
class Stack:
    base_url: str
    process: subprocess.Popen[str]
    log_path: Path
    trace_path: Path

    def traces(self, count: int, *, after: int = 0, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Trace records (one per request, `request` part) from number `after` on, waiting up to
        `timeout` s for `count` of them (the sink writes off the request path, flushing within 1 s)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self.trace_path.read_text().splitlines() if self.trace_path.exists() else []
            records = [json.loads(line) for line in lines if line.strip()][after:]
            if len(records) >= count or time.monotonic() > deadline:
                return records
            time.sleep(0.1)

    def trace_count(self) -> int:
        return len(self.traces(0, timeout=0))

    def log(self) -> str:
        """What the server printed so far (shown when a test fails)."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def metrics(self) -> Samples:
        """Prometheus samples by (name, sorted labels)."""
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        out: Samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out


class _Reader:
    """Copies the server's output to its log (so a full pipe never blocks it) and finds the banner."""

    def __init__(self, process: subprocess.Popen[str], log: Path) -> None:
        self.process = process
        self.log = log
        self.base_url: str | None = None
        self.started = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        assert self.process.stdout is not None
        with self.log.open("a", encoding="utf-8") as sink:
            for line in self.process.stdout:
                sink.write(line)
                sink.flush()
                found = _BANNER.search(line) if self.base_url is None else None
                if found:
                    self.base_url = found.group(1)
                    self.started.set()
        self.started.set()  # the process ended: stop waiting

    def wait(self, timeout: float) -> str:
        self.started.wait(timeout)
        if self.base_url is None:
            raise StackError(
                f"agentserve up did not start (exit {self.process.poll()}):\n{self.log.read_text()}"
            )
        return self.base_url


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the whole group, SIGKILL after 10 s."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@contextlib.contextmanager
def running_stack(workdir: Path, args: Sequence[str]) -> Iterator[Stack]:
    """`agentserve up --host 127.0.0.1 --port 0 ARGS…` until the block ends."""
    log = workdir / "agentserve-up.log"
    log.write_text("")
    trace = workdir / "trace.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "agentserve", "up", "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--trace-sink", str(trace), *args]
    process = subprocess.Popen(
        cmd,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        base_url = _Reader(process, log).wait(START_TIMEOUT_S)
        yield Stack(base_url, process, log, trace)
    finally:
        stop(process)


def check_loop_traces(records: list[dict[str, Any]], api: str, tool: str) -> list[dict[str, Any]]:
    """Server-side facts of the scripted loop, one trace record per model response: 3 turns, the
    calls of each dispatched (1, then 2 in parallel, then none), the reasoning segments as scripted
    (1, 2 interleaved, 1), a cold first turn and prefix-cache hits on every later one."""
    assert len(records) == 3, f"{len(records)} trace records for a 3-turn loop"
    turns = [r["request"] for r in records]
    assert [t["api"] for t in turns] == [api] * 3
    assert [t["status"] for t in turns] == ["tool_calls", "tool_calls", "stop"]
    assert [[(c["name"], c["status"]) for c in t["tool_calls"]] for t in turns] == [
        [(tool, "dispatched")],
        [(tool, "dispatched")] * 2,
        [],
    ]
    assert [t["reasoning_segments"] for t in turns] == [1, 2, 1]
    assert turns[0]["cached_tokens"] == 0  # each test has a fresh stack
    assert all(t["cached_tokens"] > 0 for t in turns[1:])
    return turns


def check_conversation_key(records: list[dict[str, Any]]) -> None:
    """A harness that names no session gets the conversation's key, one for all its turns (turn 1's
    record is labelled once its reply anchors the key), in the traces as source `conversation`."""
    contexts = [r["agent_context"] for r in records]
    assert all(c["source"] == "conversation" and c["session_id"].startswith("conv-") for c in contexts), (
        contexts
    )
    assert len({c["session_id"] for c in contexts}) == 1, contexts


def scenario_args(scenario: str, *extra: str) -> list[str]:
    """Flags for a scripted sim: the scenario, no simulated waiting, the default model."""
    return ["--script", str(SCENARIOS / scenario), "--sim-speedup", "0", "--model", MODEL, *extra]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, process: subprocess.Popen[str], log: Path, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StackError(f"{url} exited ({process.returncode}):\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise StackError(f"{url} not ready after {timeout} s:\n{log.read_text()}")


@contextlib.contextmanager
def running_split_stack(
    workdir: Path, scenario: str, *, decode_workers: int = 2, prefill_workers: int = 1, threshold: int = 64
) -> Iterator[Stack]:
    """The network deployment as separate processes: `agentserve worker` ×(decode + prefill) running
    `scenario`, `agentserve router --prefill-workers …`, `agentserve frontend --router-url …`. The
    `Stack` is the frontend (its process; teardown ends every process)."""
    log = workdir / "agentserve-split.log"
    log.write_text("")
    trace = workdir / "trace.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        with log.open("a", encoding="utf-8") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "agentserve", *args],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        procs.append(process)
        return process

    def worker(role: str) -> str:
        port = _free_port()
        process = start(
            "worker", "--engine", "sim", "--host", "127.0.0.1", "--port", str(port),
            "--kv-events-port", str(_free_port()), "--drain-delay-s", "0", "--role", role,
            "--model", MODEL, "--sim-script", str(SCENARIOS / scenario), "--sim-speedup", "0",
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        _wait_http(url + "/ready", process, log)
        return url

    try:
        decode = [worker("decode") for _ in range(decode_workers)]
        prefill = [worker("prefill") for _ in range(prefill_workers)]
        router_port = _free_port()
        router = start(
            "router", "--host", "127.0.0.1", "--port", str(router_port),
            *(a for url in decode for a in ("--workers", url)),
            *(a for url in prefill for a in ("--prefill-workers", url)),
            "--prefill-threshold-tokens", str(threshold),
        )  # fmt: skip
        router_url = f"http://127.0.0.1:{router_port}"
        _wait_http(router_url + "/ready", router, log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:  # every worker routable (their KV snapshots synced)
            with urllib.request.urlopen(router_url + "/workers", timeout=5) as resp:
                if json.loads(resp.read())["routable"] == decode_workers + prefill_workers:
                    break
            time.sleep(0.1)
        port = _free_port()
        frontend = start(
            "frontend", "--host", "127.0.0.1", "--port", str(port), "--router-url", router_url,
            "--model", MODEL, "--trace-sink", str(trace),
        )  # fmt: skip
        base_url = f"http://127.0.0.1:{port}"
        _wait_http(base_url + "/ready", frontend, log)
        yield Stack(base_url, frontend, log, trace)
    finally:
        for process in reversed(procs):
            stop(process)
