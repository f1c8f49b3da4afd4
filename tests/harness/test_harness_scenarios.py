"""The scenario files themselves (no harness needed): each parses, in the family `agentserve up`
serves by default, into the loop the harness tests expect, and the harnesses are the pinned ones."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from harness_stack import MODEL, REPO, SCENARIOS
from harness_tools import BINARIES, FINAL_TEXT, base_env, require

from agentserve.conversation import (
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from agentserve.families import family_for_model
from agentserve.parsing.events import merge_deltas
from agentserve.worker.outputs import EchoPolicy, ScriptPolicy

# harness → (scenario, its shell tool, that tool's command argument)
SHELL_TOOLS = {
    "claude": ("claude-code.yaml", "Bash", "command"),
    "codex": ("codex.yaml", "exec_command", "cmd"),
    "pi": ("pi.yaml", "bash", "command"),
    "openclaw": ("openclaw.yaml", "exec", "command"),
}


def parse(raw: str) -> list[tuple[str, str]]:
    """(kind, value) per event: reasoning segment, text, or `name args` of a dispatched call."""
    family = family_for_model(MODEL)
    assert family is not None and family.name == "qwen3"
    parser = family.parser()
    events = merge_deltas([*parser.feed(raw), *parser.close()])
    names: dict[int, str] = {}
    out: list[tuple[str, str]] = []
    for e in events:
        if isinstance(e, ReasoningDelta):
            out.append(("reasoning", e.text))
        elif isinstance(e, TextDelta):
            out.append(("text", e.text))
        elif isinstance(e, ToolCallStart):
            names[e.index] = e.name
        elif isinstance(e, ToolCallEnd):
            out.append(("call", f"{names[e.index]} {e.arguments}"))
        elif not isinstance(e, ReasoningEnd | ToolCallArgsDelta):
            out.append((type(e).__name__, repr(e)))
    return out


@pytest.mark.parametrize("harness", sorted(SHELL_TOOLS))
def test_a_scenario_is_the_three_turn_loop_in_the_default_family(harness: str) -> None:
    scenario, tool, arg = SHELL_TOOLS[harness]
    data = yaml.safe_load((SCENARIOS / scenario).read_text())
    ScriptPolicy.from_mapping(data, EchoPolicy())  # what the sim loads: raises on a bad scenario
    final, second, first = (rule["output"] for rule in data["rules"])

    def command(event: tuple[str, str]) -> str:
        """The shell command of a call to the harness's own shell tool."""
        kind, value = event
        name, _, arguments = value.partition(" ")
        assert kind == "call" and name == tool
        text: str = json.loads(arguments)[arg]
        return text

    assert [k for k, _ in parse(first)] == ["reasoning", "text", "call"]
    assert command(parse(first)[2]) == "printf 'agentserve-%s\\n' $((6*7)) > proof.txt && cat proof.txt"
    # interleaved: reasoning_0 → call_0 → reasoning_1 → call_1
    assert [k for k, _ in parse(second)] == ["reasoning", "call", "reasoning", "call"]
    assert command(parse(second)[1]) == "tr a-z A-Z < proof.txt > upper.txt && cat upper.txt"
    assert command(parse(second)[3]) == "printf 'size=%s\\n' $(wc -c < proof.txt)"
    assert parse(final) == [
        ("reasoning", "Both commands ran: upper.txt holds the upper-cased proof."),
        ("text", FINAL_TEXT),
    ]


def test_regex_rules_fire_only_on_their_own_tool_output() -> None:
    """The outputs the shell produces pick the next turn; none matches an earlier turn's output."""
    data = yaml.safe_load((SCENARIOS / "claude-code.yaml").read_text())
    final, second = (re.compile(rule["match"]) for rule in data["rules"][:2])
    assert second.search("agentserve-42") and not final.search("agentserve-42")
    assert final.search("AGENTSERVE-42") and final.search("size=14")


def pinned_versions() -> dict[str, str]:
    deps: dict[str, str] = {}
    for spec in (REPO / "scripts" / "harnesses").glob("**/package.json"):
        deps.update(json.loads(spec.read_text())["dependencies"])
    return {
        "claude": deps["@anthropic-ai/claude-code"],
        "codex": deps["@openai/codex"],
        "pi": deps["@mariozechner/pi-coding-agent"],
        "openclaw": deps["openclaw"],
    }


@pytest.mark.parametrize("harness", sorted(BINARIES))
def test_the_installed_harness_is_the_pinned_version(harness: str, tmp_path: Path) -> None:
    binary = require(harness)
    out = subprocess.run(
        [str(binary), "--version"],
        env=base_env(tmp_path / "home"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert pinned_versions()[harness] in out.stdout + out.stderr, out.stdout + out.stderr  # pi: stderr
