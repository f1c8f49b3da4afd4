"""The call memory is scoped by conversation, not only by API key (issue 18, item 3).

Kimi K2 numbers its calls `functions.NAME:IDX`, so two conversations of one client that both open
with `ls` make the *same* call id with the same arguments. A Chat client that drops reasoning (pi,
OpenClaw) then echoes identical visible turns; with the memory scoped by API key alone, the turn
restored for either conversation was whichever made that call last, and its reasoning went into the
other conversation's prompt. The scope is now the API key and the conversation's identity (the
session header when there is one, else the derived conversation key), so each gets its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from agentserve.api import decode_chat
from agentserve.config import UpConfig
from agentserve.frontend.app import frontend_of
from agentserve.frontend.http import ApiKeys
from agentserve.frontend.surfaces import SURFACES
from agentserve.frontend.up import build_up
from agentserve.worker.engine import GenerateRequest

SYSTEM = "You are pi, a coding agent."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.Bash:0<|tool_call_argument_begin|>"
    '{"command": "ls"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
)
RULES = [
    {"match": "^first task", "output": "<think>Reasoning of conversation A.</think>" + CALL},
    {"match": "^second task", "output": "<think>Reasoning of conversation B.</think>" + CALL},
    {"match": "^same task", "output": "<think>Reasoning number one.</think>" + CALL},
]
DEFAULT = "<think>Listed.</think>Done.<|im_end|>"


def _app(tmp_path: Path) -> Any:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"rules": RULES, "default": DEFAULT}))
    config = UpConfig.model_validate(
        {"port": 0, "sim_speedup": 0, "family": "kimi-k2", "model": "kimi-sim", "script": str(scenario)}
    )
    app, _ = build_up(config, keys=ApiKeys())
    return app


def _capture(app: Any) -> list[str]:
    """The prompt text of every request the frontend sends to the engine."""
    frontend = frontend_of(app)
    prompts: list[str] = []
    generate = frontend.backend.generate

    async def spy(request: GenerateRequest, route: Any) -> Any:
        prompts.append(frontend.pipeline.tokenizer.decode(list(request.prompt_token_ids)))
        return await generate(request, route)

    frontend.backend.generate = spy  # type: ignore[method-assign]
    return prompts


async def _turn(client: httpx.AsyncClient, history: list[dict[str, Any]], headers: dict[str, str]) -> None:
    """One request; the answer goes into `history` as pi sends it back: no reasoning."""
    r = await client.post(
        "/v1/chat/completions",
        json={"model": "kimi-sim", "messages": history, "tools": TOOLS},
        headers=headers,
    )
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    echo: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        echo["tool_calls"] = message["tool_calls"]
    history.append(echo)


async def _two_conversations(
    tmp_path: Path, first: tuple[str, dict[str, str]], second: tuple[str, dict[str, str]]
) -> list[str]:
    """Both conversations' turn 1 (A first, then B), then turn 2 of A and of B: the prompts."""
    app = _app(tmp_path)
    prompts = _capture(app)
    histories = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        for prompt, _ in (first, second)
    ]
    headers = [first[1], second[1]]
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        for h, hd in zip(histories, headers, strict=True):
            await _turn(c, h, hd)
        for h in histories:
            call = h[-1]["tool_calls"][0]
            assert call["id"] == "functions.Bash:0"  # the same id in both conversations
            h.append({"role": "tool", "tool_call_id": call["id"], "content": "a.py"})
        for h, hd in zip(histories, headers, strict=True):
            await _turn(c, h, hd)
    return prompts


@pytest.mark.anyio
async def test_two_conversations_with_the_same_kimi_call_keep_their_own_reasoning(tmp_path: Path) -> None:
    # No session header (pi): the derived conversation keys differ by the first user message.
    prompts = await _two_conversations(tmp_path, ("first task: list", {}), ("second task: list", {}))
    second_a, second_b = prompts[2], prompts[3]
    assert "Reasoning of conversation A." in second_a and "Reasoning of conversation B." not in second_a
    assert "Reasoning of conversation B." in second_b and "Reasoning of conversation A." not in second_b


@pytest.mark.anyio
async def test_a_session_header_separates_conversations_that_look_identical(tmp_path: Path) -> None:
    # Identical visible history; only the header tells the conversations apart. The scenario writes
    # the same reasoning for both turns 1, so look at what the memory restores per session instead.
    app = _app(tmp_path)
    frontend = frontend_of(app)
    transport = httpx.ASGITransport(app=app)
    history: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "same task: list"},
    ]
    sessions = [{"x-session-id": "session-a"}, {"x-session-id": "session-b"}]
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        await _turn(c, history, sessions[0])
        history.append({"role": "tool", "tool_call_id": "functions.Bash:0", "content": "a.py"})
        # Session b never made the call: its echo of the same turn has nothing to restore from.
        body = {"model": "kimi-sim", "messages": history, "tools": TOOLS}
        decoded = decode_chat(body)
        for headers, expected in ((sessions[0], 1), (sessions[1], 0)):
            identity = frontend.identify(decoded, decoded.agent_identity(headers))
            restored = await frontend.restore(SURFACES["chat"], body, decoded, identity, scope="")
            assert restored.restored == expected, headers


@pytest.mark.anyio
async def test_turn_1_is_restored_on_turn_2_with_and_without_a_session_header(tmp_path: Path) -> None:
    # Header-less, turn 1 is remembered under the key turn 2 will show (`key_after`); with a header,
    # under the header's session: either way the dropped reasoning comes back on turn 2.
    prompts = await _two_conversations(
        tmp_path, ("first task: a", {}), ("first task: a", {"x-session-id": "s1"})
    )
    assert all("Reasoning of conversation A." in p for p in prompts[2:])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- the conversation's identity from turn 1 on (issue 18, item 3: traces, retention) ---------------


@pytest.mark.anyio
async def test_a_header_less_conversation_has_one_key_from_turn_1(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"rules": RULES, "default": DEFAULT}))
    sink = tmp_path / "trace.jsonl"
    config = UpConfig.model_validate(
        {
            "port": 0,
            "sim_speedup": 0,
            "family": "kimi-k2",
            "model": "kimi-sim",
            "script": str(scenario),
            "trace_sink": str(sink),
        }
    )
    app, _ = build_up(config, keys=ApiKeys())
    frontend = frontend_of(app)
    retention: list[Any] = []
    generate = frontend.backend.generate

    async def spy(request: GenerateRequest, route: Any) -> Any:
        retention.append(request.retention)
        return await generate(request, route)

    frontend.backend.generate = spy  # type: ignore[method-assign]
    history: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "first task: list"},
    ]
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        await _turn(c, history, {})
        history.append({"role": "tool", "tool_call_id": "functions.Bash:0", "content": "a.py"})
        await _turn(c, history, {})
    records = [json.loads(line) for line in sink.read_text().splitlines()]
    sessions = [r["agent_context"]["session_id"] for r in records if r["event_type"] == "request_end"]
    assert len(sessions) == 2 and sessions[0] == sessions[1] and sessions[0].startswith("conv-")
    # Turn 2 is the same conversation to the retention tracker: nothing of turn 1 counted as a
    # prefix shared with "another conversation" (which would be kept at the prefix class, unexpiring).
    second = retention[1]
    assert second is not None
    assert all(r.priority != frontend.config.kv_retention_prefix_priority for r in second.ranges), second
