"""Frontend replicas behind one Service: a key file they share makes each one accept the others' tokens.

Three `agentserve up` apps on loopback, as three frontend pods would be: A and B read the same key file
(the operator's Secret, in the hex it writes), C another one. A conversation started on A continues on
B (a load balancer moved it) with its thinking recognised and its omitted / sealed reasoning restored
exactly; on C that reasoning is lost from the prompt, which is the bug a shared key fixes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from sim_scenarios import ANTHROPIC_TOOLS, QWEN3_DEFAULT, QWEN3_RULES, RESPONSES_TOOLS, write_scenario
from stack import Served, served

from agentserve.keyfile import encode_key, fingerprint

ROOT = Path(__file__).resolve().parents[3]
SHARED_KEY = bytes(range(100, 132))
OTHER_KEY = bytes(range(1, 33))


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Served, Served]]:
    directory = tmp_path_factory.mktemp("signing")
    scenario = write_scenario(directory, QWEN3_RULES, QWEN3_DEFAULT)
    shared, other = directory / "signing-key", directory / "other-key"
    shared.write_text(encode_key(SHARED_KEY))
    other.write_text(encode_key(OTHER_KEY))
    with (
        served({"script": scenario, "signing_key_file": str(shared)}) as a,
        served({"script": scenario, "signing_key_file": str(shared)}) as b,
        served({"script": scenario, "signing_key_file": str(other)}) as c,
    ):
        yield a, b, c


def claude(s: Served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.url, api_key="test-key", max_retries=0)


def codex(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key="test-key", max_retries=0)


REQUEST: dict[str, Any] = {
    "model": "claude-harness-name",
    "max_tokens": 4000,
    "tools": ANTHROPIC_TOOLS,
    "thinking": {"type": "adaptive"},
}
OMITTED = {**REQUEST, "thinking": {"type": "adaptive", "display": "omitted"}}


def counted(s: Served, messages: list[dict[str, Any]], request: dict[str, Any]) -> int:
    body = {k: v for k, v in request.items() if k != "max_tokens"}
    return claude(s).messages.count_tokens(messages=messages, **body).input_tokens


def prompt_tokens(usage: Any) -> int:
    return int(usage.input_tokens + usage.cache_read_input_tokens + (usage.cache_creation_input_tokens or 0))


def tool_loop(first: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history a harness sends next: the turn as received, then the tool's result."""
    call = first.content[-1]
    assert call.type == "tool_use"
    return [
        *messages,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "hello"}]},
    ]


def test_replicas_sharing_a_key_file_show_the_same_fingerprint(
    replicas: tuple[Served, Served, Served],
) -> None:
    a, b, c = (httpx.get(s.url + "/ready").json()["signing_key"] for s in replicas)
    assert a == b == fingerprint(SHARED_KEY)
    assert c == fingerprint(OTHER_KEY) != a


def test_a_thinking_block_signed_by_one_replica_is_recognised_by_another(
    replicas: tuple[Served, Served, Served],
) -> None:
    a, b, c = replicas
    messages: list[dict[str, Any]] = [{"role": "user", "content": "please run echo hello"}]
    with claude(a).messages.stream(messages=messages, **REQUEST) as stream:
        first = stream.get_final_message()
    thinking = first.content[0]
    assert thinking.type == "thinking" and thinking.thinking == "I should run the command."
    assert b.frontend.ctx.signer.verify_thinking(thinking.thinking, thinking.signature)
    assert not c.frontend.ctx.signer.verify_thinking(thinking.thinking, thinking.signature)
    # The next turn lands on B: it continues the tool loop.
    second = claude(b).messages.create(messages=tool_loop(first, messages), **REQUEST)
    assert [block.type for block in second.content] == ["thinking", "text"]
    assert second.content[1].text == "done." and second.stop_reason == "end_turn"


def test_omitted_thinking_sealed_by_one_replica_is_restored_by_another(
    replicas: tuple[Served, Served, Served],
) -> None:
    a, b, _ = replicas
    messages: list[dict[str, Any]] = [{"role": "user", "content": "please run echo hello, omitted"}]
    first = claude(a).messages.create(messages=messages, **OMITTED)
    sealed = first.content[0]
    assert sealed.type == "thinking" and sealed.thinking == "" and sealed.signature
    history = tool_loop(first, messages)
    on_a, on_b, on_c = (counted(s, history, OMITTED) for s in replicas)
    # B renders the prompt A would (the reasoning put back, token for token, so the KV prefix holds);
    # C cannot open the seal and the reasoning drops out of the prompt.
    assert on_b == on_a
    assert on_c < on_a
    second = claude(b).messages.create(messages=history, **OMITTED)
    assert prompt_tokens(second.usage) == on_a and second.stop_reason == "end_turn"


def test_encrypted_reasoning_sealed_by_one_replica_is_restored_by_another(
    replicas: tuple[Served, Served, Served],
) -> None:
    a, _, _ = replicas
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are Codex."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run echo hello"}]},
    ]
    kw: dict[str, Any] = {
        "model": "codex-model",
        "tools": RESPONSES_TOOLS,
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    first = codex(a).responses.create(input=items, **kw)
    assert [item.type for item in first.output] == ["reasoning", "message", "function_call"]
    reasoning, _, call = (item.model_dump(exclude_none=True) for item in first.output)
    assert reasoning["encrypted_content"].startswith("asr1.")
    # A stateless client keeps only the sealed copy of the reasoning (no readable content).
    reasoning.pop("content", None)
    history = [
        *items,
        reasoning,
        *(item.model_dump(exclude_none=True) for item in first.output[1:]),
        {"type": "function_call_output", "call_id": call["call_id"], "output": "hello"},
    ]
    on_a, on_b, on_c = (codex(s).responses.create(input=history, **kw).usage.input_tokens for s in replicas)
    assert on_b == on_a
    assert on_c < on_a


def test_a_frontend_refuses_to_start_with_a_short_key(tmp_path: Path) -> None:
    key = tmp_path / "signing-key"
    key.write_text("0011223344556677\n")  # 8 bytes once decoded
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentserve",
            "frontend",
            "--model",
            "qwen3-sim",
            "--router-url",
            "http://127.0.0.1:9",
            "--signing-key-file",
            str(key),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "agentserve frontend:" in result.stderr and "signing key too short: 8 bytes" in result.stderr
