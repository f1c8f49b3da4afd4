"""pi-coding-agent (`pi -p`, OpenAI Chat Completions) completing a scripted tool loop against agentserve."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness_stack import (
    MODEL,
    SCENARIOS,
    Stack,
    check_conversation_key,
    check_loop_traces,
    delta,
    running_stack,
    scenario_args,
)
from harness_tools import FINAL_TEXT, MISS, PROMPT, Run, base_env, check_loop_files, explain, require, run

pytestmark = pytest.mark.slow

TIMEOUT_S = 180.0


def pi(binary: Path, stack: Stack, workdir: Path, prompt: str) -> Run:
    """One session; pi reads its providers from ~/.pi/agent/models.json."""
    home, project = workdir / "home", workdir / "project"
    project.mkdir(parents=True)
    agent_dir = home / ".pi" / "agent"
    agent_dir.mkdir(parents=True)
    provider = {
        "baseUrl": f"{stack.base_url}/v1",
        "api": "openai-completions",
        "apiKey": "agentserve-test",
        "models": [
            {
                "id": MODEL,
                "name": MODEL,
                "reasoning": True,
                "input": ["text"],
                "contextWindow": 131072,
                "maxTokens": 32000,
            }
        ],
    }
    (agent_dir / "models.json").write_text(json.dumps({"providers": {"agentserve": provider}}, indent=2))
    env = base_env(home, PI_OFFLINE="1", PI_TELEMETRY="0")
    argv = [str(binary), "--provider", "agentserve", "--model", MODEL, "--mode", "json", "-p", prompt]
    return run(argv, cwd=project, env=env, timeout=TIMEOUT_S)


def assistant_messages(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        e["message"] for e in events if e.get("type") == "message_end" and e["message"]["role"] == "assistant"
    ]


@pytest.fixture(scope="module")
def binary() -> Path:
    return require("pi")


@pytest.fixture(scope="module")
def stack(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("pi-stack"), scenario_args("pi.yaml")) as s:
        yield s


def test_pi_completes_a_multi_turn_tool_loop(binary: Path, stack: Stack, tmp_path: Path) -> None:
    before, traced = stack.metrics(), stack.trace_count()
    result = pi(binary, stack, tmp_path, PROMPT)
    events = result.json_lines()
    with explain(result, log=stack.log()):
        assert result.returncode == 0
        assert MISS not in result.stdout
        check_loop_files(tmp_path / "project")

        ends = [e for e in events if e.get("type") == "tool_execution_end"]
        assert [e["toolName"] for e in ends] == ["bash"] * 3
        assert all(not e["isError"] for e in ends)
        outputs = ["".join(c["text"] for c in e["result"]["content"]) for e in ends]
        assert outputs[0] == "agentserve-42\n"
        assert sorted(outputs[1:]) == ["AGENTSERVE-42\n", "size=14\n"]

        replies = assistant_messages(events)
        assert len(replies) == 3
        kinds = [[b["type"] for b in m["content"]] for m in replies]
        assert kinds[0] == ["thinking", "text", "toolCall"]
        # Chat Completions has one reasoning field per message: the two segments arrive joined
        assert kinds[1] == ["thinking", "toolCall", "toolCall"]
        assert kinds[2] == ["thinking", "text"]
        assert replies[1]["content"][0]["thinking"] == (
            "proof.txt says agentserve-42. Upper-case it into upper.txt.\n\n"
            "And measure the original file at the same time."
        )
        assert replies[2]["content"][1]["text"] == FINAL_TEXT
        assert all(m["stopReason"] in ("toolUse", "stop") for m in replies)

        # usage from the final usage chunk: turn 1 cold, later turns read the previous prompt from cache
        usage = [m["usage"] for m in replies]
        assert usage[0]["cacheRead"] == 0
        for previous, current in itertools.pairwise(usage):
            assert current["cacheRead"] >= 0.9 * (previous["input"] + previous["cacheRead"])

    after = stack.metrics()
    records = stack.traces(3, after=traced)
    turns = check_loop_traces(records, "chat", "bash")
    # pi sends no session id: the conversation's own key groups its turns (all three), and
    # each later turn extended the previous prompt + output (no drift).
    check_conversation_key(records)
    assert all(t["drift"] is not None and not t["drift"]["drifted"] for t in turns[1:]), turns

    assert delta(before, after, "agentserve_frontend_requests_total", api="chat") == 3
    assert delta(before, after, "agentserve_frontend_tool_calls_total", api="chat") == 3
    assert delta(before, after, "agentserve_frontend_cached_tokens_total", api="chat") > 0


@pytest.mark.parametrize("exact_replay", [True, False], ids=["exact-replay", "template-only"])
def test_pi_loop_stays_append_only_when_the_model_writes_its_own_whitespace(
    binary: Path, tmp_path: Path, exact_replay: bool
) -> None:
    # The same loop, the model writing one newline after </think> where the qwen3 template writes two
    # and a space before each call (issue 18, item 4).
    text = (SCENARIOS / "pi.yaml").read_text()
    deviant = text.replace("</think>\n\n", "</think>\n").replace("\n<tool_call>", "\n <tool_call>")
    assert deviant != text
    scenario = tmp_path / "pi-deviant.yaml"
    scenario.write_text(deviant)
    args = ["--script", str(scenario), "--sim-speedup", "0", "--model", MODEL]
    if not exact_replay:
        args.append("--no-exact-replay")
    (tmp_path / "stack").mkdir()
    with running_stack(tmp_path / "stack", args) as stack:
        result = pi(binary, stack, tmp_path / "run", PROMPT)
        with explain(result, log=stack.log()):
            assert result.returncode == 0
            assert MISS not in result.stdout
        turns = check_loop_traces(stack.traces(3), "chat", "bash")
    drifted = [t["drift"]["drifted"] for t in turns[1:]]
    assert drifted == ([False, False] if exact_replay else [True, True]), [t["drift"] for t in turns]
