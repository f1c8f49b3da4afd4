from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_tokenizer import write_tiny_tokenizer

from agentserve.worker.client import WorkerClient
from agentserve.worker.engine import GenerateRequest, SamplingParams

ROOT = Path(__file__).parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(
        [sys.executable, "-m", "agentserve", "worker", "--host", "127.0.0.1", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def first_stream(url: str, prompt: list[int]) -> str:
    async with WorkerClient(url) as client:
        for _ in range(300):
            if await client.ready():
                break
            await asyncio.sleep(0.02)
        stream = await client.generate(GenerateRequest("cli", prompt, SamplingParams(max_tokens=100)))
        return "".join([s.text async for s in stream])


def test_agentserve_worker_sim_starts_and_serves_a_stream(tmp_path: Path) -> None:
    tok = write_tiny_tokenizer(tmp_path)
    script = tmp_path / "scenario.yaml"
    script.write_text('rules:\n  - turn: 1\n    output: "<tool_call>\\n{}\\n</tool_call>"\n')
    port = free_port()
    proc = worker(
        "--engine", "sim", "--port", str(port), "--kv-events-port", str(free_port()),
        "--tokenizer", str(tok), "--sim-speedup", "inf", "--sim-script", str(script),
    )  # fmt: skip
    try:
        t0 = time.monotonic()
        text = asyncio.run(first_stream(f"http://127.0.0.1:{port}", [1, 2, 3]))
        elapsed = time.monotonic() - t0
        assert text == "<tool_call>\n{}\n</tool_call>"
        print(f"worker up and first stream served in {elapsed:.2f} s")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode in (0, -15), out.decode()
    assert b"sim engine" in out


def test_bad_worker_settings_exit_with_a_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: 3\n")
    proc = worker("--sim-script", str(bad), "--port", str(free_port()))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert b"rules" in out and b"Traceback" not in out


@pytest.mark.parametrize("flag", ["--sim-speedup=-1", "--max-batch-size=0", "--sim-dp-ranks=0"])
def test_out_of_range_flags_are_rejected(flag: str) -> None:
    proc = worker(flag)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2 and b"Traceback" not in out


async def _ranks(url: str) -> tuple[int, list[int | None]]:
    async with WorkerClient(url) as client:
        for _ in range(300):
            if await client.ready():
                break
            await asyncio.sleep(0.02)
        info = await client.info()
        snaps = [await client.kv_snapshot(r) for r in range(int(info["dp_ranks"]))]
        return int(info["dp_ranks"]), [s.dp_rank for s in snaps]


def test_agentserve_worker_sim_with_attention_dp_ranks() -> None:
    port = free_port()
    proc = worker(
        "--engine", "sim", "--port", str(port), "--kv-events-port", str(free_port()),
        "--sim-speedup", "inf", "--sim-dp-ranks", "3",
    )  # fmt: skip
    try:
        assert asyncio.run(_ranks(f"http://127.0.0.1:{port}")) == (3, [0, 1, 2])
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode in (0, -15), out.decode()
