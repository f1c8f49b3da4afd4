"""Real harnesses completing their scripted tool loops against the network deployment with
disaggregated prefill: a frontend, a router, 1 prefill + 2 decode sim workers, all separate
processes. Each loop must pass the checks it passes against `agentserve up`, and the traces show
where each turn's prompt was prefilled (the cold first turn on the prefill worker)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness_stack import check_loop_traces, running_split_stack
from harness_tools import MISS, PROMPT, Run, check_loop_files, explain, require
from test_harness_claude_code import claude
from test_harness_codex import codex
from test_harness_pi import pi

pytestmark = pytest.mark.slow

HARNESSES: dict[str, tuple[str, Callable[..., Run], str, str]] = {
    # name: (binary, runner, scenario, (api, tool) as the traces name them)
    "pi": ("pi", pi, "pi.yaml", "chat:bash"),
    "claude-code": ("claude", claude, "claude-code.yaml", "anthropic:Bash"),
    "codex": ("codex", codex, "codex.yaml", "responses:exec_command"),
}


def check_prefill(turns: list[dict[str, Any]]) -> None:
    prefill = [t["prefill"] for t in turns]
    assert all(p is not None for p in prefill), prefill
    assert prefill[0]["where"] == "remote" and prefill[0]["outcome"] == "remote", prefill[0]
    assert prefill[0]["received_tokens"] > 0
    assert all(p["outcome"] in ("local", "remote") for p in prefill), prefill


@pytest.mark.parametrize("harness", list(HARNESSES))
def test_the_tool_loop_over_prefill_and_decode_workers(harness: str, tmp_path: Path) -> None:
    name, runner, scenario, where = HARNESSES[harness]
    binary = require(name)
    api, tool = where.split(":")
    (tmp_path / "stack").mkdir()
    with running_split_stack(tmp_path / "stack", scenario) as stack:
        result = runner(binary, stack, tmp_path / "run", PROMPT)
        with explain(result, log=stack.log()):
            assert result.returncode == 0
            assert MISS not in result.stdout
            check_loop_files(tmp_path / "run" / "project")
        turns = check_loop_traces(stack.traces(3), api, tool)
    check_prefill(turns)
