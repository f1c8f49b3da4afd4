from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from agentserve.api.chat import REASONING_SEPARATOR, ChatStreamEncoder, build_chat_completion, decode_chat
from agentserve.api.errors import InvalidRequestError
from agentserve.api.memory import CallMemory
from agentserve.api.turn import TurnAccumulator
from agentserve.conversation import Image, Message, Reasoning, Text, ToolCall, ToolCallEnd, ToolResult, Usage

from .harness_bodies import PI_TOOLS, openclaw_turn1, pi_turn1
from .helpers import Recorder, encode_all, openai_client, parse_sse, turn

INTERLEAVED = (
    ("r", "Need the listing first."),
    ("call", "call_0a1b2c3d4e5f60718293a4b5", "bash", '{"command": "ls -la"}'),
    ("r", "And the readme."),
    ("call", "call_9f8e7d6c5b4a39281706f5e4", "read", '{"path": "README.md"}'),
)


def encode(events: list[Any], **kwargs: Any) -> bytes:
    encoder = ChatStreamEncoder("qwen3", completion_id="chatcmpl-1", created=1761000000, **kwargs)
    return encoder.start() + encode_all(encoder, events)


def sdk_chunks(raw: bytes) -> list[ChatCompletionChunk]:
    client = openai_client(Recorder(raw))
    stream = client.chat.completions.create(
        model="qwen3", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    return list(stream)


def sdk_final(raw: bytes) -> Any:
    client = openai_client(Recorder(raw))
    with client.chat.completions.stream(model="qwen3", messages=[{"role": "user", "content": "hi"}]) as s:
        return s.get_final_completion()


def test_chunks_are_valid_and_ordered() -> None:
    raw = encode(turn(*INTERLEAVED, ("t", "Done."), finish="tool_calls"), include_usage=True)
    frames = parse_sse(raw)
    assert frames[-1] == (None, "[DONE]")
    chunks = [d for name, d in frames[:-1] if name is None]
    for d in chunks:
        ChatCompletionChunk.model_validate(d)  # the SDK's schema, strictly
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = [d for d in deltas if "reasoning_content" in d]
    assert all(d["reasoning_content"] == d["reasoning"] for d in reasoning)
    flat = "".join(d["reasoning_content"] for d in reasoning)
    assert flat == INTERLEAVED[0][1] + REASONING_SEPARATOR + INTERLEAVED[2][1]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert [(c["index"], c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        (0, INTERLEAVED[1][1], "bash", INTERLEAVED[1][3]),
        (1, INTERLEAVED[3][1], "read", INTERLEAVED[3][3]),
    ]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "total_tokens": 120,
        "prompt_tokens_details": {"cached_tokens": 60},
        "completion_tokens_details": {"reasoning_tokens": 5},
    }


def test_dispatch_side_channel_fires_at_tool_call_end_with_the_complete_call() -> None:
    encoder = ChatStreamEncoder("m")
    encoder.start()
    events = turn(
        ("t", "ok"), ("call", "call_77", "bash", '{"command": "echo hello"}'), finished=False, size=2
    )
    before = b"".join(encoder.feed(e) for e in events[:-1])
    assert b"tool_call_dispatch" not in before
    assert isinstance(events[-1], ToolCallEnd)
    frames = parse_sse(encoder.feed(events[-1]))
    assert frames[0][0] == "tool_call_dispatch"
    assert frames[0][1]["choice_index"] == 0
    assert frames[0][1]["tool_call"] == {
        "index": 0,
        "id": "call_77",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "echo hello"}'},
    }
    assert frames[1][0] is None  # then the normal chunk
    off = ChatStreamEncoder("m", dispatch=False)
    assert b"tool_call_dispatch" not in encode_all(off, events)


