"""`agentserve render` and `agentserve drift` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from prompt_cases import assert_divergence_in_date

BILLING = "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=sdk-cli;"


def request(date: str = "2026-01-01", billing: str = BILLING) -> dict[str, Any]:
    return {
        "system": [billing, "You are Claude Code."],
        "tools": [{"name": "Bash", "description": "Run", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": f"Today's date is {date}. Run the tests."},
            {
                "role": "assistant",
                "content": [
                    {"type": "reasoning", "text": "Use Bash."},
                    {
                        "type": "tool_call",
                        "id": "toolu_1",
                        "name": "Bash",
                        "arguments": {"command": "pytest"},
                    },
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "call_id": "toolu_1", "content": "ok"}]},
        ],
    }


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentserve", *args], input=stdin, capture_output=True, text=True, check=False
    )


def test_render_prints_the_prompt_without_the_billing_line() -> None:
    result = run("render", "--family", "qwen3", stdin=json.dumps(request()))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("<|im_start|>system\nYou are Claude Code.")
    assert "<think>\nUse Bash.\n</think>" in result.stdout
    assert result.stdout.endswith("<|im_start|>assistant\n")


def test_render_tokens_reports_counts_hashes_and_what_was_stripped() -> None:
    result = run("render", "--family", "qwen3", "--tokens", "--block-size", "16", stdin=json.dumps(request()))
    report = json.loads(result.stdout)
    assert report["tokens"] > 16 and report["block_size"] == 16
    assert len(report["block_hashes"]) == report["tokens"] // 16
    assert all(len(h) == 16 for h in report["block_hashes"])
    assert report["stripped"] == {"anthropic_billing": 1}
    assert report["replay"] == "native" and report["starts_in_reasoning"] is False


def test_render_options_change_the_prompt() -> None:
    body = json.dumps(request())
    kept = run("render", "--family", "qwen3", "--no-strip", stdin=body).stdout
    assert kept.startswith("<|im_start|>system\nx-anthropic-billing-header:")
    dropped = run("render", "--family", "qwen3", "--replay", "drop", stdin=body).stdout
    assert "Use Bash." not in dropped


def test_render_errors_are_clear_and_exit_2() -> None:
    assert "not JSON" in run("render", "--family", "qwen3", stdin="{").stderr
    result = run("render", "--family", "qwen3", "--api", "anthropic", stdin="{}")
    assert result.returncode == 2 and "invalid anthropic request" in result.stderr
    result = run("render", "--family", "qwen3", stdin='{"messages": [{"role": "x"}]}')
    assert result.returncode == 2 and "role" in result.stderr


def test_drift_reports_where_the_second_request_stops_extending_the_first(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(request("2026-01-01")), encoding="utf-8")
    second.write_text(json.dumps(request("2026-01-01", BILLING.replace("d49", "a3f"))), encoding="utf-8")
    same = run("drift", str(first), str(second), "--family", "qwen3")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["drifted"] is False

    second.write_text(json.dumps(request("2026-01-02")), encoding="utf-8")
    moved = run("drift", str(first), str(second), "--family", "qwen3")
    report = json.loads(moved.stdout)
    assert moved.returncode == 1
    assert report["drifted"] is True
    assert_divergence_in_date(report["before"], report["previous_after"], report["prompt_after"])


def claude_code_body(billing: str) -> dict[str, Any]:
    """A Claude-Code-shaped Anthropic body: billing block first in `system`, tools, a tool loop."""
    return {
        "model": "m",
        "max_tokens": 1024,
        "system": [
            {"type": "text", "text": billing},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [{"name": "Bash", "description": "Run", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Run the tests."}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "pytest"}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "ok"}],
            },
        ],
    }


def test_render_api_anthropic_decodes_real_bodies_and_strips_the_billing_block() -> None:
    reports = []
    for version in ("2.1.197.d49", "2.1.197.7f3"):
        body = claude_code_body(f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=cli;")
        result = run("render", "--family", "qwen3", "--api", "anthropic", "--tokens", stdin=json.dumps(body))
        assert result.returncode == 0, result.stderr
        reports.append(json.loads(result.stdout))
    assert reports[0]["block_hashes"] == reports[1]["block_hashes"]
    assert reports[0]["tokens"] == reports[1]["tokens"]
    assert sum(reports[0]["stripped"].values()) == 1


def test_render_api_errors_use_the_codec_message() -> None:
    result = run("render", "--family", "qwen3", "--api", "chat", stdin=json.dumps({"messages": "nope"}))
    assert result.returncode == 2
    assert "invalid chat request" in result.stderr


def test_render_follows_the_requests_effort_as_the_server_does() -> None:
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high"}
    )
    on = run("render", "--family", "deepseek-v3.1", "--api", "chat", stdin=body)
    assert on.returncode == 0 and on.stdout.rstrip("\n").endswith("<｜Assistant｜><think>")
    off = run("render", "--family", "deepseek-v3.1", "--api", "chat", "--no-enable-thinking", stdin=body)
    assert off.stdout.rstrip("\n").endswith("<｜Assistant｜></think>")  # the flag wins
    plain = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    default = run(
        "render", "--family", "deepseek-v3.1", "--api", "chat", "--reasoning-default", "on", stdin=plain
    )
    assert default.stdout.rstrip("\n").endswith("<｜Assistant｜><think>")
