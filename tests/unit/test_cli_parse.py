from __future__ import annotations

import json
import subprocess
import sys

RAW = '<think>plan</think>\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'


def run_cli(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentserve", *args], input=stdin, capture_output=True, text=True, check=False
    )


def test_parse_prints_one_json_event_per_line_in_the_documented_schema() -> None:
    result = run_cli("parse", "--family", "qwen3", "--chunk-size", "3", stdin=RAW)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events == [
        {"type": "reasoning_delta", "text": "plan"},
        {"type": "reasoning_end"},
        {"type": "tool_call_start", "index": 0, "id": "call_0", "name": "ls"},
        {"type": "tool_call_args_delta", "index": 0, "fragment": '{"path": "."}'},
        {"type": "tool_call_end", "index": 0, "arguments": {"path": "."}},
    ]


def test_parse_no_merge_shows_individual_deltas() -> None:
    result = run_cli("parse", "--family", "qwen3", "--chunk-size", "1", "--no-merge", stdin=RAW)
    deltas = [json.loads(x) for x in result.stdout.splitlines() if "args_delta" in x]
    assert len(deltas) > 1
    assert "".join(d["fragment"] for d in deltas) == '{"path": "."}'


def test_parse_unknown_family_is_a_clear_error() -> None:
    result = run_cli("parse", "--family", "nope", stdin="x")
    assert result.returncode == 2
    assert "unknown model family 'nope'" in result.stderr
