"""`agentserve up` as a user runs it: a subprocess that prints its URL and harness settings."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import openai

ROOT = Path(__file__).resolve().parents[3]


def test_agentserve_up_serves_and_prints_the_harness_settings() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentserve", "up", "--port", "0", "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if "model: qwen3-sim" in line:  # the last line of the settings
                break
        text = "".join(lines)
        match = re.search(r"agentserve is up at (http://127\.0\.0\.1:\d+)", text)
        assert match, text
        elapsed = time.monotonic() - started
        assert elapsed < 30, f"startup took {elapsed:.1f} s"
        base = match.group(1)
        assert f"export ANTHROPIC_BASE_URL={base}\n" in text
        assert 'wire_api = "responses"' in text and f'base_url = "{base}/v1"' in text
        answer = anthropic.Anthropic(base_url=base, api_key="agentserve", max_retries=0).messages.create(
            model="qwen3-sim", max_tokens=64, messages=[{"role": "user", "content": "hello there"}]
        )
        assert (
            answer.content[-1].type == "text" and "hello there" in answer.content[-1].text
        )  # the echo policy
        models = openai.OpenAI(base_url=base + "/v1", api_key="agentserve", max_retries=0).models.list()
        assert [m.id for m in models] == ["qwen3-sim"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0


def test_agentserve_up_refuses_a_bad_script(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    bad = tmp_path / "scenario.yaml"
    bad.write_text("rules: [{turn: 0, output: x}]\n")
    result = subprocess.run(
        [sys.executable, "-m", "agentserve", "up", "--port", "0", "--script", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "agentserve up:" in result.stderr and "turn" in result.stderr