def test_sdk_iteration_and_accumulation_survive_the_side_channel() -> None:
    raw = encode(turn(*INTERLEAVED, finish="tool_calls"), include_usage=True)
    chunks = sdk_chunks(raw)
    assert all(isinstance(c.choices, list) for c in chunks)
    final = sdk_final(raw)
    message = final.choices[0].message
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        (INTERLEAVED[1][1], "bash", INTERLEAVED[1][3]),
        (INTERLEAVED[3][1], "read", INTERLEAVED[3][3]),
    ]
    extra = message.model_extra or {}
    assert extra["reasoning_content"] == extra["reasoning"] == "Need the listing first.\n\nAnd the readme."
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.usage.prompt_tokens_details.cached_tokens == 60
    assert final.usage.completion_tokens_details.reasoning_tokens == 5


def test_streamed_arguments_index_every_fragment_and_name_only_the_first() -> None:
    raw = encode(turn(*INTERLEAVED, finish="tool_calls", size=4), stream_tool_arguments=True)
    chunk_deltas = [d["choices"][0]["delta"] for n, d in parse_sse(raw)[:-1] if n is None and d["choices"]]
    deltas = [d["tool_calls"][0] for d in chunk_deltas if "tool_calls" in d]
    firsts = [d for d in deltas if "id" in d]
    assert [(d["index"], d["type"], d["function"]["name"], d["function"]["arguments"]) for d in firsts] == [
        (0, "function", "bash", ""),
        (1, "function", "read", ""),
    ]
    rest = [d for d in deltas if "id" not in d]
    assert all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in rest)
    assert "".join(d["function"]["arguments"] for d in deltas if d["index"] == 0) == INTERLEAVED[1][3]
    final = sdk_final(raw)
    assert [c.function.arguments for c in final.choices[0].message.tool_calls] == [
        INTERLEAVED[1][3],
        INTERLEAVED[3][3],
    ]


def test_failed_calls() -> None:
    raw = encode(turn(("t", "Try: "), ("bad", "call_x", "bash", '{"comm', "<tool_call>{bad")))
    final = sdk_final(raw)
    assert final.choices[0].message.content == "Try: <tool_call>{bad"
    assert final.choices[0].message.tool_calls in (None, [])
    assert final.choices[0].finish_reason == "stop"
    live = encode(turn(("bad", "call_x", "bash", '{"comm', "raw")), stream_tool_arguments=True)
    with pytest.raises(openai.APIError):
        sdk_chunks(live)
    chunks = sdk_chunks(encode(turn(("cut", "call_c", "bash", '{"comm'), finish="length")))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == '{"comm' and not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_error_finish_raises_in_sdk() -> None:
    with pytest.raises(openai.APIError):
        sdk_chunks(encode(turn(("t", "x"), finish="error")))


def test_non_stream_matches_stream() -> None:
    events = turn(*INTERLEAVED, ("t", "Done."), finish="tool_calls")
    body = build_chat_completion(events, model="qwen3", completion_id="chatcmpl-1", created=1)
    parsed = ChatCompletion.model_validate(body)
    streamed = sdk_final(encode(events))
    assert parsed.choices[0].message.content == streamed.choices[0].message.content == "Done."
    assert [c.model_dump() for c in parsed.choices[0].message.tool_calls] == [
        c.model_dump(exclude={"function": {"parsed_arguments"}, "index": True})
        for c in streamed.choices[0].message.tool_calls
    ]
    assert body["choices"][0]["message"]["reasoning_content"] == "Need the listing first.\n\nAnd the readme."
    client = openai_client(Recorder(body))
    got = client.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "x"}])
    assert got.choices[0].finish_reason == "tool_calls" and got.usage.prompt_tokens == 100
    plain = build_chat_completion(turn(("t", "hi")), model="m")
    assert plain["choices"][0]["message"]["reasoning_content"] is None
    assert "tool_calls" not in plain["choices"][0]["message"]


# --------------------------------------------------------------------------------------------------
# Round trips: what pi and OpenClaw send back


def _history_after(events: list[Any], rewrite_ids: bool = False) -> tuple[list[dict[str, Any]], Message]:
    final = sdk_final(encode(events))
    msg = final.choices[0].message
    calls = []
    for c in msg.tool_calls:
        call_id = c.id.replace("_", "") if rewrite_ids else c.id
        compact = json.dumps(json.loads(c.function.arguments), separators=(",", ":"))  # clients re-serialise
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": c.function.name, "arguments": compact}}
        )
    history = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": msg.content, "tool_calls": calls},  # reasoning dropped
        *({"role": "tool", "tool_call_id": c["id"], "content": "out"} for c in calls),
    ]
    return history, TurnAccumulator().feed_all(events).message()


