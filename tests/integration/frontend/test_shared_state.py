"""Frontend replicas sharing one state store (a real redis-server on loopback).

Three `agentserve up` apps as three frontend pods behind a round-robin Service: A and B share a
Redis store, C keeps its state in-process. A Responses chain stored on A continues on B (and is
retrievable / deletable there); a Chat client's echoed turn made on A is restored exactly on B;
another API key never sees either. With Redis down, requests are still served (without restore),
and only `previous_response_id` answers the API's 503.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from sim_scenarios import CHAT_TOOLS, QWEN3_DEFAULT, QWEN3_RULES, RESPONSES_TOOLS, write_scenario
from stack import Served, served

from agentserve.frontend.http import ApiKeys
from redisproc import RedisProcess, redis_server

KEYS = ApiKeys(["key-a", "key-b"])


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisProcess]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, redis: RedisProcess
) -> Iterator[tuple[Served, Served, Served]]:
    scenario = write_scenario(tmp_path_factory.mktemp("state"), QWEN3_RULES, QWEN3_DEFAULT)
    shared = {"script": scenario, "state_url": redis.url, "signing_key_file": None}
    with (
        served(shared, keys=KEYS) as a,
        served(shared, keys=KEYS) as b,
        served({"script": scenario}, keys=KEYS) as c,
    ):
        yield a, b, c


def client(s: Served, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0)


CODEX_INPUT: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "please run echo hello"}]},
]


def test_previous_response_id_on_another_replica(replicas: tuple[Served, Served, Served]) -> None:
    a, b, c = replicas
    first = client(a).responses.create(model="m", input=CODEX_INPUT, tools=RESPONSES_TOOLS, store=True)
    call = first.output[-1]
    assert call.type == "function_call"
    follow = [{"type": "function_call_output", "call_id": call.call_id, "output": "hello"}]
    second = client(b).responses.create(
        model="m", input=follow, previous_response_id=first.id, tools=RESPONSES_TOOLS, store=True
    )
    assert second.output_text == "done."
    # The same continuation on A (which made the turn) renders the same prompt: nothing was lost.
    again = client(a).responses.create(
        model="m", input=follow, previous_response_id=first.id, tools=RESPONSES_TOOLS
    )
    assert second.usage is not None and again.usage is not None
    assert second.usage.input_tokens == again.usage.input_tokens
    # The chain goes on from B's response through A.
    third = client(a).responses.create(
        model="m", input="thanks", previous_response_id=second.id, tools=RESPONSES_TOOLS
    )
    assert third.usage is not None and third.usage.input_tokens > second.usage.input_tokens
    # C keeps its state to itself: the bug shared state fixes.
    with pytest.raises(openai.BadRequestError) as info:
        client(c).responses.create(model="m", input=follow, previous_response_id=first.id)
    assert info.value.code == "previous_response_not_found"
    # Another API key never reads it, on any replica.
    with pytest.raises(openai.BadRequestError):
        client(b, "key-b").responses.create(model="m", input=follow, previous_response_id=first.id)


def test_get_and_delete_a_stored_response(replicas: tuple[Served, Served, Served]) -> None:
    a, b, _ = replicas
    made = client(a).responses.create(model="m", input="hello there", store=True)
    got = client(b).responses.retrieve(made.id)
    assert got.id == made.id and got.output_text == made.output_text == "done."
    with pytest.raises(openai.NotFoundError):
        client(b, "key-b").responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client(b, "key-b").responses.delete(made.id)
    client(b).responses.delete(made.id)
    for s in (a, b):
        with pytest.raises(openai.NotFoundError):
            client(s).responses.retrieve(made.id)
    with pytest.raises(openai.BadRequestError):
        client(a).responses.create(model="m", input="more", previous_response_id=made.id)
    # store: false is not kept anywhere
    unstored = client(a).responses.create(model="m", input="hello there", store=False)
    with pytest.raises(openai.NotFoundError):
        client(a).responses.retrieve(unstored.id)


def _chat_echo(s: Served, text: str) -> tuple[list[dict[str, Any]], int]:
    """An OpenClaw-shaped turn: ask, then echo the call back with reasoning dropped and the
    arguments re-serialised compactly. Returns the follow-up's messages and its prompt tokens."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    first = client(s).chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)  # type: ignore[arg-type]
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    echo = {
        "role": "assistant",
        "content": first.choices[0].message.content,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": '{"command":"echo hello"}'},  # type: ignore[union-attr]
            }
        ],
    }
    return [*messages, echo, {"role": "tool", "tool_call_id": call.id, "content": "hello"}], 0


def _prompt_tokens(s: Served, messages: list[dict[str, Any]], key: str = "key-a") -> int:
    done = client(s, key).chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)  # type: ignore[arg-type]
    assert done.usage is not None
    return done.usage.prompt_tokens


def test_chat_echo_restored_on_another_replica(replicas: tuple[Served, Served, Served]) -> None:
    a, b, c = replicas
    follow, _ = _chat_echo(a, "run it (chat)")
    on_a = _prompt_tokens(a, follow)
    on_b = _prompt_tokens(b, follow)  # B fetched A's turn from Redis and restored it exactly
    on_c = _prompt_tokens(c, follow)  # C never saw it: reasoning lost, arguments as the client wrote
    assert on_a == on_b
    assert on_c < on_a
    # Another key sends the same ids: no restore for it (it cannot reach key-a's turns).
    assert _prompt_tokens(b, follow, "key-b") == on_c
    hits = b.frontend.state.metrics.lookups.labels("turn", "hit")._value.get()
    assert hits >= 1


def test_redis_outage_degrades(replicas: tuple[Served, Served, Served], redis: RedisProcess) -> None:
    a, b, c = replicas
    first = client(a).responses.create(model="m", input=CODEX_INPUT, tools=RESPONSES_TOOLS, store=True)
    follow_chat, _ = _chat_echo(a, "run it (outage)")
    redis.stop()
    try:
        # Chat is served; B cannot fetch A's turn, so no restore (as on C).
        on_b = _prompt_tokens(b, follow_chat)
        assert on_b == _prompt_tokens(c, follow_chat)
        assert b.frontend.state.metrics.lookups.labels("turn", "unavailable")._value.get() >= 1
        # New turns are served (their write is dropped and counted).
        made = client(b).responses.create(model="m", input="hello there", store=True)
        assert made.output_text == "done."
        assert b.frontend.state.metrics.writes.labels("resp", "unavailable")._value.get() >= 1
        # previous_response_id not held locally: the API's own 503, not a 500 and not "not found".
        follow = [{"type": "function_call_output", "call_id": first.output[-1].call_id, "output": "hello"}]  # type: ignore[union-attr]
        response = httpx.post(
            b.url + "/v1/responses",
            headers={"authorization": "Bearer key-a"},
            json={"model": "m", "input": follow, "previous_response_id": first.id},
        )
        assert response.status_code == 503
        assert response.json()["error"]["type"]
        metrics = httpx.get(b.url + "/metrics").text
        assert 'agentserve_state_up{backend="redis"} 0.0' in metrics
    finally:
        redis.start_again()
    made = client(a).responses.create(model="m", input="hello there", store=True)
    assert client(b).responses.retrieve(made.id).id == made.id
    assert 'agentserve_state_up{backend="redis"} 1.0' in httpx.get(b.url + "/metrics").text
