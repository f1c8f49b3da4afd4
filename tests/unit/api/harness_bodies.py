"""Request bodies shaped like what the harnesses really send (see reference/harness-traffic.md).

Texts are shortened; structure, field order, roles, markers and id shapes follow the captures.
"""

from __future__ import annotations

import json
from typing import Any

BILLING = "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=sdk-cli;"
CLAUDE_SESSION = "3f2b8c1e-6a4d-4f0e-9b7a-2d1c5e8f9a01"
CLAUDE_USER_ID = json.dumps(
    {"device_id": "ab" * 32, "account_uuid": "", "session_id": CLAUDE_SESSION}, separators=(",", ":")
)

BASH_TOOL = {
    "name": "Bash",
    "description": "Executes a given bash command and returns its output.",
    "input_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to execute"},
            "timeout": {"type": "number"},
            "description": {"type": "string"},
            "run_in_background": {"type": "boolean"},
            "dangerouslyDisableSandbox": {"type": "boolean"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
}


def claude_code_turn1() -> dict[str, Any]:
    return {
        "model": "capture-model",
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "<system-reminder>\nToday's date is 2026-11-21.\n</system-reminder>\n",
                    },
                    {
                        "type": "text",
                        "text": "run echo hello using your shell tool, then say done",
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            },
            {"role": "system", "content": "Available agent types for the Agent tool: general-purpose ..."},
        ],
        "system": [
            {"type": "text", "text": BILLING},
            {
                "type": "text",
                "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": "You are an interactive agent ... Working directory: /srv/harness/proj",
                "cache_control": {"type": "ephemeral", "scope": "global"},
            },
        ],
        "tools": [
            BASH_TOOL,
            {"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}},
        ],
        "metadata": {"user_id": CLAUDE_USER_ID},
        "max_tokens": 32000,
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "stream": True,
    }


def claude_code_turn2(assistant_content: list[dict[str, Any]], tool_use_id: str) -> dict[str, Any]:
    body = claude_code_turn1()
    del body["messages"][0]["content"][1]["cache_control"]
    body["messages"] += [
        {"role": "assistant", "content": assistant_content},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_use_id,
                    "content": "hello",
                    "is_error": False,
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    return body


CLAUDE_CODE_HEADERS = {
    "User-Agent": "claude-cli/2.1.197 (external, sdk-cli)",
    "X-Claude-Code-Session-Id": CLAUDE_SESSION,
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    "x-api-key": "secret",
    "x-app": "cli",
}

CODEX_THREAD = "019a2b3c-4d5e-7f60-8a9b-0c1d2e3f4a5b"

CODEX_HEADERS = {
    "session-id": CODEX_THREAD,
    "thread-id": CODEX_THREAD,
    "x-client-request-id": CODEX_THREAD,
    "originator": "codex_exec",
    "authorization": "Bearer secret",
}

EXEC_COMMAND = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command in a PTY",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}},
        "required": ["cmd"],
        "additionalProperties": False,
    },
}


def codex_turn1() -> dict[str, Any]:
    """Shape A (unknown slug): developer messages, no instructions, namespace and web_search tools."""
    return {
        "model": "capture-model",
        "stream": True,
        "input": [
            {
                "type": "message",
                "id": "msg_5f0c8f8e-9c1e-5d6a-8b7c-1a2b3c4d5e6f",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are Codex, a coding agent ..."}],
            },
            {
                "type": "message",
                "id": "msg_019a2b3c-0001",
                "role": "developer",
                "content": [
                    {"type": "input_text", "text": "<skills_instructions>...</skills_instructions>"},
                    {
                        "type": "input_text",
                        "text": "<permissions instructions>...</permissions instructions>",
                    },
                ],
            },
            {
                "type": "message",
                "id": "msg_019a2b3c-0002",
                "role": "user",
                "content": [
                    {
                        "type": "input_text",
                        "text": "<environment_context>\n  <cwd>/srv/harness/proj</cwd>\n"
                        "</environment_context>",
                    }
                ],
            },
            {
                "type": "message",
                "id": "msg_019a2b3c-0003",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "run echo hello using your shell tool, then say done"}
                ],
            },
        ],
        "tools": [
            EXEC_COMMAND,
            {
                "type": "function",
                "name": "write_stdin",
                "description": "Write to a session",
                "strict": False,
                "parameters": {"type": "object", "properties": {"session_id": {"type": "number"}}},
            },
            {
                "type": "namespace",
                "name": "multi_agent_v1",
                "tools": [
                    {
                        "type": "function",
                        "name": "spawn_agent",
                        "description": "Spawn a sub-agent",
                        "strict": False,
                        "parameters": {"type": "object", "properties": {"message": {"type": "string"}}},
                    }
                ],
            },
            {"type": "web_search", "external_web_access": True},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": CODEX_THREAD,
        "client_metadata": {"thread_id": CODEX_THREAD, "session_id": CODEX_THREAD},
    }


PI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
                "required": ["command"],
            },
            "strict": False,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
            "strict": False,
        },
    },
]


def pi_turn1() -> dict[str, Any]:
    return {
        "model": "capture-model",
        "messages": [
            {"role": "developer", "content": "You are pi, a coding agent.\nCurrent date: 2026-11-21"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "run echo hello using your shell tool, then say done"}],
            },
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "store": False,
        "max_completion_tokens": 32000,
        "tools": PI_TOOLS,
        "reasoning_effort": "medium",
    }


def openclaw_turn1() -> dict[str, Any]:
    return {
        "model": "capture-model",
        "messages": [
            {
                "role": "system",
                "content": "<!-- openclaw:attempt:STABLE -->You are OpenClaw."
                "<!-- openclaw:attempt:DYNAMIC -->Date: 2026-11-21<!-- /openclaw:attempt:DYNAMIC -->",
            },
            {
                "role": "user",
                "content": "[Sat 2026-11-21 17:42 UTC] run echo hello using your shell tool, "
                "then say done\n\n"
                "Runtime: agent=main | session=agent:main:explicit:1234 | shell=bash",
            },
            {
                "role": "user",
                "content": [{"type": "text", "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\n(none)\n"}],
            },
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "exec",
                    "description": "Run a shell command",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
                },
            }
        ],
        "tool_choice": "auto",
        "max_completion_tokens": 32000,
    }