@pytest.mark.parametrize("rewrite_ids", [False, True])
def test_round_trip_restores_dropped_reasoning_order_and_exact_arguments(rewrite_ids: bool) -> None:
    events = turn(*INTERLEAVED, ("t", "Running both."), finish="tool_calls")
    history, original = _history_after(events, rewrite_ids)
    memory = CallMemory()
    memory.remember(original, scope="key-1")
    recorder = Recorder(encode(turn(("t", "done."))))
    with openai_client(recorder).chat.completions.stream(model="qwen3", messages=history) as s:  # type: ignore[arg-type]
        s.get_final_completion()
    req = decode_chat(recorder.requests[0], memory=memory, memory_scope="key-1")
    msgs = req.conversation.messages
    assert msgs[1] == original
    assert [type(p).__name__ for p in msgs[1].parts] == [
        "Reasoning",
        "ToolCall",
        "Reasoning",
        "ToolCall",
        "Text",
    ]
    assert req.restored == 2
    # Tool results follow our ids even when the client rewrote them.
    assert [m.parts[0].call_id for m in msgs[2:]] == [INTERLEAVED[1][1], INTERLEAVED[3][1]]  # type: ignore[union-attr]
    # Without the memory (or in another scope) the client's flat version is decoded as sent.
    plain = decode_chat(recorder.requests[0], memory=memory, memory_scope="key-2").conversation.messages[1]
    assert [type(p).__name__ for p in plain.parts] == ["Text", "ToolCall", "ToolCall"]
    assert plain.tool_calls[0].arguments == '{"command":"ls -la"}'


def test_round_trip_with_reasoning_echoed_or_edited() -> None:
    events = turn(*INTERLEAVED, finish="tool_calls")
    history, original = _history_after(events)
    memory = CallMemory()
    memory.remember(original)
    history[2]["reasoning_content"] = "Need the listing first.\n\nAnd the readme."
    assert (
        decode_chat({"model": "m", "messages": history}, memory=memory).conversation.messages[1] == original
    )
    history[2]["reasoning_content"] = "I edited this."
    edited = decode_chat({"model": "m", "messages": history}, memory=memory).conversation.messages[1]
    assert edited.parts[0] == Reasoning("I edited this.") and len(edited.parts) == 3


@pytest.mark.parametrize(
    "flat",
    [
        "Need the listing first.\n\nAnd the readme.",  # pi: our "\n\n" echoed as is
        "Need the listing first.\n\n\nAnd the readme.",  # OpenClaw joins with "\n\n\n"
        "Need the listing first.\nAnd the readme.",  # one newline
        "  Need the listing first. \t And the readme.\n",  # trimmed and re-spaced
    ],
    ids=["pi", "openclaw", "newline", "trimmed"],
)
def test_restore_accepts_any_whitespace_between_reasoning_segments(flat: str) -> None:
    events = turn(*INTERLEAVED, finish="tool_calls")
    history, original = _history_after(events, rewrite_ids=True)
    memory = CallMemory()
    memory.remember(original, scope="key-1")
    history[2]["reasoning_content"] = flat
    req = decode_chat({"model": "m", "messages": history}, memory=memory, memory_scope="key-1")
    restored = req.conversation.messages[1]
    assert restored == original
    assert [type(p).__name__ for p in restored.parts] == ["Reasoning", "ToolCall", "Reasoning", "ToolCall"]
    assert req.restored == 2
    # Still scoped: another key decodes the flat echo as sent (both segments before both calls).
    other = decode_chat({"model": "m", "messages": history}, memory=memory, memory_scope="key-2")
    assert [type(p).__name__ for p in other.conversation.messages[1].parts] == [
        "Reasoning",
        "ToolCall",
        "ToolCall",
    ]


