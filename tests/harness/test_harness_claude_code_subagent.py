"""A real Claude Code session that delegates to a subagent (issue 29): `claude -p` against `agentserve
up`, the sim scripted to call the Agent tool (tests/harness/scenarios/claude-code-subagent.yaml).

What Claude Code 2.1.330 sends for the subagent, as captured against agentserve: the parent's
`X-Claude-Code-Session-Id`, its own `x-claude-code-agent-id`, no `x-claude-code-parent-agent-id` for a
child of the main session (a nested child names its parent agent there), and `cc_is_subagent=true;`
in the billing line; the first user message holds `<system-reminder>` blocks, then the Agent call's
prompt as a block of its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness_stack import MODEL, Stack, running_stack, scenario_args
from harness_tools import MISS, base_env, explain, require, run

from agentserve.telemetry.report import load, summarize

pytestmark = pytest.mark.slow

TIMEOUT_S = 180.0
DONE = "SUBAGENT-LOOP-DONE: the subagent reported the magic word."


@pytest.fixture(scope="module")
def binary() -> Path:
    return require("claude")


@pytest.fixture(scope="module")
def stack(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    args = scenario_args("claude-code-subagent.yaml", "--no-trace-gzip")
    with running_stack(tmp_path_factory.mktemp("claude-subagent-stack"), args) as s:
        yield s


def test_claude_code_delegates_to_a_subagent_and_the_trace_shows_the_tree(
    binary: Path, stack: Stack, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    env = base_env(
        tmp_path / "home",
        ANTHROPIC_BASE_URL=stack.base_url,
        ANTHROPIC_API_KEY="sk-agentserve-test",
        ANTHROPIC_MODEL=MODEL,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
    )
    argv = [
        str(binary),
        "-p",
        "Use a subagent to find the magic word.",
        "--allowedTools",
        "Agent",
        "--output-format",
        "stream-json",
        "--verbose",
    ]
    traced = stack.trace_count()
    result = run(argv, cwd=project, env=env, timeout=TIMEOUT_S)
    events = result.json_lines()
    with explain(result, log=stack.log()):
        assert result.returncode == 0
        assert MISS not in result.stdout
        final = [e for e in events if e.get("type") == "result"]
        assert final and final[-1]["subtype"] == "success" and final[-1]["result"] == DONE
        assert final[-1]["subagent_stats"]["spawned"] == 1  # Claude Code's own count

        # Three requests: the main session's Agent call, the subagent's answer, the resume.
        records = stack.traces(3, after=traced)
        assert len(records) == 3, records
        spawn, child, resume = (r["agent_context"] for r in records)
        root = spawn["session_id"]
        assert spawn["source"] == resume["source"] == "header:x-claude-code-session-id"
        assert resume["session_id"] == root and spawn["parent_session_id"] is None
        assert child["source"] == "header:x-claude-code-agent-id" and child["session_id"] != root
        assert child["parent_session_id"] == root
        assert child["parent_source"] == "header:x-claude-code-session-id"
        # The parent came back to its KV: almost all of its resumed prompt was cached.
        back = records[2]["request"]
        assert back["cached_tokens"] >= 0.9 * back["input_tokens"], back

        # `agentserve trace` shows the subagent under its parent.
        summaries = summarize(load([stack.trace_path]))
        tree = [(s.session_id, s.depth, s.parent_session_id) for s in summaries]
        assert tree == [(root, 0, None), (child["session_id"], 1, root)], json.dumps(tree)
