"""Operations endpoints, the OpenAPI document, keep-alive pings and client disconnects."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from sim_scenarios import CHAT_TOOLS, QWEN3_DEFAULT, QWEN3_RULES, write_scenario
from stack import Served, served

from agentserve.api.sse import PING_COMMENT


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_scenario(tmp_path_factory.mktemp("ops"), QWEN3_RULES, QWEN3_DEFAULT)


@pytest.fixture(scope="module")
def fast(scenario: str) -> Iterator[Served]:
    with served({"script": scenario}) as s:
        yield s


def test_root_health_ready_metrics(fast: Served) -> None:
    head = httpx.head(fast.url + "/")  # Claude Code's connectivity probe
    assert head.status_code == 200 and head.content == b""
    assert httpx.get(fast.url + "/").json()["models"] == ["qwen3-sim"]
    assert httpx.get(fast.url + "/health").json() == {"status": "ok"}
    ready = httpx.get(fast.url + "/ready").json()
    assert ready["ready"] is True and set(ready["workers"]) == {"sim-0", "sim-1"}
    httpx.post(
        fast.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    metrics = httpx.get(fast.url + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert (
        'agentserve_frontend_requests_total{api="chat",model="qwen3-sim",status="tool_calls"}' in metrics.text
    )


def test_trace_records_and_joined_tool_events(scenario: str, tmp_path: Path) -> None:
    sink = tmp_path / "trace.jsonl"
    session = {"x-session-id": "sess-42"}
    secret = "please run echo hello SECRET-PROMPT-TEXT"
    with served({"script": scenario, "trace_sink": str(sink)}) as s:
        o = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
        first = o.chat.completions.create(
            model="m", messages=[{"role": "user", "content": secret}], tools=CHAT_TOOLS, extra_headers=session
        )
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        event = {
            "event_type": "tool_end",
            "agent_context": {"session_id": "sess-42"},
            "tool": {"tool_call_id": call.id, "status": "succeeded", "duration_ms": 12},
        }
        r = httpx.post(s.url + "/v1/agent/tool_events", json=event)
        assert r.status_code == 202 and r.json() == {"accepted": 1, "joined": 1}
        bad = httpx.post(s.url + "/v1/agent/tool_events", json={"event_type": "nope"})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    lines = [json.loads(line) for line in sink.read_text().splitlines()]
    request = next(line["request"] for line in lines if line["event_type"] == "request_end")
    assert request["api"] == "chat" and request["status"] == "tool_calls" and request["model"] == "qwen3-sim"
    assert [c["status"] for c in request["tool_calls"]] == ["dispatched"]
    assert request["worker"]["worker_id"] in ("sim-0", "sim-1") and request["ttft_ms"] is not None
    assert any(line["event_type"] == "tool_end" for line in lines)
    assert "SECRET-PROMPT-TEXT" not in sink.read_text()  # never prompt or output text


def test_prefix_drift_is_logged_and_counted(fast: Served, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="agentserve.frontend")
    o = openai.OpenAI(base_url=fast.url + "/v1", api_key="k", max_retries=0)
    session = {"x-session-id": "drifting-session"}
    question = {"role": "user", "content": "Today is 2026-11-21. Tell me about the weather in a few words."}
    first = o.chat.completions.create(model="m", messages=[question], extra_headers=session)
    answer = {"role": "assistant", "content": first.choices[0].message.content}
    edited = {
        **question,
        "content": question["content"].replace("2026-11-21", "2026-11-22"),
    }  # a volatile span
    o.chat.completions.create(
        model="m",
        messages=[edited, answer, {"role": "user", "content": "and tomorrow?"}],
        extra_headers=session,
    )
    metrics = httpx.get(fast.url + "/metrics").text
    assert 'agentserve_frontend_prefix_drift_events_total{cause="history",model="qwen3-sim"} 1.0' in metrics
    assert "prefix drift in session drifting-session" in caplog.text
    # The log shows the text around the divergence (traces never do): the date's last digit.
    assert "'before': '<|im_start|>user\\nToday is 2026-11-2'" in caplog.text
    assert "'prompt_after': '2. Tell me" in caplog.text


def test_openapi_matches_the_routes(fast: Served) -> None:
    spec = httpx.get(fast.url + "/openapi.json").json()
    paths = spec["paths"]
    for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions", "/v1/responses"):
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body["$ref"].startswith(
            "#/components/schemas/"
        )  # the real schemas: tests/unit/api/test_schema.py
        assert "422" not in paths[path]["post"]["responses"]  # our decoders answer 400, never 422
    assert "text/event-stream" in paths["/v1/messages"]["post"]["responses"]["200"]["content"]
    assert {"get", "head"} <= set(paths["/"])
    served_paths = {
        (route.path.replace(":path}", "}"), method.lower())  # type: ignore[attr-defined]
        for route in fast.app.routes
        for method in getattr(route, "methods", ()) or ()
        if route.path not in ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")  # type: ignore[attr-defined]
    }
    documented = {(path, method) for path, ops in paths.items() for method in ops}
    assert documented == served_paths
    for path, method in documented:  # every documented operation exists (no 404/405) and never 500s
        url = fast.url + path.replace("{model_id}", "qwen3-sim")
        r = httpx.request(method.upper(), url, json={})
        assert r.status_code != 405 and r.status_code < 500, (path, method, r.status_code)
        # 404 only as the resource's own answer (an unknown response id), never "no such endpoint".
        assert r.status_code != 404 or "is not an endpoint" not in r.text, (path, method)


def test_pings_keep_a_slow_stream_alive_and_a_disconnect_aborts_it(scenario: str) -> None:
    # 100 simulated seconds per real second... inverted: 0.01 makes a B200 a hundred times slower,
    # so prefill takes about half a second and each token ~0.4 s.
    settings = {"script": scenario, "sim_speedup": 0.01, "ping_interval_s": 0.05}
    with served(settings) as s:
        body = {
            "model": "m",
            "max_tokens": 50,
            "stream": True,
            "messages": [{"role": "user", "content": "hi " * 50}],
        }
        comments = events = 0
        started = False
        with httpx.stream("POST", s.url + "/v1/messages", json=body, timeout=20) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["x-accel-buffering"] == "no"
            for line in r.iter_lines():
                if line == PING_COMMENT.decode().strip():
                    assert not started
                    comments += 1
                elif line == "event: message_start":
                    started = True
                elif line == "event: ping" and started:
                    events += 1
                    if events >= 3:
                        break  # hang up mid-generation
        assert comments >= 3, "SSE comments keep the connection alive before message_start"
        engines = s.backend.engines.values()
        for _ in range(200):
            if sum(e.load().requests_aborted for e in engines) >= 1:
                break
            time.sleep(0.025)
        assert sum(e.load().requests_aborted for e in engines) == 1
        assert sum(e.load().running for e in engines) == 0

        # Non-streaming too: a client that gives up stops the generation.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(s.url + "/v1/messages", json={**body, "stream": False}, timeout=0.3)
        for _ in range(200):
            if sum(e.load().requests_aborted for e in engines) >= 2:
                break
            time.sleep(0.025)
        assert sum(e.load().requests_aborted for e in engines) == 2