def test_restore_of_segments_with_their_own_whitespace() -> None:
    # The model wrote its segments with surrounding newlines; a client that trims each one and joins
    # them with a blank line still means the same turn.
    events = turn(
        ("r", "\nFirst look.\n"),
        INTERLEAVED[1],
        ("r", "\n\nThen read.  "),
        INTERLEAVED[3],
        finish="tool_calls",
    )
    history, original = _history_after(events)
    memory = CallMemory()
    memory.remember(original)
    history[2]["reasoning_content"] = "First look.\n\nThen read."
    req = decode_chat({"model": "m", "messages": history}, memory=memory)
    assert req.conversation.messages[1] == original


@pytest.mark.parametrize(
    "flat",
    [
        "And the readme.\n\nNeed the listing first.",  # reordered
        "Need the listing first.",  # a segment missing
        "Need the listing first.\n\nAnd the readme.\n\nMore.",  # something added
        "Need the listing first. -- And the readme.",  # a non-whitespace separator
        "Need the  listing first.\n\nAnd the readme.",  # edited inside a segment
    ],
)
def test_restore_refuses_reasoning_that_is_not_the_same_segments(flat: str) -> None:
    events = turn(*INTERLEAVED, finish="tool_calls")
    history, original = _history_after(events)
    memory = CallMemory()
    memory.remember(original)
    history[2]["reasoning_content"] = flat
    req = decode_chat({"model": "m", "messages": history}, memory=memory)
    assert req.conversation.messages[1] != original
    assert req.conversation.messages[1].parts[0] == Reasoning(flat)
    assert req.restored == 0


# --------------------------------------------------------------------------------------------------
# Decoding


def test_pi_body() -> None:
    req = decode_chat(pi_turn1())
    conv = req.conversation
    assert conv.system == (Text("You are pi, a coding agent.\nCurrent date: 2026-11-21"),)
    assert conv.messages == (Message("user", (Text("run echo hello using your shell tool, then say done"),)),)
    assert [t.name for t in conv.tools] == ["bash", "read"]
    assert conv.tools[0].parameters == PI_TOOLS[0]["function"]["parameters"]
    o = req.options
    assert (o.max_tokens, o.stream, o.include_usage, o.reasoning.effort) == (32000, True, True, "medium")
    assert req.ignored == ("store",)


def test_openclaw_body_and_tool_loop() -> None:
    body = openclaw_turn1()
    body["messages"] += [
        {
            "role": "assistant",
            "content": "Running.",
            "tool_calls": [
                {
                    "id": "callb9072715",
                    "type": "function",
                    "function": {"name": "exec", "arguments": '{"command":"echo hello"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "callb9072715", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"}]},
    ]
    conv = decode_chat(body).conversation
    assert [m.role for m in conv.messages] == ["user", "user", "assistant", "tool", "user"]
    assert conv.messages[2].parts == (
        Text("Running."),
        ToolCall("callb9072715", "exec", '{"command":"echo hello"}'),
    )
    assert conv.messages[3].parts == (ToolResult("callb9072715", (Text("hello"),), False, "exec"),)


def test_decoding_details() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
            ]},
            {"role": "developer", "content": "late instructions"},
            {"role": "assistant", "content": None, "reasoning": "via the vLLM name",
             "function_call": {"name": "f", "arguments": "{}"}},
            {"role": "function", "name": "f", "content": "result"},
        ],
        "functions": [{"name": "f", "parameters": {"type": "object"}}],
        "function_call": {"name": "f"},
        "stop": "END",
        "max_tokens": 50,
        "temperature": 0.5,
        "top_k": -1,
        "seed": 7,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        "chat_template_kwargs": {"enable_thinking": False},
        "logprobs": False,
    }  # fmt: skip
    req = decode_chat(body)
    conv = req.conversation
    assert conv.system == (Text("a"), Text("b"))
    assert conv.messages[0].parts == (Text("see"), Image("image/png", "iVBOR"), Image(url="https://x/y.png"))
    assert conv.messages[1] == Message("system", (Text("late instructions"),))
    call = conv.messages[2].parts[1]
    assert isinstance(call, ToolCall) and conv.messages[2].parts[0] == Reasoning("via the vLLM name")
    assert conv.messages[3].parts == (ToolResult(call.id, (Text("result"),), False, "f"),)
    o = req.options
    assert (o.stop, o.max_tokens, o.temperature, o.top_k, o.seed) == (("END",), 50, 0.5, None, 7)
    assert (o.tool_choice.mode, o.tool_choice.name) == ("named", "f")
    assert o.response_format is not None and o.response_format.name == "x"
    assert o.reasoning.enabled is False and o.template_kwargs == {"enable_thinking": False}
    assert req.ignored == ()
    assert o.logprobs is None and o.logit_bias == ()
    asked = decode_chat(body | {"logprobs": True, "top_logprobs": 3, "logit_bias": {"17": -100, "5": 2.5}})
    assert (asked.options.logprobs, asked.options.logit_bias) == (3, ((17, -100.0), (5, 2.5)))
    assert decode_chat(body | {"logprobs": True}).options.logprobs == 0
    for bad, param in (
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true (OpenAI's 400)
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"3": 101}}, "logit_bias"),
        ({"logit_bias": {"3": True}}, "logit_bias"),
    ):
        with pytest.raises(InvalidRequestError) as refused:
            decode_chat(body | bad)
        assert refused.value.param == param, bad
    # OpenAI: `required` without tools is a 400 naming tool_choice (nothing could satisfy it).
    with pytest.raises(InvalidRequestError) as required:
        decode_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})
    assert required.value.param == "tool_choice"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools}
    assert decode_chat(body | {"tool_choice": "required"}).options.tool_choice.mode == "required"


