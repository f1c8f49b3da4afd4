"""`/v1/chat/completions`, `/v1/responses` and `/v1/models` through the official `openai` SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from sim_scenarios import CHAT_TOOLS, QWEN3_DEFAULT, QWEN3_RULES, RESPONSES_TOOLS, reusable, write_scenario
from stack import Served, served

from agentserve.frontend.http import ApiKeys


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_scenario(tmp_path_factory.mktemp("openai"), QWEN3_RULES, QWEN3_DEFAULT)


@pytest.fixture(scope="module")
def qwen(scenario: str) -> Iterator[Served]:
    # Two keys: the call memory is scoped per key, and one test shows it.
    with served({"script": scenario}, keys=ApiKeys(["key-a", "key-b"])) as s:
        yield s


def client(s: Served, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0)


# -- Chat Completions -----------------------------------------------------------------------------

PI_SYSTEM = {"role": "developer", "content": "You are pi, a coding agent. Current date: 2026-11-21."}


def stream_chat(c: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    """Accumulate a streamed completion the way harnesses do (tool call fragments by index)."""
    reasoning, content, calls, finish, usage = [], [], {}, None, None
    for chunk in c.chat.completions.create(
        model="pi-model",
        messages=messages,
        tools=CHAT_TOOLS,
        stream=True,
        stream_options={"include_usage": True},
        **kw,
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            extra = delta.model_extra or {}
            if extra.get("reasoning_content"):
                assert extra["reasoning"] == extra["reasoning_content"]  # both names, same text
                reasoning.append(extra["reasoning_content"])
            if delta.content:
                content.append(delta.content)
            for call in delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
                if call.id:
                    slot["id"] = call.id
                if call.function and call.function.name:
                    slot["name"] = call.function.name
                if call.function and call.function.arguments:
                    slot["arguments"] += call.function.arguments
            if choice.finish_reason:
                finish = choice.finish_reason
    return {
        "reasoning": "".join(reasoning),
        "content": "".join(content),
        "calls": [calls[i] for i in sorted(calls)],
        "finish": finish,
        "usage": usage,
    }


def pi_history(turn: dict[str, Any], result: str, *, rewrite_ids: bool) -> list[dict[str, Any]]:
    """What pi / OpenClaw send back: no reasoning, arguments re-serialised compactly, and (OpenClaw)
    call ids with their underscore stripped."""
    calls = []
    for call in turn["calls"]:
        call_id = call["id"].replace("_", "") if rewrite_ids else call["id"]
        arguments = json.dumps(json.loads(call["arguments"]), separators=(",", ":"))
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": call["name"], "arguments": arguments}}
        )
    return [
        {"role": "assistant", "content": turn["content"], "tool_calls": calls},
        *({"role": "tool", "tool_call_id": c["id"], "content": result} for c in calls),
    ]


@pytest.mark.parametrize("rewrite_ids", [False, True], ids=["pi", "openclaw"])
def test_chat_tool_loop_restores_what_the_client_dropped(qwen: Served, rewrite_ids: bool) -> None:
    c = client(qwen)
    messages: list[dict[str, Any]] = [
        PI_SYSTEM,
        {"role": "user", "content": [{"type": "text", "text": f"please run echo hello ({rewrite_ids})"}]},
    ]
    first = stream_chat(c, messages)
    assert first["reasoning"] == "I should run the command."
    assert first["content"] == "Let me run it."
    assert [(x["name"], json.loads(x["arguments"])) for x in first["calls"]] == [
        ("Bash", {"command": "echo hello"})
    ]
    assert first["calls"][0]["id"].startswith("call_")
    assert first["finish"] == "tool_calls"
    usage = first["usage"]
    assert usage is not None and usage.completion_tokens > 0
    assert usage.completion_tokens_details.reasoning_tokens > 0
    total = usage.prompt_tokens + usage.completion_tokens

    messages += pi_history(first, "hello", rewrite_ids=rewrite_ids)
    second = stream_chat(c, messages)
    assert second["content"] == "done." and second["finish"] == "stop"
    # The call memory put the turn back exactly as the model wrote it (reasoning, argument text, ids).
    assert second["usage"].prompt_tokens_details.cached_tokens >= reusable(total)

    # Another API key is another scope: its history is taken as sent, so the cache breaks there.
    other = stream_chat(client(qwen, "key-b"), messages)
    assert other["usage"].prompt_tokens_details.cached_tokens < reusable(total)


def test_chat_non_stream(qwen: Served) -> None:
    completion = client(qwen).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "please run echo hello, once"}], tools=CHAT_TOOLS
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    extra = choice.message.model_extra or {}
    assert extra["reasoning_content"] == extra["reasoning"] == "I should run the command."
    assert choice.message.content == "Let me run it."
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.function.name == "Bash" and json.loads(call.function.arguments) == {"command": "echo hello"}
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    assert completion.model == "m"


def sse_events(raw: str) -> list[tuple[str | None, str]]:
    out = []
    for frame in raw.split("\n\n"):
        name, data = None, []
        for line in frame.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            out.append((name, "\n".join(data)))
    return out


def test_chat_tool_call_dispatch_event_comes_with_the_complete_call(qwen: Served) -> None:
    body = {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": "INTERLEAVE via chat"}],
        "tools": CHAT_TOOLS,
    }
    r = httpx.post(qwen.url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer key-a"})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    dispatched = [json.loads(data) for name, data in events if name == "tool_call_dispatch"]
    assert [d["tool_call"]["function"]["name"] for d in dispatched] == ["Read", "Bash"]
    assert all(d["choice_index"] == 0 for d in dispatched)
    assert json.loads(dispatched[0]["tool_call"]["function"]["arguments"]) == {"path": "a.py"}
    finish_at = next(i for i, (_, d) in enumerate(events) if '"finish_reason":"tool_calls"' in d)
    last_dispatch = max(i for i, (name, _) in enumerate(events) if name == "tool_call_dispatch")
    assert last_dispatch < finish_at
    assert events[-1] == (None, "[DONE]")


# -- Responses ------------------------------------------------------------------------------------

CODEX_INPUT: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "please run echo hello (codex)"}],
    },
]


def stream_response(c: openai.OpenAI, items: list[dict[str, Any]], **kw: Any) -> tuple[list[str], Any]:
    kinds, final = [], None
    for event in c.responses.create(
        model="codex-model", input=items, tools=RESPONSES_TOOLS, stream=True, **kw
    ):
        kinds.append(event.type)
        if event.type in ("response.completed", "response.failed", "response.incomplete"):
            final = event.response
    return kinds, final


def test_responses_store_false_round_trip(qwen: Served) -> None:
    c = client(qwen)
    kw = {"store": False, "include": ["reasoning.encrypted_content"], "reasoning": {"summary": "auto"}}
    kinds, first = stream_response(c, CODEX_INPUT, **kw)
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [item.type for item in first.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = first.output
    assert reasoning.content[0].text == "I should run the command." and reasoning.encrypted_content
    assert message.content[0].text == "Let me run it."
    assert call.name == "Bash" and json.loads(call.arguments) == {"command": "echo hello"}
    # The call was dispatched (its output_item.done) before the response completed.
    assert kinds.index("response.output_item.done") < kinds.index("response.completed")
    usage = first.usage
    assert usage.output_tokens_details.reasoning_tokens > 0
    total = usage.input_tokens + usage.output_tokens

    items = [
        *CODEX_INPUT,
        *(item.model_dump(exclude_none=True) for item in first.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": "hello"},
    ]
    _, second = stream_response(c, items, **kw)
    assert [item.type for item in second.output] == ["reasoning", "message"]
    assert second.output[1].content[0].text == "done."
    assert second.usage.input_tokens_details.cached_tokens >= reusable(total)


def test_responses_previous_response_id(qwen: Served) -> None:
    c = client(qwen)
    first = c.responses.create(model="m", input=CODEX_INPUT, tools=RESPONSES_TOOLS, store=True)
    call = first.output[-1]
    assert call.type == "function_call"
    follow = [{"type": "function_call_output", "call_id": call.call_id, "output": "hello"}]
    second = c.responses.create(model="m", input=follow, previous_response_id=first.id, tools=RESPONSES_TOOLS)
    assert second.output_text == "done."
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens_details.cached_tokens >= reusable(
        first.usage.input_tokens + first.usage.output_tokens
    )
    with pytest.raises(openai.BadRequestError) as info:
        c.responses.create(model="m", input=follow, previous_response_id="resp_unknown")
    assert info.value.code == "previous_response_not_found"


# -- models ---------------------------------------------------------------------------------------


def test_models_in_openai_shape_and_the_codex_catalog(qwen: Served) -> None:
    c = client(qwen)
    assert [m.id for m in c.models.list()] == ["qwen3-sim"]
    assert c.models.retrieve("qwen3-sim").owned_by == "agentserve"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("nope")
    listed = httpx.get(qwen.url + "/v1/models", headers={"authorization": "Bearer key-a"}).json()
    catalog = httpx.get(
        qwen.url + "/backend-api/codex/models", headers={"authorization": "Bearer key-a"}
    ).json()
    assert listed["models"] == catalog["models"]
    info = catalog["models"][0]
    assert info["slug"] == "qwen3-sim"
    assert info["truncation_policy"] == {"mode": "tokens", "limit": 10000}
    assert info["apply_patch_tool_type"] is None  # Codex 0.169.0 refuses "function" (docs/codex.md)
    assert info["context_window"] == 131072 and info["supports_reasoning_summaries"] is True
