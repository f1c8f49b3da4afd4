"""The API contract at the edge: bad input is the API's own 400 naming the field, never a 500.

The in-process `agentserve up` app (zero-time sim) through Starlette's test client.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentserve.api._check import MAX_DEPTH, check_depth, check_surrogates
from agentserve.api.errors import InvalidRequestError
from agentserve.config import UpConfig
from agentserve.frontend.http import ApiKeys
from agentserve.frontend.up import build_up

ANTHROPIC = {"anthropic-version": "2023-06-01"}

MESSAGES: dict[str, Any] = {
    "model": "qwen3-sim",
    "max_tokens": 16,
    "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}],
    "messages": [{"role": "user", "content": "hi"}],
}
CHAT: dict[str, Any] = {
    "model": "qwen3-sim",
    "max_tokens": 16,
    "tools": [{"type": "function", "function": {"name": "Bash", "description": "run", "parameters": {}}}],
    "messages": [{"role": "user", "content": "hi"}],
}
RESPONSES: dict[str, Any] = {
    "model": "qwen3-sim",
    "max_output_tokens": 16,
    "store": False,
    "tools": [{"type": "function", "name": "shell", "description": "run", "parameters": {}}],
    "input": [{"type": "message", "role": "user", "content": "hi"}],
}
BODIES = {"/v1/messages": MESSAGES, "/v1/chat/completions": CHAT, "/v1/responses": RESPONSES}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    config = UpConfig.model_validate({"port": 0, "sim_speedup": 0, "context_length": 4096})
    app, _ = build_up(config, keys=ApiKeys())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def post(client: TestClient, path: str, body: Any, *, raw: bytes | None = None) -> Any:
    content = raw if raw is not None else json.dumps(body).encode()
    return client.post(path, content=content, headers={**ANTHROPIC, "content-type": "application/json"})


def error_of(path: str, r: Any) -> tuple[str, str | None]:
    """(message, param) of an error body, checking it has the API's shape."""
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        message: str = body["error"]["message"]
        param, sep, _ = message.partition(": ")
        return message, param if sep else None
    assert body["error"]["type"] == "invalid_request_error", body
    return body["error"]["message"], body["error"]["param"]


