"""Random bodies never make the server answer 500: every endpoint, random JSON and mutated requests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_scenarios import (
    ANTHROPIC_TOOLS,
    CHAT_TOOLS,
    QWEN3_DEFAULT,
    QWEN3_RULES,
    RESPONSES_TOOLS,
    write_scenario,
)
from stack import Served, served

ENDPOINTS = ("/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions", "/v1/responses")
ANTHROPIC = {"anthropic-version": "2023-06-01"}

SEEDS: dict[str, dict[str, Any]] = {
    "/v1/messages": {
        "model": "m",
        "max_tokens": 40,
        "system": [{"type": "text", "text": "be brief"}],
        "tools": ANTHROPIC_TOOLS,
        "thinking": {"type": "adaptive"},
        "messages": [
            {"role": "user", "content": "run echo hello"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "go", "signature": "sig"},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"}],
            },
        ],
        "stream": False,
    },
    "/v1/chat/completions": {
        "model": "m",
        "max_tokens": 40,
        "tools": CHAT_TOOLS,
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "run it"}]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "go",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
        ],
    },
    "/v1/responses": {
        "model": "m",
        "max_output_tokens": 40,
        "tools": RESPONSES_TOOLS,
        "store": False,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
            {"type": "message", "role": "user", "content": "run it"},
            {"type": "function_call", "call_id": "call_1", "name": "Bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "hello"},
        ],
    },
}
SEEDS["/v1/messages/count_tokens"] = {
    k: v for k, v in SEEDS["/v1/messages"].items() if k not in ("max_tokens", "stream")
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    scenario = write_scenario(tmp_path_factory.mktemp("fuzz"), QWEN3_RULES, QWEN3_DEFAULT)
    with served({"script": scenario, "max_body_bytes": 64 * 1024, "context_length": 4096}) as s:
        yield s


@pytest.fixture(scope="module")
def http(server: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


def check(r: httpx.Response, endpoint: str) -> None:
    assert r.status_code < 500, (endpoint, r.status_code, r.text[:300])
    if r.status_code >= 400:
        body = r.json()
        if endpoint.startswith("/v1/messages"):
            assert body["type"] == "error" and isinstance(body["error"]["type"], str)
        else:
            assert isinstance(body["error"]["message"], str)
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text  # a stream that ended with its own terminal event (or error event)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(endpoint=st.sampled_from(ENDPOINTS), body=json_values)
def test_random_json_is_never_a_500(http: httpx.Client, endpoint: str, body: Any) -> None:
    check(http.post(endpoint, content=json.dumps(body), headers=ANTHROPIC), endpoint)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


def replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = replace(copy[head], rest, new)
    return copy


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), endpoint=st.sampled_from(ENDPOINTS), stream=st.booleans())
def test_mutated_requests_are_never_a_500(
    http: httpx.Client, data: st.DataObject, endpoint: str, stream: bool
) -> None:
    seed = dict(SEEDS[endpoint])
    if endpoint != "/v1/messages/count_tokens":
        seed["stream"] = stream
    where = data.draw(st.sampled_from(paths(seed)[1:]))
    body = replace(seed, where, data.draw(json_values))
    check(http.post(endpoint, content=json.dumps(body), headers=ANTHROPIC), endpoint)


def test_the_seeds_are_valid_requests(http: httpx.Client) -> None:
    for endpoint, body in SEEDS.items():
        r = http.post(endpoint, json=body, headers=ANTHROPIC)
        assert r.status_code == 200, (endpoint, r.text)
