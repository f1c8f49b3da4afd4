"""`agentserve frontend` over `agentserve worker` services: generate over HTTP, KV events over ZeroMQ."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest
from sim_scenarios import ANTHROPIC_TOOLS, QWEN3_DEFAULT, QWEN3_RULES, reusable, write_scenario
from stack import serving

from agentserve.config import ConfigError, FrontendConfig, WorkerConfig
from agentserve.frontend.app import create_app
from agentserve.frontend.backend import RoutedBackend
from agentserve.frontend.http import ApiKeys
from agentserve.frontend.main import build_backend
from agentserve.router.local import LocalRouter
from agentserve.worker.constrained import grammar_engine
from agentserve.worker.main import build_engine
from agentserve.worker.publisher import KvEventPublisher
from agentserve.worker.service import create_app as worker_app


def wait_ready(url: str) -> None:
    for _ in range(400):
        if httpx.get(url + "/ready").status_code == 200:
            return
        time.sleep(0.025)
    raise AssertionError(f"{url} never became ready")


def test_the_embedded_router_follows_network_workers(tmp_path: Any) -> None:
    scenario = write_scenario(tmp_path, QWEN3_RULES, QWEN3_DEFAULT)
    engine = build_engine(
        WorkerConfig.model_validate({"family": "qwen3", "sim_script": scenario, "sim_speedup": 0})
    )
    publisher = KvEventPublisher("tcp://127.0.0.1:*")
    with serving(worker_app(engine, publisher=publisher)) as (worker_url, _):
        config = FrontendConfig.model_validate({"model": "qwen3-sim", "worker_urls": [worker_url]})
        backend = build_backend(config)
        assert isinstance(backend, RoutedBackend)
        with serving(create_app(config, backend, keys=ApiKeys())) as (url, _):
            wait_ready(url)
            c = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
            request: dict[str, Any] = {"model": "m", "max_tokens": 500, "tools": ANTHROPIC_TOOLS}
            messages: list[dict[str, Any]] = [{"role": "user", "content": "please run echo hello"}]
            first = c.messages.create(messages=messages, **request)
            call = first.content[-1]
            assert call.type == "tool_use" and call.input == {"command": "echo hello"}
            messages += [
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "hello"}],
                },
            ]
            second = c.messages.create(messages=messages, **request)
            turn1 = first.usage.input_tokens + first.usage.cache_read_input_tokens + first.usage.output_tokens
            assert second.usage.cache_read_input_tokens >= reusable(turn1)
            # The router learnt the worker's blocks from its ZeroMQ events (and its snapshot).
            assert backend.remote is not None and isinstance(backend.remote.router, LocalRouter)
            core = backend.remote.router.core
            for _ in range(200):
                if core.stats().index.blocks * 32 >= reusable(turn1):
                    break
                time.sleep(0.025)
            assert core.stats().index.blocks * 32 >= reusable(turn1)
            ready = httpx.get(url + "/ready").json()
            assert ready["router"] == "embedded" and len(ready["workers"]) == 1


def test_a_frontend_needs_workers_or_a_router() -> None:
    with pytest.raises(ConfigError, match="worker-urls"):
        build_backend(FrontendConfig.model_validate({"model": "qwen3-sim"}))
    remote = build_backend(FrontendConfig.model_validate({"model": "qwen3-sim", "router_url": "http://x:1"}))
    assert isinstance(remote, RoutedBackend) and remote.describe() == {"router": "service", "workers": []}


def test_a_worker_that_goes_away_leaves_the_router(tmp_path: Any) -> None:
    scenario = write_scenario(tmp_path, QWEN3_RULES, QWEN3_DEFAULT)
    engine = build_engine(
        WorkerConfig.model_validate({"family": "qwen3", "sim_script": scenario, "sim_speedup": 0})
    )
    with contextlib.ExitStack() as stack:
        worker_url, _ = stack.enter_context(
            serving(worker_app(engine, publisher=KvEventPublisher("tcp://127.0.0.1:*")))
        )
        config = FrontendConfig.model_validate({"model": "qwen3-sim", "worker_urls": [worker_url]})
        backend = RoutedBackend(config)
        with serving(create_app(config, backend, keys=ApiKeys())) as (url, _):
            wait_ready(url)
            stack.close()  # the worker process goes away
            for _ in range(400):
                if httpx.get(url + "/ready").status_code == 503:
                    break
                time.sleep(0.025)
            assert httpx.get(url + "/ready").status_code == 503
            assert backend.remote is not None and backend.remote.workers() == {}
            body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
            r = httpx.post(url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
            assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize("transport", ["mux", "http"])
def test_a_constraint_reaches_a_network_worker(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """The constraint crosses the generate wire (the mux connection, or one request per call) and the
    remote sim obeys it: its script calls Bash, `tool_choice: none` gets text, a forced Read gets Read."""
    monkeypatch.setenv("AGENTSERVE_WORKER_TRANSPORT", transport)
    scenario = write_scenario(tmp_path, QWEN3_RULES, QWEN3_DEFAULT)
    engine = build_engine(
        WorkerConfig.model_validate({"family": "qwen3", "sim_script": scenario, "sim_speedup": 0})
    )
    with serving(worker_app(engine, publisher=KvEventPublisher("tcp://127.0.0.1:*"))) as (worker_url, _):
        config = FrontendConfig.model_validate({"model": "qwen3-sim", "worker_urls": [worker_url]})
        with serving(create_app(config, build_backend(config), keys=ApiKeys())) as (url, _):
            wait_ready(url)
            c = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
            request: dict[str, Any] = {"model": "m", "max_tokens": 500, "tools": ANTHROPIC_TOOLS}
            messages: Any = [{"role": "user", "content": "please run echo hello"}]
            free = c.messages.create(messages=messages, **request)
            assert [b.type for b in free.content if b.type == "tool_use"] == ["tool_use"]
            none = c.messages.create(messages=messages, tool_choice={"type": "none"}, **request)
            assert [b for b in none.content if b.type == "tool_use"] == []
            read = c.messages.create(
                messages=messages, tool_choice={"type": "tool", "name": "Read"}, **request
            )
            assert [b.name for b in read.content if b.type == "tool_use"] == ["Read"]


@pytest.mark.parametrize("transport", ["mux", "http"])
def test_logprobs_and_logit_bias_cross_the_generate_wire(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """Log-probabilities come back from a remote sim (mux frames or per-request frames) and a
    logit_bias reaches its sampler: the same numbers as the in-process engine's sampling policy."""
    monkeypatch.setenv("AGENTSERVE_WORKER_TRANSPORT", transport)
    scenario = write_scenario(tmp_path, QWEN3_RULES, QWEN3_DEFAULT)
    engine = build_engine(
        WorkerConfig.model_validate({"family": "qwen3", "sim_script": scenario, "sim_speedup": 0})
    )
    with serving(worker_app(engine, publisher=KvEventPublisher("tcp://127.0.0.1:*"))) as (worker_url, _):
        config = FrontendConfig.model_validate({"model": "qwen3-sim", "worker_urls": [worker_url]})
        with serving(create_app(config, build_backend(config), keys=ApiKeys())) as (url, _):
            wait_ready(url)
            c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
            messages: Any = [{"role": "user", "content": "hi"}]
            for stream in (False, True):
                args: dict[str, Any] = {
                    "model": "m",
                    "messages": messages,
                    "logprobs": True,
                    "top_logprobs": 2,
                }
                if stream:
                    chunks = list(c.chat.completions.create(**args, stream=True))
                    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
                    entries = [
                        e
                        for ch in chunks
                        for ch_c in ch.choices
                        if ch_c.logprobs
                        for e in ch_c.logprobs.content or []
                    ]
                else:
                    choice = c.chat.completions.create(**args).choices[0]
                    text, entries = (
                        choice.message.content or "",
                        (choice.logprobs.content or []) if choice.logprobs else [],
                    )
                assert text and b"".join(bytes(e.bytes) for e in entries).decode() == text
                assert all(len(e.top_logprobs) == 2 and e.logprob <= 0.0 for e in entries)
            first = entries[0]
            banned = c.chat.completions.create(
                model="m",
                messages=messages,
                logit_bias={str(engine_token(engine, bytes(first.bytes))): -100},  # type: ignore[arg-type]
            )
            assert not (banned.choices[0].message.content or "").startswith(first.token)


def engine_token(engine: Any, raw: bytes) -> int:
    (token,) = grammar_engine(engine.tokenizer).tokenizer().tokenize_bytes(raw)
    return int(token)
