"""Sim scenarios (raw model output in a family's format) for the frontend's integration tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

BASH = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
READ = {
    "name": "Read",
    "description": "Read a file.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}
ANTHROPIC_TOOLS = [BASH, READ]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
    }
    for t in ANTHROPIC_TOOLS
]
RESPONSES_TOOLS = [
    {"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
    for t in ANTHROPIC_TOOLS
]


def qwen_call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def think(text: str) -> str:
    return f"<think>\n{text}\n</think>\n\n"


END = "<|im_end|>"
TRAILING_WORDS = 200  # text the model writes after its call in the DISPATCH scenario

# What the qwen3 sim says, by the last message's content (first rule that applies wins).
QWEN3_RULES: list[dict[str, Any]] = [
    {
        "match": "DISPATCH",
        "output": think("Call first, then explain.")
        + qwen_call("Bash", {"command": "ls"})
        + "\n"
        + " ".join(["word"] * TRAILING_WORDS)
        + END,
    },
    {
        "match": "INTERLEAVE",
        "output": think("First read the file.")
        + qwen_call("Read", {"path": "a.py"})
        + "\n"
        + think("Then run the tests.")
        + qwen_call("Bash", {"command": "pytest"})
        + END,
    },
    {"match": "STOPME", "output": think("Fine.") + "alpha beta STOP gamma delta" + END},
    {"match": "^hello", "output": think("It printed hello.") + "done." + END},
    {
        "turn": 1,
        "output": think("I should run the command.")
        + "Let me run it.\n"
        + qwen_call("Bash", {"command": "echo hello"})
        + END,
    },
]
QWEN3_DEFAULT = think("Nothing left to do.") + "All done." + END


BLOCK = 32  # tokens per KV block (the default)


def full_blocks(tokens: int) -> int:
    return tokens // BLOCK * BLOCK


def reusable(turn_tokens: int) -> int:
    """Cache hits a next turn must get when it extends a turn of `turn_tokens` (prompt + output):
    its full blocks, less the last token (an engine never computes the KV of its last sample)."""
    return (turn_tokens - 1) // BLOCK * BLOCK


def write_scenario(
    directory: Path, rules: list[dict[str, Any]], default: str | None, name: str = "scenario"
) -> str:
    path = directory / f"{name}.yaml"
    data: dict[str, Any] = {"rules": rules}
    if default is not None:
        data["default"] = default
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return str(path)
