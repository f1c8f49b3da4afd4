"""OpenClaw (`openclaw agent exec`, OpenAI Chat Completions) completing a scripted tool loop against
agentserve. OpenClaw runs on the Node 24 that scripts/install-harnesses takes from npm."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness_stack import (
    MODEL,
    Stack,
    check_conversation_key,
    check_loop_traces,
    delta,
    running_stack,
    scenario_args,
)
from harness_tools import FINAL_TEXT, MISS, PROMPT, Run, base_env, check_loop_files, explain, require, run

pytestmark = pytest.mark.slow

TIMEOUT_S = 300.0  # ~20-40 s of it is OpenClaw's own start-up


def openclaw(binary: Path, stack: Stack, workdir: Path, prompt: str) -> Run:
    home, project = workdir / "home", workdir / "project"
    project.mkdir(parents=True)
    model = {
        "id": MODEL,
        "name": MODEL,
        "reasoning": True,
        "input": ["text"],
        "contextWindow": 131072,
        "maxTokens": 32000,
    }
    provider = {
        "baseUrl": f"{stack.base_url}/v1",
        "apiKey": "agentserve-test",
        "api": "openai-completions",
        "models": [model],
    }
    config = workdir / "openclaw.json"  # JSON is JSON5
    config.write_text(json.dumps({"models": {"providers": {"agentserve": provider}}}, indent=2))
    argv = [
        str(binary),
        "agent",
        "exec",
        "--config",
        str(config),
        "--model",
        f"agentserve/{MODEL}",
        "--cwd",
        str(project),
        "--json",
        prompt,
    ]
    return run(argv, cwd=project, env=base_env(home), timeout=TIMEOUT_S)


def report(result: Run) -> dict[str, Any]:
    """The one JSON document `--json` prints at the end."""
    start = result.stdout.find("{")
    assert start >= 0, "no JSON report on stdout"
    value: dict[str, Any] = json.loads(result.stdout[start:])
    return value


@pytest.fixture(scope="module")
def binary() -> Path:
    return require("openclaw")


@pytest.fixture(scope="module")
def stack(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("openclaw-stack"), scenario_args("openclaw.yaml")) as s:
        yield s


def test_openclaw_completes_a_multi_turn_tool_loop(binary: Path, stack: Stack, tmp_path: Path) -> None:
    before, traced = stack.metrics(), stack.trace_count()
    result = openclaw(binary, stack, tmp_path, PROMPT)
    with explain(result, log=stack.log()):
        assert result.returncode == 0
        assert MISS not in result.stdout
        check_loop_files(tmp_path / "project")
        out = report(result)
        assert out["ok"] is True and out["status"] == "ok"
        assert out["final"] == FINAL_TEXT
        assert out["assistantTurns"] == 3
        assert out["toolSummary"] == {"calls": 3, "tools": ["exec"], "failures": 0}
        assert out["usage"]["cacheRead"] > 0
        assert out["usage"]["reasoningTokens"] > 0

    after = stack.metrics()
    records = stack.traces(3, after=traced)
    check_loop_traces(records, "chat", "exec")
    check_conversation_key(records)  # no session header: the conversation's own key

    assert delta(before, after, "agentserve_frontend_requests_total", api="chat") == 3
    assert delta(before, after, "agentserve_frontend_tool_calls_total", api="chat") == 3
    assert delta(before, after, "agentserve_frontend_cached_tokens_total", api="chat") > 0
