"""Every error in its API's own shape and status, never a 500 for what a client sent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from sim_scenarios import QWEN3_DEFAULT, QWEN3_RULES, write_scenario
from stack import Served, served

from agentserve.config import WorkerConfig
from agentserve.frontend.http import ApiKeys
from agentserve.worker.engine import GenerateRequest, Step
from agentserve.worker.main import build_engine

ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
PATHS = {"anthropic": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}
VALID: dict[str, dict[str, Any]] = {
    "anthropic": {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]},
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": "hi"},
}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_scenario(tmp_path_factory.mktemp("errors"), QWEN3_RULES, QWEN3_DEFAULT)


@pytest.fixture(scope="module")
def small(scenario: str) -> Iterator[Served]:
    """A small context window and body limit, and API keys."""
    settings = {"script": scenario, "context_length": 300, "max_body_bytes": 4096}
    with served(settings, keys=ApiKeys(["sk-good"])) as s:
        yield s


def assert_anthropic_error(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind
    assert body["request_id"] == r.headers["request-id"]
    assert "Traceback" not in r.text
    return body


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    assert "Traceback" not in r.text
    return error


def post(s: Served, api: str, content: bytes | str, key: str | None = "sk-good", **kw: Any) -> httpx.Response:
    headers = dict(ANTHROPIC_HEADERS if api == "anthropic" else {"content-type": "application/json"})
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(s.url + PATHS[api], content=content, headers=headers, **kw)


@pytest.mark.parametrize("api", list(PATHS))
@pytest.mark.parametrize(
    "body", [b"{not json", b"", b"[1, 2]", b'"a string"', b"\xff\xfe", b"[" * 100_000 + b"]" * 100_000]
)
def test_bodies_that_are_not_requests_are_400(small: Served, api: str, body: bytes) -> None:
    if len(body) > 4096:  # the nesting bomb is also over the body limit on this server
        r = post(small, api, body)
        assert r.status_code == 413
        return
    r = post(small, api, body)
    if api == "anthropic":
        assert_anthropic_error(r, 400, "invalid_request_error")
    else:
        assert_openai_error(r, 400)


def test_wrong_types_are_400_in_each_shape(small: Served) -> None:
    a = anthropic.Anthropic(base_url=small.url, api_key="sk-good", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as info:
        a.messages.create(
            model="m", max_tokens="many", messages=[{"role": "user", "content": "hi"}], timeout=10
        )
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in info.value.message
    o = openai.OpenAI(base_url=small.url + "/v1", api_key="sk-good", max_retries=0)
    with pytest.raises(openai.BadRequestError) as oinfo:
        o.chat.completions.create(model="m", messages="hi")
    assert oinfo.value.param == "messages"
    with pytest.raises(openai.BadRequestError):
        o.responses.create(model="m", input=5)


def test_unknown_endpoints_and_methods(small: Served) -> None:
    r = httpx.post(small.url + "/v1/nothing", headers=ANTHROPIC_HEADERS)
    assert_anthropic_error(r, 404, "not_found_error")
    assert_openai_error(httpx.get(small.url + "/v1/nothing"), 404)
    a = anthropic.Anthropic(base_url=small.url, api_key="sk-good", max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        a.get("/v1/files", cast_to=object)
    assert_anthropic_error(
        httpx.get(small.url + "/v1/messages", headers=ANTHROPIC_HEADERS), 405, "invalid_request_error"
    )


@pytest.mark.parametrize("api", list(PATHS))
def test_bodies_over_the_limit_are_413(small: Served, api: str) -> None:
    big = dict(VALID[api])
    big["metadata"] = {"padding": "x" * 5000} if api != "anthropic" else {"user_id": "x" * 5000}
    r = post(small, api, json.dumps(big))
    if api == "anthropic":
        assert_anthropic_error(r, 413, "request_too_large")
    else:
        assert_openai_error(r, 413)

    def chunks() -> Iterator[bytes]:  # no content-length: counted while reading
        yield b'{"model": "m", "padding": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    r = post(small, api, chunks())
    assert r.status_code == 413


def test_api_keys(small: Served) -> None:
    body = VALID["anthropic"]
    r = httpx.post(small.url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert_anthropic_error(r, 401, "authentication_error")
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=small.url, api_key="sk-bad", max_retries=0).messages.create(**body)
    # x-api-key (ANTHROPIC_API_KEY) and Authorization: Bearer (ANTHROPIC_AUTH_TOKEN) both work.
    assert anthropic.Anthropic(base_url=small.url, api_key="sk-good").messages.create(**body).content
    assert anthropic.Anthropic(base_url=small.url, auth_token="sk-good").messages.create(**body).content
    with pytest.raises(openai.AuthenticationError) as info:
        openai.OpenAI(base_url=small.url + "/v1", api_key="sk-bad", max_retries=0).models.list()
    assert info.value.code == "invalid_api_key"
    assert httpx.get(small.url + "/health").status_code == 200  # operations need no key


def test_context_length_in_each_api(small: Served) -> None:
    long = "words " * 400
    a = anthropic.Anthropic(base_url=small.url, api_key="sk-good", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as info:
        a.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": long}])
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert info.value.body["error"]["message"].startswith("prompt is too long")
    o = openai.OpenAI(base_url=small.url + "/v1", api_key="sk-good", max_retries=0)
    with pytest.raises(openai.BadRequestError) as oinfo:
        o.chat.completions.create(model="m", messages=[{"role": "user", "content": long}])
    assert oinfo.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as rinfo:
        o.responses.create(model="m", input=long)
    assert rinfo.value.code == "context_length_exceeded"
    # Streaming, Codex reads it from response.failed (then compacts).
    events = list(o.responses.create(model="m", input=long, stream=True))
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]
    failed = events[-1].response
    assert failed.error is not None and failed.error.code == "context_length_exceeded"
    # max_tokens past the room left is clamped, not refused (Claude Code always asks for 32000).
    ok = a.messages.create(
        model="m", max_tokens=32000, messages=[{"role": "user", "content": "hi"}], timeout=30
    )
    assert ok.stop_reason in ("end_turn", "tool_use")


def test_no_worker_is_overloaded(scenario: str) -> None:
    with served({"script": scenario}, engines={}) as s:
        assert httpx.get(s.url + "/ready").status_code == 503
        a = anthropic.Anthropic(base_url=s.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.OverloadedError) as info:
            a.messages.create(**VALID["anthropic"])
        assert info.value.status_code == 529
        assert info.value.response.headers["retry-after"]
        o = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError) as oinfo:
            o.chat.completions.create(**VALID["chat"])
        assert oinfo.value.status_code == 503
        with pytest.raises(openai.InternalServerError):
            o.responses.create(**VALID["responses"], stream=True)


# -- a worker that dies mid-stream -----------------------------------------------------------------


class _DyingStream:
    def __init__(self, inner: Any, steps: int) -> None:
        self.inner, self.left = inner, steps

    def __aiter__(self) -> _DyingStream:
        return self

    async def __anext__(self) -> Step:
        if self.left == 0:
            await self.inner.aclose()
            raise ConnectionResetError("the worker went away")
        self.left -= 1
        step: Step = await self.inner.__anext__()
        return step

    async def aclose(self) -> None:
        await self.inner.aclose()


class DyingEngine:
    """A sim engine whose streams fail after a few steps (a worker lost mid-stream)."""

    def __init__(self, inner: Any, steps: int = 3) -> None:
        self.inner, self.steps = inner, steps

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, request: GenerateRequest) -> _DyingStream:
        return _DyingStream(self.inner.generate(request), self.steps)


class BrokenEngine(DyingEngine):
    def generate(self, request: GenerateRequest) -> _DyingStream:
        raise RuntimeError("a bug in an engine adapter")


def engine(scenario: str, speedup: float) -> Any:
    # No catch-up: a late sim on a loaded machine merges steps, and the whole output could arrive
    # before the dying engine's third step.
    config = WorkerConfig.model_validate(
        {"family": "qwen3", "sim_script": scenario, "sim_speedup": speedup, "sim_catch_up_s": 0}
    )
    return build_engine(config)


@pytest.fixture
def dying(scenario: str) -> Iterator[Served]:
    # Real-ish speed so tokens arrive one step at a time (the failure lands after output started).
    with served({"script": scenario}, engines={"w": DyingEngine(engine(scenario, 20.0))}) as s:
        yield s


def test_worker_lost_mid_stream_anthropic(dying: Served) -> None:
    a = anthropic.Anthropic(base_url=dying.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as info, a.messages.stream(**VALID["anthropic"]) as stream:
        for _ in stream:
            pass
    assert info.value.body["error"]["type"] == "overloaded_error"


def test_worker_lost_mid_stream_chat(dying: Served) -> None:
    o = openai.OpenAI(base_url=dying.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.APIError) as info:
        for _ in o.chat.completions.create(**VALID["chat"], stream=True):
            pass
    assert info.value.code == "overloaded"


def test_worker_lost_mid_stream_responses(dying: Served) -> None:
    o = openai.OpenAI(base_url=dying.url + "/v1", api_key="k", max_retries=0)
    events = list(o.responses.create(**VALID["responses"], stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "server_error"


def test_worker_lost_before_a_non_streaming_answer_is_overloaded(dying: Served) -> None:
    a = anthropic.Anthropic(base_url=dying.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.OverloadedError):
        a.messages.create(**VALID["anthropic"])


def test_an_internal_failure_is_the_api_error_with_a_request_id(scenario: str) -> None:
    with served({"script": scenario}, engines={"w": BrokenEngine(engine(scenario, 0))}) as s:
        r = httpx.post(s.url + "/v1/messages", json=VALID["anthropic"], headers=ANTHROPIC_HEADERS)
        body = assert_anthropic_error(r, 500, "api_error")
        assert body["request_id"] in body["error"]["message"]
        assert "adapter" not in r.text  # the cause is logged, not sent
        assert_openai_error(post(s, "chat", json.dumps(VALID["chat"])), 500)