def body_with(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    for key, value in fields.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def calls(value: Any) -> list[dict[str, Any]]:
    return [{"role": "assistant", "tool_calls": value}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ("x", "body"),
        (body_with(model=""), "model"),
        (body_with(n=2), "n"),
        (body_with(messages=[]), "messages"),
        (body_with(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
        (body_with(messages=[{"role": "user"}]), "messages[0].content"),
        (body_with(messages=[{"role": "user", "content": [{"type": "input_audio"}]}]),
         "messages[0].content[0].type"),
        (body_with(messages=[{"role": "tool", "tool_call_id": "nope", "content": "x"}]),
         "messages[0].tool_call_id"),
        (body_with(messages=calls({"a": 1})), "messages[0].tool_calls"),
        (body_with(messages=calls([CALL, CALL])), "messages[0].tool_calls[1].id"),
        (body_with(messages=calls([CALL | {"function": {"name": "f", "arguments": 3}}])),
         "messages[0].tool_calls[0].function.arguments"),
        (body_with(messages=calls([CALL | {"id": ""}])), "messages[0].tool_calls[0].id"),
        (body_with(tools=[{"type": "function"}]), "tools[0].function"),
        (body_with(tool_choice="sometimes"), "tool_choice"),
        (body_with(tool_choice={"type": "function", "function": {}}), "tool_choice.function.name"),
        (body_with(stop=["a", 2]), "stop[1]"),
        (body_with(temperature=3), "temperature"),
        (body_with(max_completion_tokens=-5), "max_completion_tokens"),
        (body_with(reasoning_effort="extreme"), "reasoning_effort"),
        (body_with(response_format={"type": "yaml"}), "response_format.type"),
        (body_with(stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
    ],
)  # fmt: skip
def test_malformed_bodies_name_the_field(body: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        decode_chat(body)
    assert err.value.param == param
    shaped = err.value.openai_body()["error"]
    assert shaped["type"] == "invalid_request_error" and shaped["param"] == param
    assert err.value.status_for("openai") == 400


def test_usage_caps_cached_tokens() -> None:
    body = build_chat_completion(turn(("t", "x"), usage=Usage(10, 2, 50)), model="m")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 10


def test_ping_comments_are_ignored_by_the_sdk() -> None:
    encoder = ChatStreamEncoder("m")
    raw = encoder.start() + encoder.ping()
    for event in turn(("t", "hi"), ("call", "call_1", "bash", "{}"), finish="tool_calls"):
        raw += encoder.feed(event) + encoder.ping()
    final = sdk_final(raw)
    assert final.choices[0].message.content == "hi" and final.choices[0].finish_reason == "tool_calls"
