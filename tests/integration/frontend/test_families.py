"""A tool loop for every model family, through each API's official SDK.

The sim speaks the family's raw format (the prompt tests' canonical outputs: reasoning, then a call;
then an answer). Each turn must come back parsed (reasoning and the call, arguments exact), and the
second turn's prompt must extend the first turn's prompt + output token for token: its cache hits
cover all of turn 1 (the round trip law of design.md, measured as the KV cache sees it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from prompt_cases import FAMILY_NAMES, KWARGS, TOOLS, cases
from sim_scenarios import reusable, write_scenario
from stack import Served, served

from agentserve.conversation import Reasoning

ANSWER = "Paris is 18C and Rome is 21C."
QUESTION = "What is the weather in Paris?"
RUN_ON = "The tool returned 18C. HALLUCINATED."


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Served]]:
    name: str = request.param
    by_name = {c.name: c for c in cases(name)}
    # Past its terminator the model would go on (invent the tool's result, call again): the engine must
    # stop at the family's end-of-turn token, so none of that reaches the parser (issue 15 item 1).
    call, answer = by_name["call"].raw, by_name["answer"].raw
    scenario = write_scenario(
        tmp_path_factory.mktemp(name), [{"turn": 1, "output": call + RUN_ON + call}], answer + RUN_ON
    )
    with served({"script": scenario, "family": name, "model": f"{name}-sim"}) as s:
        yield name, s


def expected(name: str) -> tuple[list[str], dict[str, Any]]:
    """Reasoning segments and the call's arguments of the family's canonical call turn."""
    call = {c.name: c for c in cases(name)}["call"]
    reasoning = [p.text for p in call.parts if isinstance(p, Reasoning)]
    (tool_call,) = call.calls
    assert tool_call.name == "get_weather"
    return reasoning, json.loads(tool_call.arguments)


ANTHROPIC_TOOLS = [
    {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in TOOLS
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }
    for t in TOOLS
]
RESPONSES_TOOLS = [
    {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
    for t in TOOLS
]


def test_anthropic_tool_loop(family: tuple[str, Served]) -> None:
    name, s = family
    c = anthropic.Anthropic(base_url=s.url, api_key="k", max_retries=0)
    reasoning, arguments = expected(name)
    # No `thinking`: the canonical outputs are written for each template's default (with thinking on,
    # some templates open the think block themselves and the model would not write `<think>`).
    request: dict[str, Any] = {"model": "claude-x", "max_tokens": 500, "tools": ANTHROPIC_TOOLS}
    if KWARGS.get(name, {}).get("enable_thinking"):
        request["thinking"] = {"type": "adaptive"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    with c.messages.stream(messages=messages, **request) as stream:
        first = stream.get_final_message()
    assert [b.type for b in first.content] == ["thinking"] * len(reasoning) + ["tool_use"], name
    assert [b.thinking for b in first.content if b.type == "thinking"] == reasoning
    call = first.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == arguments
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18C"}]},
    ]
    second = c.messages.create(messages=messages, **request)
    assert [b.text for b in second.content if b.type == "text"] == [ANSWER]
    turn1 = first.usage.input_tokens + first.usage.cache_read_input_tokens + first.usage.output_tokens
    assert second.usage.cache_read_input_tokens >= reusable(turn1), name


def test_chat_tool_loop(family: tuple[str, Served]) -> None:
    name, s = family
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
    reasoning, arguments = expected(name)
    extra = {"chat_template_kwargs": KWARGS[name]} if name in KWARGS else {}
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    first = c.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS, extra_body=extra)
    message = first.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == ("\n\n".join(reasoning) or None), name
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == arguments
    # Sent back as pi does: reasoning dropped, arguments re-serialised; the call memory restores both.
    compact = json.dumps(json.loads(call.function.arguments), separators=(",", ":"))
    messages += [
        {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": compact},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "18C"},
    ]
    second = c.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS, extra_body=extra)
    assert second.choices[0].message.content == ANSWER
    assert first.usage is not None and second.usage is not None
    turn1 = first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= reusable(turn1), name


def test_responses_tool_loop(family: tuple[str, Served]) -> None:
    name, s = family
    reasoning, arguments = expected(name)
    # A template whose canonical output needs thinking on gets it from an effort, as Codex asks.
    extra = {"reasoning": {"effort": "medium"}} if KWARGS.get(name, {}).get("enable_thinking") else {}
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": QUESTION}]
    first = c.responses.create(model="m", input=items, tools=RESPONSES_TOOLS, store=False, extra_body=extra)
    assert [i.type for i in first.output] == ["reasoning"] * len(reasoning) + ["function_call"], name
    assert [i.content[0].text for i in first.output if i.type == "reasoning"] == reasoning
    call = first.output[-1]
    assert call.type == "function_call"
    assert call.name == "get_weather" and json.loads(call.arguments) == arguments
    items += [i.model_dump(exclude_none=True) for i in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "18C"})
    second = c.responses.create(model="m", input=items, tools=RESPONSES_TOOLS, store=False, extra_body=extra)
    assert second.output_text == ANSWER
    assert first.usage is not None and second.usage is not None
    turn1 = first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= reusable(turn1), name


def test_gpt_oss_ten_turn_tool_loop(tmp_path_factory: pytest.TempPathFactory) -> None:
    """gpt-oss (the gpt-oss example's family) on the sim: ten tool calls in a row, each turn written
    as a model that does not stop by itself would write it (the call, then an invented result and a
    second call). Every turn must end at `<|call|>` with exactly its own call; then the answer."""
    cities = [f"City{i}" for i in range(1, 11)]

    def call(city: str) -> str:
        return (
            f"<|channel|>analysis<|message|>Check {city}.<|end|><|start|>assistant<|channel|>commentary "
            f'to=functions.get_weather <|constrain|>json<|message|>{{"city": "{city}"}}<|call|>'
        )

    rules = [
        {"turn": i + 1, "output": call(city) + RUN_ON + call("Nowhere")} for i, city in enumerate(cities)
    ]
    final = f"<|channel|>final<|message|>{ANSWER}<|return|>" + RUN_ON
    scenario = write_scenario(tmp_path_factory.mktemp("gpt-oss-loop"), rules, final)
    with served({"script": scenario, "family": "gpt-oss", "model": "gpt-oss-sim"}) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
        for city in cities:
            reply = c.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
            message = reply.choices[0].message
            assert reply.choices[0].finish_reason == "tool_calls"
            assert message.tool_calls is not None and len(message.tool_calls) == 1, city
            tool_call = message.tool_calls[0]
            assert json.loads(tool_call.function.arguments) == {"city": city}
            assert "HALLUCINATED" not in (message.content or "")
            messages += [
                {"role": "assistant", "content": message.content, "tool_calls": [tool_call.model_dump()]},
                {"role": "tool", "tool_call_id": tool_call.id, "content": f"{city}: 18C"},
            ]
        last = c.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
        assert last.choices[0].message.content == ANSWER
        assert last.choices[0].finish_reason == "stop"
