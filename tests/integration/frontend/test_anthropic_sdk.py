"""`/v1/messages`, `/count_tokens` and `/v1/models` through the official `anthropic` SDK over loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from sim_scenarios import (
    ANTHROPIC_TOOLS,
    BLOCK,
    QWEN3_DEFAULT,
    QWEN3_RULES,
    TRAILING_WORDS,
    full_blocks,
    reusable,
    write_scenario,
)
from stack import Served, served

from agentserve.api import anthropic as codec


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_scenario(tmp_path_factory.mktemp("anthropic"), QWEN3_RULES, QWEN3_DEFAULT)


@pytest.fixture(scope="module")
def qwen(scenario: str) -> Iterator[Served]:
    with served({"script": scenario}) as s:
        yield s


def client(s: Served, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.url, api_key="test-key", max_retries=0, **kw)


def dump(content: list[Any]) -> list[dict[str, Any]]:
    """The SDK's decoded blocks as the next request's history (what a harness sends back)."""
    return [block.model_dump(exclude_none=True) for block in content]


REQUEST: dict[str, Any] = {
    "model": "claude-harness-name",
    "max_tokens": 4000,
    "tools": ANTHROPIC_TOOLS,
    "thinking": {"type": "adaptive"},
}


def counted(c: anthropic.Anthropic, messages: list[dict[str, Any]]) -> int:
    return c.messages.count_tokens(
        messages=messages, **{k: v for k, v in REQUEST.items() if k != "max_tokens"}
    ).input_tokens


def prompt_tokens(usage: Any) -> int:
    return int(usage.input_tokens + usage.cache_read_input_tokens + (usage.cache_creation_input_tokens or 0))


def test_streamed_tool_loop_keeps_the_cache_and_counts_exactly(qwen: Served) -> None:
    c = client(qwen)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "please run echo hello"}]
    with c.messages.stream(messages=messages, **REQUEST) as stream:
        kinds = [event.type for event in stream]
        first = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
    thinking, text, call = first.content
    assert thinking.type == "thinking" and thinking.thinking == "I should run the command."
    assert qwen.frontend.ctx.signer.verify_thinking(thinking.thinking, thinking.signature)
    assert text.type == "text" and text.text == "Let me run it."
    assert call.type == "tool_use" and call.name == "Bash" and call.input == {"command": "echo hello"}
    assert call.id.startswith("toolu_")
    assert first.stop_reason == "tool_use"
    assert first.model == "claude-harness-name"
    assert prompt_tokens(first.usage) == counted(c, messages)
    assert first.usage.output_tokens > 0

    total = prompt_tokens(first.usage) + first.usage.output_tokens
    messages += [
        {"role": "assistant", "content": dump(first.content)},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "hello"}]},
    ]
    with c.messages.stream(messages=messages, **REQUEST) as stream:
        second = stream.get_final_message()
    assert [b.type for b in second.content] == ["thinking", "text"]
    assert second.content[1].text == "done."
    assert second.stop_reason == "end_turn"
    # The whole first turn (prompt + the model's own output, thinking included) is reused.
    assert second.usage.cache_read_input_tokens >= reusable(total)
    assert prompt_tokens(second.usage) == counted(c, messages)


def test_thinking_blocks_stay_separate_and_round_trip_with_their_signatures(qwen: Served) -> None:
    c = client(qwen)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "INTERLEAVE the work"}]
    first = c.messages.create(messages=messages, **REQUEST)
    assert [b.type for b in first.content] == ["thinking", "tool_use", "thinking", "tool_use"]
    signer = qwen.frontend.ctx.signer
    for block in first.content:
        if block.type == "thinking":
            assert signer.verify_thinking(block.thinking, block.signature)
    assert [b.thinking for b in first.content if b.type == "thinking"] == [
        "First read the file.",
        "Then run the tests.",
    ]
    calls = [b for b in first.content if b.type == "tool_use"]
    messages += [
        {"role": "assistant", "content": dump(first.content)},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "ok"} for b in calls],
        },
    ]
    second = c.messages.create(messages=messages, **REQUEST)
    # Both thinking blocks re-rendered in place, byte for byte: the cache covers all of turn 1.
    assert second.usage.cache_read_input_tokens >= reusable(
        prompt_tokens(first.usage) + first.usage.output_tokens
    )


def test_stream_and_non_stream_give_the_same_message(qwen: Served) -> None:
    c = client(qwen)
    messages = [{"role": "user", "content": "INTERLEAVE again"}]
    whole = c.messages.create(messages=messages, **REQUEST)
    with c.messages.stream(messages=messages, **REQUEST) as stream:
        streamed = stream.get_final_message()

    def meaning(m: anthropic.types.Message) -> list[Any]:
        return [
            (b.type, getattr(b, "thinking", None), getattr(b, "name", None), getattr(b, "input", None))
            for b in m.content
        ]

    assert meaning(whole) == meaning(streamed)
    assert whole.stop_reason == streamed.stop_reason == "tool_use"
    assert whole.usage.output_tokens == streamed.usage.output_tokens


def test_claude_code_shaped_request_with_betas_system_messages_and_metadata(qwen: Served) -> None:
    c = client(qwen)
    body = {
        "model": "capture-model",
        "max_tokens": 32000,
        "system": [
            {
                "type": "text",
                "text": "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=sdk-cli;",
            },
            {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "please run echo hello", "cache_control": {"type": "ephemeral"}}
                ],
            },
            {"role": "system", "content": "Available agent types: general-purpose"},
        ],
        "tools": ANTHROPIC_TOOLS,
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": '{"device_id":"ab","account_uuid":"","session_id":"3f2b8c1e-6a4d"}'},
    }
    message = c.beta.messages.create(  # POST /v1/messages?beta=true
        **body,
        betas=["claude-code-20250219", "interleaved-thinking-2025-05-14", "some-future-beta-2031-01-01"],
        extra_headers={"X-Claude-Code-Session-Id": "3f2b8c1e-6a4d", "x-app": "cli"},
        timeout=30,  # the SDK refuses a non-streaming 32000-token call without one
    )
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert (
        "some-future-beta-2031-01-01" in qwen.frontend_betas_seen()
        if hasattr(qwen, "frontend_betas_seen")
        else True
    )


def test_stop_sequences_end_the_turn_and_are_reported(qwen: Served) -> None:
    c = client(qwen)
    message = c.messages.create(
        model="m",
        max_tokens=200,
        messages=[{"role": "user", "content": "STOPME"}],
        stop_sequences=["STOP", "never"],
    )
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == "STOP"
    text = "".join(b.text for b in message.content if b.type == "text")
    assert text.startswith("alpha beta") and "gamma" not in text


def test_max_tokens_zero_prefills_only(qwen: Served) -> None:
    c = client(qwen)
    messages = [{"role": "user", "content": "warm the cache for this fairly long question " * 8}]
    warm = c.messages.create(model="m", max_tokens=0, messages=messages)
    assert warm.content == [] and warm.stop_reason == "max_tokens" and warm.usage.output_tokens == 0
    answer = c.messages.create(model="m", max_tokens=100, messages=messages)
    assert answer.usage.cache_read_input_tokens >= reusable(prompt_tokens(warm.usage)) > 0


def test_omitted_thinking_travels_sealed_and_comes_back_whole(qwen: Served) -> None:
    c = client(qwen)
    request = {**REQUEST, "thinking": {"type": "adaptive", "display": "omitted"}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "please run echo hello, omitted"}]
    first = c.messages.create(messages=messages, **request)
    thinking = first.content[0]
    assert thinking.type == "thinking" and thinking.thinking == "" and thinking.signature
    call = first.content[-1]
    assert call.type == "tool_use"
    messages += [
        {"role": "assistant", "content": dump(first.content)},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "hello"}]},
    ]
    second = c.messages.create(messages=messages, **request)
    assert second.usage.cache_read_input_tokens >= reusable(
        prompt_tokens(first.usage) + first.usage.output_tokens
    )


def test_models_in_anthropic_shape(qwen: Served) -> None:
    c = client(qwen)
    page = c.models.list()
    assert [m.id for m in page.data] == ["qwen3-sim"]
    assert page.data[0].type == "model"
    assert c.models.retrieve("qwen3-sim").id == "qwen3-sim"
    with pytest.raises(anthropic.NotFoundError) as info:
        c.models.retrieve("no-such-model")
    assert info.value.body["error"]["type"] == "not_found_error"


# -- shared prefixes across conversations ----------------------------------------------------------

SYSTEM_TEXT = " ".join(
    f"Rule {i}: keep changes small, run the tests, and explain what you did." for i in range(120)
)
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.{}; cc_entrypoint=cli;"
MANY_TOOLS = [
    {
        "name": f"Tool{i}",
        "description": f"Tool number {i} does one careful thing with the repository. " * 3,
        "input_schema": {
            "type": "object",
            "properties": {"arg": {"type": "string", "description": "the input"}},
        },
    }
    for i in range(20)
]


def claude_code_body(billing_suffix: str, prompt: str, session: str) -> dict[str, Any]:
    return {
        "model": "capture-model",
        "max_tokens": 32000,
        "system": [
            {
                "type": "text",
                "text": BILLING.format(billing_suffix),
            },
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": SYSTEM_TEXT, "cache_control": {"type": "ephemeral"}},
        ],
        "tools": MANY_TOOLS,
        "messages": [{"role": "user", "content": prompt}],
        "metadata": {"user_id": f'{{"device_id":"d","account_uuid":"","session_id":"{session}"}}'},
        "thinking": {"type": "adaptive"},
    }


def shared_prefix_tokens(s: Served, a: dict[str, Any], b: dict[str, Any]) -> int:
    first = s.frontend.render(codec.decode_messages(a)).token_ids
    second = s.frontend.render(codec.decode_messages(b)).token_ids
    n = 0
    while n < min(len(first), len(second)) and first[n] == second[n]:
        n += 1
    return n


@pytest.mark.parametrize("strip", [True, False], ids=["stripped", "billing-line-kept"])
def test_two_claude_code_conversations_share_their_system_and_tools_prefix(
    scenario: str, strip: bool
) -> None:
    one = claude_code_body("d49", "first conversation: list the files", "11111111-aaaa")
    two = claude_code_body("7be", "second conversation: run the tests", "22222222-bbbb")
    with served({"script": scenario, "strip_anthropic_preamble": strip}) as s:
        c = client(s)
        c.messages.create(**one, extra_headers={"X-Claude-Code-Session-Id": "11111111-aaaa"}, timeout=30)
        second = c.messages.create(
            **two, extra_headers={"X-Claude-Code-Session-Id": "22222222-bbbb"}, timeout=30
        )
        shared = shared_prefix_tokens(s, one, two)
    if strip:
        assert shared > 1500  # the whole system + tools prefix
        assert second.usage.cache_read_input_tokens >= full_blocks(shared)
    else:
        # The billing line differs within the first block: nothing is shared (what stripping fixes).
        assert shared < BLOCK
        assert second.usage.cache_read_input_tokens == 0


# -- streaming tool dispatch -----------------------------------------------------------------------


def timed_events(c: anthropic.Anthropic) -> list[tuple[float, Any]]:
    out: list[tuple[float, Any]] = []
    with c.messages.stream(
        model="m",
        max_tokens=2000,
        tools=ANTHROPIC_TOOLS,
        messages=[{"role": "user", "content": "DISPATCH now"}],
    ) as stream:
        for event in stream:
            out.append((time.monotonic(), event))
    return out


@pytest.mark.parametrize("dispatch", [True, False], ids=["dispatch-on", "dispatch-off"])
def test_the_tool_use_block_closes_while_the_model_still_writes(scenario: str, dispatch: bool) -> None:
    # Simulated time at twice a B200's speed: the 200 words after the call take ~0.4 s to decode.
    settings = {"script": scenario, "sim_speedup": 2.0, "enable_streaming_tool_dispatch": dispatch}
    with served(settings) as s:
        events = timed_events(client(s))
    starts = {e.index: e.content_block.type for _, e in events if e.type == "content_block_start"}
    tool_index = next(i for i, kind in starts.items() if kind == "tool_use")
    tool_stop = next(t for t, e in events if e.type == "content_block_stop" and e.index == tool_index)
    end = next(t for t, e in events if e.type == "message_stop")
    later_text = [
        t
        for t, e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta" and t > tool_stop
    ]
    words = "".join(
        e.delta.text for _, e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert words.split() == ["word"] * TRAILING_WORDS
    # Relative to the stream's own length, not absolute times: a loaded CI machine stretches both.
    span = end - events[0][0]
    if dispatch:
        assert end - tool_stop > 0.5 * span, "the call was dispatched only at the end of the turn"
        assert len(later_text) >= 5  # the model kept decoding after the call went out
    else:
        assert end - tool_stop < 0.25 * span, "dispatch is off: the call waits for the end of the turn"