def with_value(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


# -- 1. lone surrogates and wrong types: the API's 400 and the field's path ------------------------

SURROGATE_CASES = [
    ("/v1/messages", ("messages", 0, "content"), "messages[0].content"),
    ("/v1/messages", ("tools", 0, "description"), "tools[0].description"),
    ("/v1/messages", ("tools", 0, "name"), "tools[0].name"),
    ("/v1/messages", ("system",), "system"),
    ("/v1/chat/completions", ("messages", 0, "content"), "messages[0].content"),
    ("/v1/chat/completions", ("tools", 0, "function", "description"), "tools[0].function.description"),
    ("/v1/responses", ("input", 0, "content"), "input[0].content"),
    ("/v1/responses", ("tools", 0, "name"), "tools[0].name"),
    ("/v1/responses", ("instructions",), "instructions"),
]


@pytest.mark.parametrize(("path", "where", "param"), SURROGATE_CASES)
@pytest.mark.parametrize("text", ["\udcff", "ok \ud800 ok", "\ud83d"])
def test_a_lone_surrogate_is_the_apis_400_naming_the_field(
    client: TestClient, path: str, where: tuple[Any, ...], param: str, text: str
) -> None:
    for stream in (False, True):
        body = with_value({**BODIES[path], "stream": stream}, where, text)
        r = post(client, path, body)  # json.dumps escapes it as \udcff, as clients send it
        assert r.status_code == 400, r.text
        message, got = error_of(path, r)
        assert got == param and "surrogate" in message


def test_a_lone_surrogate_in_a_key_or_as_raw_bytes_is_refused(client: TestClient) -> None:
    body = {**MESSAGES, "metadata": {"\udcff": "x"}}
    r = post(client, "/v1/messages", body)
    assert r.status_code == 400 and error_of("/v1/messages", r)[1] == r"metadata.\udcff"
    raw = json.dumps(with_value(CHAT, ("messages", 0, "content"), "SURR"), ensure_ascii=False).encode()
    raw = raw.replace(b"SURR", "\udcff".encode("utf-8", "surrogatepass"))
    r = post(client, "/v1/chat/completions", None, raw=raw)
    assert r.status_code == 400 and error_of("/v1/chat/completions", r)[1] == "messages[0].content"


def test_a_surrogate_pair_is_text_not_an_error(client: TestClient) -> None:
    r = post(client, "/v1/messages", with_value(MESSAGES, ("messages", 0, "content"), "smile \ud83d\ude00"))
    assert r.status_code == 200, r.text


WRONG_TYPES = [
    ("/v1/messages", ("tools", 0, "description"), 7, "tools[0].description"),
    ("/v1/messages", ("tools", 0, "input_schema"), "x", "tools[0].input_schema"),
    ("/v1/messages", ("tools", 0, "name"), ["Bash"], "tools[0].name"),
    ("/v1/messages", ("tool_choice",), {"type": "tool", "name": 3}, "tool_choice.name"),
    (
        "/v1/chat/completions",
        ("tools", 0, "function", "description"),
        {"a": 1},
        "tools[0].function.description",
    ),
    ("/v1/chat/completions", ("tools", 0, "function", "parameters"), [1], "tools[0].function.parameters"),
    ("/v1/chat/completions", ("tools", 0, "function", "name"), 1, "tools[0].function.name"),
    ("/v1/responses", ("tools", 0, "description"), True, "tools[0].description"),
    ("/v1/responses", ("tools", 0, "parameters"), "x", "tools[0].parameters"),
    ("/v1/responses", ("tools", 0, "name"), None, "tools[0].name"),
]


@pytest.mark.parametrize(("path", "where", "value", "param"), WRONG_TYPES)
def test_a_wrong_typed_tool_field_is_the_apis_400_naming_it(
    client: TestClient, path: str, where: tuple[Any, ...], value: Any, param: str
) -> None:
    r = post(client, path, with_value(BODIES[path], where, value))
    assert r.status_code == 400, r.text
    assert error_of(path, r)[1] == param


def test_a_call_name_of_the_wrong_type_is_a_400(client: TestClient) -> None:
    body = copy.deepcopy(CHAT)
    body["messages"] += [
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": 5}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
    ]
    r = post(client, "/v1/chat/completions", body)
    assert (
        r.status_code == 400
        and error_of("/v1/chat/completions", r)[1] == "messages[1].tool_calls[0].function.name"
    )


def nested(depth: int) -> Any:
    value: Any = {"type": "string"}
    for _ in range(depth - 1):
        value = {"type": "object", "properties": {"a": value}}
    return value


def test_free_form_json_deeper_than_the_limit_is_a_400_with_its_path(client: TestClient) -> None:
    deep = nested(MAX_DEPTH)  # 2 levels per step: well past the limit
    r = post(client, "/v1/messages", with_value(MESSAGES, ("tools", 0, "input_schema"), deep))
    assert r.status_code == 400, r.text
    message, param = error_of("/v1/messages", r)
    assert (
        "levels deep" in message
        and param is not None
        and param.startswith("tools[0].input_schema.properties")
    )
    ok = nested(MAX_DEPTH // 2 - 1)
    r = post(client, "/v1/messages", with_value(MESSAGES, ("tools", 0, "input_schema"), ok))
    assert r.status_code == 200, r.text


def test_the_checks_alone() -> None:
    check_surrogates({"a": ["fine \U0001f600"]}, b'{"a": ["fine \\ud83d\\ude00"]}')
    with pytest.raises(InvalidRequestError) as info:
        check_surrogates({"a": [1, "x\udc00"]}, b'{"a": [1, "x\\udc00"]}')
    assert info.value.param == "a[1]"
    check_surrogates({"a": "\udc00"}, b"{}")  # no hint in the raw bytes: not scanned (json.loads made it)
    assert check_depth({"a": [[1]]}, "x", max_depth=3) == {"a": [[1]]}
    with pytest.raises(InvalidRequestError) as info:
        check_depth({"a": [[[1]]]}, "x", max_depth=3)
    assert info.value.param == "x.a[0][0]"


# -- 2. streams always end with the API's error event and terminal frame ----------------------------

TERMINAL = {
    "/v1/messages": b"event: error\ndata: ",
    "/v1/chat/completions": b"data: [DONE]\n\n",
    "/v1/responses": b"event: response.failed\n",
}
LAST_RESORT_TERMINAL = {**TERMINAL, "/v1/responses": b"event: error\ndata: "}


def stream(client: TestClient, path: str) -> bytes:
    r = post(client, path, {**BODIES[path], "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    return r.content


@pytest.mark.parametrize("path", list(BODIES))
def test_a_failure_mid_stream_ends_with_the_error_event_and_terminal_frame(
    client: TestClient, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentserve.frontend.generate import Generation

    def failing(self: Generation, step: object) -> Any:
        raise RuntimeError("a parser bug")

    monkeypatch.setattr(Generation, "feed", failing)
    body = stream(client, path)
    frames = [f + b"\n\n" for f in body.split(b"\n\n") if f]
    assert frames[-1].startswith(TERMINAL[path]), frames[-3:]
    assert b"internal error" in frames[-2 if path == "/v1/chat/completions" else -1]


@pytest.mark.parametrize("path", list(BODIES))
def test_a_failure_of_the_error_event_itself_still_ends_the_stream(
    client: TestClient, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentserve.frontend import surfaces
    from agentserve.frontend.relay import Relay

    async def failing(self: Relay) -> None:
        raise RuntimeError("an encoder bug")

    def error(self: object, error: object) -> bytes:
        raise RuntimeError("the error encoder failed too")

    monkeypatch.setattr(Relay, "run", failing)
    for writer in (surfaces._AnthropicWriter, surfaces._OpenAIWriter):
        monkeypatch.setattr(writer, "error", error)
    body = stream(client, path)
    assert LAST_RESORT_TERMINAL[path] in body and b"internal error" in body


@pytest.mark.parametrize("path", list(BODIES))
def test_a_stream_whose_producer_fails_ends_with_the_apis_error(
    client: TestClient, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentserve.frontend.service import Frontend

    async def failing(self: Frontend, *args: object) -> bytes:
        raise RuntimeError("the request path failed outside the relay")

    monkeypatch.setattr(Frontend, "stream", failing)
    body = stream(client, path)
    assert LAST_RESORT_TERMINAL[path] in body and b"internal error" in body


def test_a_broken_connection_at_the_last_frame_is_closed_without_an_exception() -> None:
    import asyncio

    from agentserve.frontend.http import EventStreamResponse

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message["more_body"]:
            raise OSError("connection reset by peer")
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def produce(write: Any) -> bytes:
        await write(b"data: 1\n\n")
        raise RuntimeError("failed")

    async def nothing() -> None:
        return None

    response = EventStreamResponse(
        produce,
        headers={},
        ping=lambda: b"",
        ping_interval=0,
        on_disconnect=nothing,
        on_error=lambda: b"data: end\n\n",
    )
    asyncio.run(response({"type": "http"}, receive, send))  # type: ignore[arg-type]
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n"]


# -- 3. what the real APIs reject ------------------------------------------------------------------

REJECTED = [
    # Chat: a forced call of a function not offered (OpenAI: 400)
    (
        "/v1/chat/completions",
        {"tool_choice": {"type": "function", "function": {"name": "Nope"}}},
        "tool_choice",
    ),
    (
        "/v1/chat/completions",
        {"tools": None, "tool_choice": {"type": "function", "function": {"name": "Bash"}}},
        "tool_choice",
    ),
    ("/v1/chat/completions", {"function_call": {"name": "Nope"}}, "function_call"),
    ("/v1/chat/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    # Anthropic: an OpenAI-shaped tool, a tool_choice naming no offered tool
    (
        "/v1/messages",
        {"tools": [{"type": "function", "function": {"name": "Bash", "parameters": {}}}]},
        "tools[0].type",
    ),
    ("/v1/messages", {"tools": [{"function": {"name": "Bash", "parameters": {}}}]}, "tools[0]"),
    ("/v1/messages", {"tool_choice": {"type": "tool", "name": "Nope"}}, "tool_choice.name"),
    # Anthropic max_tokens 0 (a cache pre-warm) with what the real API refuses it with
    ("/v1/messages", {"max_tokens": 0, "stream": True}, "max_tokens"),
    ("/v1/messages", {"max_tokens": 0, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "max_tokens"),
    ("/v1/messages", {"max_tokens": 0, "thinking": {"type": "adaptive"}}, "max_tokens"),
    (
        "/v1/messages",
        {"max_tokens": 0, "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
        "max_tokens",
    ),
    ("/v1/messages", {"max_tokens": -1}, "max_tokens"),
    # Responses: a forced call of a tool not offered
    ("/v1/responses", {"tool_choice": {"type": "function", "name": "Nope"}}, "tool_choice"),
    # OpenAI's limits: 128 Chat tools; Responses metadata of 16 string pairs (64 / 512 characters)
    ("/v1/chat/completions", {"tools": CHAT["tools"] * 129}, "tools"),
    ("/v1/responses", {"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ("/v1/responses", {"metadata": {"k": 1}}, "metadata.k"),
    ("/v1/responses", {"metadata": {"k": "v" * 513}}, "metadata.k"),
    ("/v1/responses", {"metadata": {"k" * 65: "v"}}, "metadata"),
    # Chat `metadata`: the same limits (OpenAI enforces them on Chat too)
    ("/v1/chat/completions", {"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ("/v1/chat/completions", {"metadata": {"k" * 65: "v"}}, "metadata"),
    ("/v1/chat/completions", {"metadata": {"k": 1}}, "metadata.k"),
    ("/v1/chat/completions", {"metadata": {"k": "v" * 513}}, "metadata.k"),
    ("/v1/chat/completions", {"metadata": ["k", "v"]}, "metadata"),
    # names past 256 characters (models, tools)
    ("/v1/messages", {"model": "m" * 257}, "model"),
    ("/v1/chat/completions", {"model": "m" * 257}, "model"),
    ("/v1/responses", {"tools": [{"type": "function", "name": "f" * 257}]}, "tools[0].name"),
    # a forced call of a server / hosted tool, which cannot run here (issue 23)
    (
        "/v1/messages",
        {
            "tools": [*MESSAGES["tools"], {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "tool", "name": "web_search"},
        },
        "tool_choice.name",
    ),
    (
        "/v1/responses",
        {"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
        "tool_choice",
    ),
]


@pytest.mark.parametrize(("path", "change", "param"), REJECTED)
def test_what_the_real_apis_reject_is_a_400(
    client: TestClient, path: str, change: dict[str, Any], param: str
) -> None:
    body = {k: v for k, v in {**BODIES[path], **change}.items() if v is not None}
    r = post(client, path, body)
    assert r.status_code == 400, r.text
    assert error_of(path, r)[1] == param


ACCEPTED = [
    ("/v1/messages", {"max_tokens": 0}),  # a cache pre-warm: non-streaming, no thinking
    ("/v1/messages", {"tool_choice": {"type": "tool", "name": "Bash"}}),
    ("/v1/messages", {"tools": [*MESSAGES["tools"], {"type": "web_search_20250305", "name": "web_search"}]}),
    ("/v1/chat/completions", {"tool_choice": {"type": "function", "function": {"name": "Bash"}}}),
    ("/v1/chat/completions", {"stop": ["a", "b", "c", "d"]}),
    ("/v1/responses", {"tool_choice": {"type": "function", "name": "shell"}}),
    ("/v1/chat/completions", {"metadata": {**{f"k{i}": "v" for i in range(15)}, "k" * 64: "v" * 512}}),
]


def test_chat_metadata_errors_read_as_openais() -> None:
    from agentserve.api import decode_chat

    too_many = {**CHAT, "metadata": {f"k{i}": "v" for i in range(17)}}
    with pytest.raises(InvalidRequestError) as info:
        decode_chat(too_many)
    body = info.value.openai_body()["error"]
    assert body["param"] == "metadata" and body["type"] == "invalid_request_error"
    assert body["message"] == (
        "Invalid 'metadata': too many properties. Expected an object with at most 16 properties, "
        "but got an object with 17 properties instead."
    )
    with pytest.raises(InvalidRequestError) as info:
        decode_chat({**CHAT, "metadata": {"k": "v" * 513}})
    assert info.value.openai_body()["error"]["message"] == (
        "Invalid 'metadata.k': string too long. Expected a string with maximum length 512, "
        "but got a string with length 513 instead."
    )


@pytest.mark.parametrize(("path", "change"), ACCEPTED)
def test_what_the_real_apis_accept_still_works(client: TestClient, path: str, change: dict[str, Any]) -> None:
    r = post(client, path, {**BODIES[path], **change})
    assert r.status_code == 200, r.text


# -- 4. catalogs advertise the model's own context window ------------------------------------------


@pytest.mark.parametrize(
    ("config_json", "context_length", "window"),
    [
        ({"max_position_embeddings": 40960}, None, 40960),  # Qwen3: its config, not 131072
        ({"max_position_embeddings": 40960}, 131072, 40960),  # the spec cannot raise it
        ({"max_position_embeddings": 40960}, 32768, 32768),  # but can lower it
        (
            {"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            None,
            131072,
        ),
        (
            {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            None,
            131072,
        ),
        ({"text_config": {"max_position_embeddings": 262144}, "vision_config": {}}, None, 262144),
        ({"n_positions": 2048}, None, 2048),
        ({}, 8192, 8192),
        ({}, None, 131072),
    ],
)
def test_every_catalog_advertises_the_models_own_window(
    tmp_path: Any, config_json: dict[str, Any], context_length: int | None, window: int
) -> None:
    from agentserve.api.catalog import anthropic_models, codex_catalog, openai_models
    from agentserve.config import FrontendConfig
    from agentserve.families import get_family
    from agentserve.frontend.models import served_models

    (tmp_path / "config.json").write_text(json.dumps(config_json))
    config = FrontendConfig.model_validate({"model_path": str(tmp_path), "context_length": context_length})
    models = served_models(config, get_family("qwen3"))
    assert models[0].context_window == window
    assert anthropic_models(models)["data"][0]["max_input_tokens"] == window
    assert openai_models(models)["data"][0]["context_window"] == window
    codex = codex_catalog(models)["models"][0]
    assert codex["context_window"] == window and codex["auto_compact_token_limit"] < window


def test_a_tool_event_with_a_lone_surrogate_is_a_400(client: TestClient) -> None:
    event = {
        "event_type": "tool_start",
        "agent_context": {"session_id": "s1"},
        "tool": {"tool_call_id": "call_1", "tool_name": "Bash\udcff", "started_at_unix_ms": 1},
    }
    r = client.post("/v1/agent/tool_events", content=json.dumps(event))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool.tool_name"


SCHEMA_SHAPES = [
    ("/v1/messages", ("tools", 0, "input_schema"), {"type": None}, "tools[0].input_schema.type"),
    ("/v1/messages", ("tools", 0, "input_schema"), {"type": "string"}, "tools[0].input_schema.type"),
    (
        "/v1/chat/completions",
        ("tools", 0, "function", "parameters"),
        {"type": "array"},
        "tools[0].function.parameters.type",
    ),
    ("/v1/responses", ("tools", 0, "parameters"), {"type": 3}, "tools[0].parameters.type"),
]


@pytest.mark.parametrize(("path", "where", "schema", "param"), SCHEMA_SHAPES)
def test_a_tool_schema_that_is_not_an_objects_is_a_400(
    client: TestClient, path: str, where: tuple[Any, ...], schema: Any, param: str
) -> None:
    r = post(client, path, with_value(BODIES[path], where, schema))
    assert r.status_code == 400, r.text
    assert error_of(path, r)[1] == param


# -- 4. catalogs advertise the model's own output limit ----------------------------------------------


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"generation_config.json": {"max_new_tokens": 32768}}, 32768),
        ({"generation_config.json": {"max_length": 16384}}, 16384),  # prompt + output: bounds the output
        ({"generation_config.json": {"max_new_tokens": 8192, "max_length": 40960}}, 8192),
        ({"generation_config.json": {"max_length": 20}}, None),  # transformers' default, written out
        ({"generation_config.json": {"max_new_tokens": 999999}}, 40960),  # never past the window
        ({"generation_config.json": {"temperature": 0.6}, "config.json": {"max_output_tokens": 4096}}, 4096),
        ({"config.json": {"text_config": {"max_new_tokens": 2048}}}, 2048),
        ({"generation_config.json": {"max_new_tokens": "many"}}, None),
        ({}, None),  # nothing stated: omitted, not guessed
    ],
)
def test_every_catalog_advertises_the_models_own_output_limit(
    tmp_path: Any, files: dict[str, Any], limit: int | None
) -> None:
    from agentserve.api.catalog import anthropic_models, codex_catalog, openai_models
    from agentserve.config import FrontendConfig
    from agentserve.families import get_family
    from agentserve.frontend.models import served_models

    config_json = {"max_position_embeddings": 40960, **files.get("config.json", {})}
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    if "generation_config.json" in files:
        (tmp_path / "generation_config.json").write_text(json.dumps(files["generation_config.json"]))
    models = served_models(FrontendConfig.model_validate({"model_path": str(tmp_path)}), get_family("qwen3"))
    assert models[0].max_output_tokens == limit
    anthropic = anthropic_models(models)["data"][0]
    openai = openai_models(models, codex=True)
    assert anthropic.get("max_tokens") == limit
    assert openai["data"][0].get("max_output_tokens") == limit
    # Codex's ModelInfo has no output-limit field (its config.toml's `model_max_output_tokens` is
    # the client's own setting): the entry stays as Codex parses it.
    assert "max_output_tokens" not in codex_catalog(models)["models"][0]
    assert "max_output_tokens" not in openai["models"][0]


def test_the_budget_holds_to_the_advertised_output_limit() -> None:
    from agentserve.frontend.plan import output_budget

    assert output_budget(32000, 1000, 40960, 8192) == 8192  # Claude Code's 32000 → the model's limit
    assert output_budget(None, 1000, 40960, 8192) == 8192  # no max_tokens: the limit, not the room
    assert output_budget(100, 1000, 40960, 8192) == 100
    assert output_budget(32000, 38000, 40960, 8192) == 2960  # the window's room is smaller
    assert output_budget(None, 1000, 40960, None) == 39960
