"""Claude Code (`claude -p`, Anthropic Messages) completing a scripted tool loop against agentserve."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness_stack import MODEL, Stack, check_loop_traces, delta, running_stack, scenario_args
from harness_tools import FINAL_TEXT, MISS, PROMPT, Run, base_env, check_loop_files, explain, require, run

pytestmark = pytest.mark.slow

TIMEOUT_S = 180.0


def claude(binary: Path, stack: Stack, workdir: Path, prompt: str, *env_extra: tuple[str, str]) -> Run:
    """One headless session with HOME and project directory under `workdir` (made when missing)."""
    project = workdir / "project"
    project.mkdir(parents=True, exist_ok=True)
    env = base_env(
        workdir / "home",
        ANTHROPIC_BASE_URL=stack.base_url,
        ANTHROPIC_API_KEY="sk-agentserve-test",
        ANTHROPIC_MODEL=MODEL,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        **dict(env_extra),
    )
    # As root `--dangerously-skip-permissions` is refused; allowing Bash is what the loop needs.
    argv = [
        str(binary),
        "-p",
        prompt,
        "--allowedTools",
        "Bash",
        "--output-format",
        "stream-json",
        "--verbose",
    ]
    return run(argv, cwd=project, env=env, timeout=TIMEOUT_S)


def assistant_turns(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per model response: its block types in order and its usage (stream-json splits a
    response into one event per block, all with the same message id)."""
    turns: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("type") != "assistant":
            continue
        message = e["message"]
        turn = turns.setdefault(message["id"], {"blocks": [], "usage": message.get("usage", {})})
        turn["blocks"].extend(message["content"])
    return list(turns.values())


