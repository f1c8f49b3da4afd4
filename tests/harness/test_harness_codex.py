"""Codex CLI (`codex exec`, OpenAI Responses) completing a scripted tool loop against agentserve."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness_stack import MODEL, Stack, check_loop_traces, delta, running_stack, scenario_args
from harness_tools import FINAL_TEXT, MISS, PROMPT, Run, base_env, check_loop_files, explain, require, run

pytestmark = pytest.mark.slow

TIMEOUT_S = 180.0


def codex_home(stack: Stack, home: Path) -> Path:
    """$CODEX_HOME with a provider for the stack (Responses wire API) and the model catalog agentserve
    serves (`/v1/models` carries Codex's `models` list), so Codex knows the model and does not warn."""
    home.mkdir(parents=True)
    with urllib.request.urlopen(f"{stack.base_url}/v1/models", timeout=10) as resp:
        (home / "agentserve-models.json").write_bytes(resp.read())
    (home / "config.toml").write_text(
        f"""\
model = "{MODEL}"
model_provider = "agentserve"
model_catalog_json = "{home / "agentserve-models.json"}"

[model_providers.agentserve]
name = "agentserve"
base_url = "{stack.base_url}/v1"
env_key = "AGENTSERVE_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""
    )
    return home


def codex(binary: Path, stack: Stack, workdir: Path, prompt: str) -> Run:
    project = workdir / "project"
    project.mkdir(parents=True)
    env = base_env(
        workdir / "home",
        CODEX_HOME=str(codex_home(stack, workdir / "codex-home")),
        AGENTSERVE_API_KEY="agentserve-test",
    )
    argv = [
        str(binary),
        "exec",
        "--skip-git-repo-check",
        "--json",
        # a throwaway tmp project: no sandbox (it needs namespaces CI may not have), no approvals
        "--dangerously-bypass-approvals-and-sandbox",
        prompt,
    ]
    return run(argv, cwd=project, env=env, timeout=TIMEOUT_S)


def items(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["item"] for e in events if e.get("type") == "item.completed" and e["item"]["type"] == kind]


@pytest.fixture(scope="module")
def binary() -> Path:
    return require("codex")


@pytest.fixture(scope="module")
def stack(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("codex-stack"), scenario_args("codex.yaml")) as s:
        yield s


def test_codex_completes_a_multi_turn_tool_loop(binary: Path, stack: Stack, tmp_path: Path) -> None:
    before, traced = stack.metrics(), stack.trace_count()
    result = codex(binary, stack, tmp_path, PROMPT)
    events = result.json_lines()
    with explain(result, log=stack.log()):
        assert result.returncode == 0
        assert MISS not in result.stdout
        # the served catalog was accepted: no "Model metadata … not found" and no other error item
        assert items(events, "error") == []
        assert [e["type"] for e in events if e.get("type", "").startswith("turn.")][-1] == "turn.completed"

        check_loop_files(tmp_path / "project")
        commands = items(events, "command_execution")
        assert [c["exit_code"] for c in commands] == [0, 0, 0]
        # the two calls of turn 2 may run in either order
        outputs = [c["aggregated_output"] for c in commands]
        assert outputs[0] == "agentserve-42\n"
        assert sorted(outputs[1:]) == ["AGENTSERVE-42\n", "size=14\n"]

        # reasoning arrives as the model wrote it, one item per segment, no markup left in
        reasoning = [r["text"] for r in items(events, "reasoning")]
        assert reasoning == [
            "I need a file whose content only the shell can produce: 6*7 evaluated by bash.",
            "proof.txt says agentserve-42. Upper-case it into upper.txt.",
            "And measure the original file at the same time.",
            "Both commands ran: upper.txt holds the upper-cased proof.",
        ]
        messages = [m["text"] for m in items(events, "agent_message")]
        assert messages == ["I'll write proof.txt with the shell.", FINAL_TEXT]

        usage = next(e["usage"] for e in events if e.get("type") == "turn.completed")
        assert usage["cached_input_tokens"] > 0
        assert usage["reasoning_output_tokens"] > 0

    after = stack.metrics()
    records = stack.traces(3, after=traced)
    check_loop_traces(records, "responses", "exec_command")
    assert len({r["agent_context"]["session_id"] for r in records}) == 1  # Codex's thread, all 3 turns
    assert records[0]["agent_context"]["session_id"] is not None

    assert delta(before, after, "agentserve_frontend_requests_total", api="responses") == 3  # nothing refused
    assert delta(before, after, "agentserve_frontend_tool_calls_total", api="responses") == 3
    # every turn after the first reads the previous prompt from cache
    cached = delta(before, after, "agentserve_frontend_cached_tokens_total", api="responses")
    assert cached >= 0.5 * delta(before, after, "agentserve_frontend_input_tokens_total", api="responses")
