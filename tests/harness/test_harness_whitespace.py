"""Claude Code and Codex against a model that writes its own whitespace (issue 18, item 4): one newline
after `</think>` where the qwen3 template writes two, a space before each call. With exact replay the
loop's later turns extend the previous prompt + output (no drift); without it every one drifts.
pi's run is in test_harness_pi.py; OpenClaw reorders its own history (docs/harnesses.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from harness_stack import MODEL, SCENARIOS, Stack, check_loop_traces, running_stack
from harness_tools import MISS, PROMPT, Run, explain, require
from test_harness_claude_code import claude
from test_harness_codex import codex

pytestmark = pytest.mark.slow

HARNESSES: dict[str, tuple[str, str, str, str, Callable[[Path, Stack, Path, str], Run]]] = {
    # name: (binary, scenario, API, shell tool, runner)
    "claude-code": ("claude", "claude-code.yaml", "anthropic", "Bash", claude),
    "codex": ("codex", "codex.yaml", "responses", "exec_command", codex),
}


def deviant(scenario: str, directory: Path) -> Path:
    text = (SCENARIOS / scenario).read_text()
    out = text.replace("</think>\n\n", "</think>\n").replace("\n<tool_call>", "\n <tool_call>")
    assert out != text
    path = directory / scenario
    path.write_text(out)
    return path


@pytest.mark.parametrize("exact_replay", [True, False], ids=["exact-replay", "template-only"])
@pytest.mark.parametrize("harness", sorted(HARNESSES))
def test_a_model_that_writes_its_own_whitespace_keeps_the_prefix(
    harness: str, exact_replay: bool, tmp_path: Path
) -> None:
    binary_name, scenario, api, tool, runner = HARNESSES[harness]
    binary = require(binary_name)
    args = ["--script", str(deviant(scenario, tmp_path)), "--sim-speedup", "0", "--model", MODEL]
    if not exact_replay:
        args.append("--no-exact-replay")
    (tmp_path / "stack").mkdir()
    with running_stack(tmp_path / "stack", args) as stack:
        result = runner(binary, stack, tmp_path / "run", PROMPT)
        with explain(result, log=stack.log()):
            assert result.returncode == 0
            assert MISS not in result.stdout
        turns = check_loop_traces(stack.traces(3), api, tool)
    drifted = [t["drift"]["drifted"] for t in turns[1:]]
    assert drifted == ([False, False] if exact_replay else [True, True]), [t["drift"] for t in turns]