def tool_results(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        if e.get("type") == "user":
            out += [b["content"] for b in e["message"]["content"] if b.get("type") == "tool_result"]
    return out


def billing_suffix(prompt: str, version: str = "2.1.330") -> str:
    """The 3 hex Claude Code appends to cc_version in its billing line, from the first prompt
    (layout in shared/reference/harness-traffic.md): sessions with different prompts differ there."""
    t = prompt + "0" * 21
    return hashlib.sha256(f"59cf53e54c78{t[4]}{t[7]}{t[20]}{version}".encode()).hexdigest()[:3]


@pytest.fixture(scope="module")
def binary() -> Path:
    return require("claude")


@pytest.fixture(scope="module")
def stack(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("claude-stack"), scenario_args("claude-code.yaml")) as s:
        yield s


def test_claude_code_completes_a_multi_turn_tool_loop(binary: Path, stack: Stack, tmp_path: Path) -> None:
    before, traced = stack.metrics(), stack.trace_count()
    result = claude(binary, stack, tmp_path, PROMPT)
    events = result.json_lines()
    with explain(result, log=stack.log()):
        assert result.returncode == 0
        assert MISS not in result.stdout
        final = [e for e in events if e.get("type") == "result"]
        assert final and final[-1]["subtype"] == "success" and final[-1]["is_error"] is False
        assert final[-1]["result"] == FINAL_TEXT

        # The tools really ran, in the project directory, and their output went back to the model.
        check_loop_files(tmp_path / "project")
        assert tool_results(events) == ["agentserve-42", "AGENTSERVE-42", "size=14"]

        turns = assistant_turns(events)
        assert len(turns) == 3
        kinds = [[b["type"] for b in t["blocks"]] for t in turns]
        assert kinds[0] == ["thinking", "text", "tool_use"]
        # interleaved reasoning stays where the model put it: one thinking block before each call
        assert kinds[1] == ["thinking", "tool_use", "thinking", "tool_use"]
        assert kinds[2] == ["thinking", "text"]
        calls = [b for t in turns for b in t["blocks"] if b["type"] == "tool_use"]
        assert [c["name"] for c in calls] == ["Bash"] * 3
        assert calls[1]["input"]["command"] == "tr a-z A-Z < proof.txt > upper.txt && cat upper.txt"
        assert all(b.get("signature") for t in turns for b in t["blocks"] if b["type"] == "thinking")

        # Each turn re-sends the previous one: the prefix cache serves all of it from turn 2 on.
        usage = [t["usage"] for t in turns]
        assert usage[0]["cache_read_input_tokens"] == 0  # a fresh stack: nothing cached yet
        for previous, current in itertools.pairwise(usage):
            previous_prompt = previous["input_tokens"] + previous["cache_read_input_tokens"]
            assert current["cache_read_input_tokens"] >= 0.95 * previous_prompt

    # What the server saw: three Anthropic requests, three dispatched calls, the billing line stripped.
    after = stack.metrics()
    records = stack.traces(3, after=traced)
    turns = check_loop_traces(records, "anthropic", "Bash")
    # one session, named by Claude Code's own header
    assert {(r["agent_context"]["session_id"], r["agent_context"]["source"]) for r in records} == {
        (records[0]["agent_context"]["session_id"], "header:x-claude-code-session-id")
    }
    assert all(t["stripped"] == {"anthropic_billing": 1} for t in turns)  # the billing line, every turn
    assert all(t["drift"] is None or not t["drift"]["drifted"] for t in turns)

    assert delta(before, after, "agentserve_frontend_requests_total", api="anthropic") == 3
    assert delta(before, after, "agentserve_frontend_tool_calls_total", api="anthropic") == 3
    assert delta(before, after, "agentserve_frontend_cached_tokens_total", api="anthropic") > 0
    assert delta(before, after, "agentserve_frontend_stripped_spans_total") >= 3
    # Claude Code sends history back byte for byte: each prompt extends the previous prompt + output.
    assert delta(before, after, "agentserve_frontend_prefix_drift_events_total", api="anthropic") == 0


def first_turn_usage(result: Run) -> dict[str, int]:
    turns = assistant_turns(result.json_lines())
    assert turns, "no model response"
    usage: dict[str, int] = turns[0]["usage"]
    return usage


PROMPT_A = "Write proof.txt with your shell tool, then say done."
PROMPT_B = "Please write proof.txt using the shell tool and then say done."


@pytest.mark.parametrize("strip", [True, False], ids=["stripped", "unstripped"])
def test_two_claude_code_sessions_share_their_system_and_tools_prefix(
    binary: Path, tmp_path_factory: pytest.TempPathFactory, strip: bool
) -> None:
    """The billing line (system[0]) differs per conversation; stripped, a new session's first turn
    reads the whole system+tools prefix from cache. The unstripped run shows the test can fail.
    Both sessions run as one user in one project (same HOME and working directory, which Claude
    Code writes into its system prompt), as two conversations in a repository do."""
    assert billing_suffix(PROMPT_A) != billing_suffix(PROMPT_B)  # two different billing lines
    workdir = tmp_path_factory.mktemp("claude-prefix")
    flag = "--strip-anthropic-preamble" if strip else "--no-strip-anthropic-preamble"
    with running_stack(workdir, scenario_args("claude-code.yaml", flag)) as stack:
        first = claude(binary, stack, workdir, PROMPT_A)
        second = claude(binary, stack, workdir, PROMPT_B)
        with explain(first, second, log=stack.log()):
            assert first.returncode == 0 and second.returncode == 0
            a, b = first_turn_usage(first), first_turn_usage(second)
            assert a["cache_read_input_tokens"] == 0
            total_b = b["input_tokens"] + b["cache_read_input_tokens"]
            if strip:
                # 2.1.330 sends system (~7K chars) + tools (~32K chars), then the first user message:
                # a <system-reminder>, the prompt, and a system-role environment message after it.
                # Everything up to the prompt is shared: ~79 % of the ~16K-token request.
                assert b["cache_read_input_tokens"] >= 0.75 * total_b, json.dumps(b)
            else:
                assert b["cache_read_input_tokens"] < 64, json.dumps(b)  # diverges at the first block
