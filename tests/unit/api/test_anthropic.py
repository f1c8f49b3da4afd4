from __future__ import annotations

import json
from typing import Any

import anthropic
import pydantic
import pytest
from anthropic.types import Message as SdkMessage
from anthropic.types import RawMessageStreamEvent

from agentserve.api.anthropic import (
    AnthropicStreamEncoder,
    build_message,
    decode_count_tokens,
    decode_messages,
)
from agentserve.api.anthropic.context import ClearThinking, ContextManagement
from agentserve.api.errors import ApiError, InvalidRequestError
from agentserve.api.ids import anthropic_tool_id
from agentserve.api.memory import CallMemory
from agentserve.api.signing import Signer
from agentserve.api.turn import TurnAccumulator
from agentserve.conversation import (
    Finish,
    Image,
    Message,
    Reasoning,
    Text,
    ToolCall,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    Usage,
)

from .harness_bodies import BILLING, CLAUDE_USER_ID, claude_code_turn1, claude_code_turn2
from .helpers import Recorder, anthropic_client, encode_all, parse_sse, turn

SIGNER = Signer(b"k" * 32)
EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
USE = {"type": "tool_use", "id": "toolu_1", "name": "x", "input": {}}

INTERLEAVED = (
    ("r", "The user wants a listing. I will run ls first."),
    ("call", "call_a1b2c3", "Bash", '{"command": "ls -la", "description": "List files"}'),
    ("r", "Then read the README in the same turn."),
    ("call", "call_d4e5f6", "Read", '{"path":"README.md"}'),
)


def encode(events: list[Any], **kwargs: Any) -> bytes:
    encoder = AnthropicStreamEncoder("qwen3", signer=SIGNER, message_id="msg_test", **kwargs)
    return encoder.start(Usage(100, 0, 60)) + encode_all(encoder, events)


def sdk_final(raw: bytes) -> SdkMessage:
    client = anthropic_client(Recorder(raw))
    with client.messages.stream(
        model="qwen3", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    ) as s:
        return s.get_final_message()


def test_stream_is_valid_sdk_events_in_exact_order() -> None:
    raw = encode(turn(*INTERLEAVED, finish="tool_calls"))
    frames = parse_sse(raw)
    for name, data in frames:
        assert name == data["type"]
        if name != "ping":  # ping is not in the SDK's union (the SDK skips it by name)
            EVENT.validate_python(data)  # the SDK's own strict event schema
    kinds = [
        (d["type"], d.get("content_block", {}).get("type") or d.get("delta", {}).get("type"))
        for _, d in frames
    ]
    assert kinds[:2] == [("message_start", None), ("ping", None)]
    assert kinds[2:6] == [
        ("content_block_start", "thinking"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "thinking_delta"),
    ]
    # Each thinking block ends with exactly one signature_delta right before its stop.
    for i, (_, d) in enumerate(frames):
        if d.get("delta", {}).get("type") == "signature_delta":
            assert frames[i + 1][1]["type"] == "content_block_stop"
    assert [k for k in kinds if k[0] == "content_block_start"] == [
        ("content_block_start", "thinking"),
        ("content_block_start", "tool_use"),
        ("content_block_start", "thinking"),
        ("content_block_start", "tool_use"),
    ]
    assert kinds[-2:] == [("message_delta", None), ("message_stop", None)]
    start = frames[0][1]["message"]["usage"]
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == (40, 60)
    delta = frames[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"] == {
        "input_tokens": 40,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 60,
        "output_tokens": 20,
    }


def test_sdk_accumulates_n_thinking_blocks_with_signatures_and_parsed_input() -> None:
    final = sdk_final(encode(turn(*INTERLEAVED, ("t", "Both done."), finish="tool_calls")))
    assert [b.type for b in final.content] == ["thinking", "tool_use", "thinking", "tool_use", "text"]
    thinking = [b for b in final.content if b.type == "thinking"]
    assert [b.thinking for b in thinking] == [INTERLEAVED[0][1], INTERLEAVED[2][1]]
    assert all(SIGNER.verify_thinking(b.thinking, b.signature) for b in thinking)
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [(u.id, u.name, u.input) for u in uses] == [
        ("toolu_a1b2c3", "Bash", {"command": "ls -la", "description": "List files"}),
        ("toolu_d4e5f6", "Read", {"path": "README.md"}),
    ]
    assert final.stop_reason == "tool_use"
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens, final.usage.output_tokens) == (
        40,
        60,
        20,
    )


def test_tool_use_block_closes_exactly_at_tool_call_end() -> None:
    encoder = AnthropicStreamEncoder("m", signer=SIGNER)
    encoder.start()
    events = turn(("call", "call_x1", "Bash", '{"command": "echo hello"}'), finished=False, size=2)
    before = b"".join(encoder.feed(e) for e in events[:-1])
    assert b"tool_use" not in before and b"content_block_stop" not in before  # nothing before dispatch
    at_end = parse_sse(encoder.feed(events[-1]))
    assert isinstance(events[-1], ToolCallEnd)
    assert next(d["type"] for _, d in at_end) == "content_block_start"
    assert at_end[-1][1] == {"type": "content_block_stop", "index": 0}
    partial = "".join(d["delta"]["partial_json"] for _, d in at_end if d["type"] == "content_block_delta")
    assert partial == '{"command": "echo hello"}'


def test_live_tool_input_streams_fragments_before_dispatch() -> None:
    encoder = AnthropicStreamEncoder("m", signer=SIGNER, stream_tool_input=True)
    encoder.start()
    events = turn(("call", "call_x1", "Bash", '{"command": "echo hello"}'), finished=False, size=4)
    before = parse_sse(b"".join(encoder.feed(e) for e in events[:-1]))
    assert before[0][1]["content_block"]["type"] == "tool_use"
    assert all(d["type"] != "content_block_stop" for _, d in before)
    assert parse_sse(encoder.feed(events[-1])) == [(
        "content_block_stop", {"type": "content_block_stop", "index": 0}
    )]  # fmt: skip


def test_live_tool_input_failure_ends_stream_with_error_so_half_call_never_runs() -> None:
    events = turn(("t", "Let me"), ("bad", "call_z", "Bash", '{"command": "rm', "<tool_call>{bad"))
    raw = encode(events, stream_tool_input=True)
    frames = parse_sse(raw)
    assert frames[-1][0] == "error" and frames[-1][1]["error"]["type"] == "api_error"
    assert all(d["type"] != "message_stop" for _, d in frames)
    with pytest.raises(anthropic.APIStatusError):
        sdk_final(raw)


def test_failed_call_surfaces_as_text_never_tool_use() -> None:
    raw = encode(turn(("t", "Running it."), ("bad", "call_z", "Bash", '{"command": ', "<tool_call>{oops")))
    final = sdk_final(raw)
    assert [(b.type, getattr(b, "text", None)) for b in final.content] == [
        ("text", "Running it."),
        ("text", "<tool_call>{oops"),
    ]
    assert final.stop_reason == "end_turn"


def test_call_cut_off_by_max_tokens_is_text_and_max_tokens() -> None:
    events = turn(("r", "think"), ("call", "call_ok", "Read", '{"path": "a"}'), finished=False)
    events += [ToolCallStart(1, "call_cut", "Bash"), Finish("length", Usage(10, 5))]
    final = sdk_final(encode(events))
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    # One call was dispatched already, so the client must answer it: tool_use wins over max_tokens.
    assert final.stop_reason == "tool_use"
    only_cut = [*turn(("t", "x"), ("cut", "call_c", "Bash", '{"comm'), finished=False), Finish("length")]
    final = sdk_final(encode(only_cut))
    assert [(b.type, b.text) for b in final.content if b.type == "text"] == [
        ("text", "x"),
        ("text", '{"comm'),
    ]
    assert final.stop_reason == "max_tokens"


def test_stop_sequence_and_end_turn() -> None:
    encoder = AnthropicStreamEncoder("m", signer=SIGNER)
    raw = encoder.start() + encoder.feed(turn(("t", "abc"), finished=False)[0])
    raw += encoder.finish(Finish("stop", Usage(3, 1)), stop_sequence="END")
    final = sdk_final(raw)
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")
    final = sdk_final(encode(turn(("t", "plain"))))
    assert (final.stop_reason, final.stop_sequence) == ("end_turn", None)


def test_engine_error_becomes_error_event() -> None:
    raw = encode(turn(("t", "partial"), finish="error"))
    frames = parse_sse(raw)
    assert frames[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": frames[-1][1]["error"]["message"]}},
    )
    with pytest.raises(anthropic.APIStatusError) as err:  # after HTTP 200 the SDK keys on the body
        sdk_final(raw)
    assert err.value.body["error"]["type"] == "api_error"  # type: ignore[index]


def test_nothing_after_done_and_auto_start() -> None:
    encoder = AnthropicStreamEncoder("m", signer=SIGNER)
    first = parse_sse(encoder.feed(turn(("t", "hi"), finished=False)[0]))
    assert first[0][1]["type"] == "message_start"
    encoder.finish(Finish("stop"))
    assert encoder.done and encoder.feed(turn(("t", "late"), finished=False)[0]) == b""


def test_non_stream_message_matches_sdk_schema_and_stream() -> None:
    events = turn(*INTERLEAVED, ("t", "ok"), finish="tool_calls")
    body = build_message(events, model="qwen3", signer=SIGNER, message_id="msg_1")
    parsed = SdkMessage.model_validate(body)
    streamed = sdk_final(encode(events))
    assert [b.model_dump() for b in parsed.content] == [b.model_dump() for b in streamed.content]
    assert parsed.stop_reason == "tool_use"
    client = anthropic_client(Recorder(body))
    got = client.messages.create(model="qwen3", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert got.content[1].type == "tool_use" and got.content[1].input == {
        "command": "ls -la",
        "description": "List files",
    }


def test_non_stream_failed_generation_raises_api_error() -> None:
    with pytest.raises(ApiError):
        build_message(turn(("t", "x"), finish="abort"), model="m", signer=SIGNER)


# --------------------------------------------------------------------------------------------------
# Round trip through the SDK and back into our decoder


def _round_trip(events: list[Any], memory: CallMemory | None) -> tuple[Message, Message]:
    raw = encode(events)
    final = sdk_final(raw)
    uses = [b for b in final.content if b.type == "tool_use"]
    recorder = Recorder(encode(turn(("t", "done."))))
    client = anthropic_client(recorder)
    history = [
        {"role": "user", "content": "list and read"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "ok"} for u in uses],
        },
    ]
    with client.messages.stream(model="qwen3", max_tokens=100, messages=history) as s:  # type: ignore[arg-type]
        s.get_final_message()
    decoded = decode_messages(recorder.requests[0], memory=memory)
    original = TurnAccumulator().feed_all(events).message(SIGNER)
    if memory is not None:
        memory.remember(original)
    return decoded.conversation.messages[1], original


def test_round_trip_restores_interleaved_turn() -> None:
    events = turn(*INTERLEAVED, finish="tool_calls")
    memory = CallMemory()
    memory.remember(TurnAccumulator().feed_all(events).message(SIGNER))
    got, original = _round_trip(events, memory)
    assert got == original  # order, segments, signatures, canonical ids and byte-exact arguments
    assert [type(p).__name__ for p in got.parts] == ["Reasoning", "ToolCall", "Reasoning", "ToolCall"]
    assert got.parts[3] == ToolCall("call_d4e5f6", "Read", '{"path":"README.md"}')  # compact, as written


def test_round_trip_without_memory_keeps_everything_but_argument_spacing() -> None:
    events = turn(*INTERLEAVED, finish="tool_calls")
    got, original = _round_trip(events, None)
    assert got.parts[:3] == original.parts[:3]  # the first call was written with the usual separators
    assert got.parts[3] == ToolCall("call_d4e5f6", "Read", '{"path": "README.md"}')


def test_tool_results_become_tool_messages_naming_their_call() -> None:
    events = turn(*INTERLEAVED, finish="tool_calls")
    final = build_message(events, model="m", signer=SIGNER)
    ids = [b["id"] for b in final["content"] if b["type"] == "tool_use"]
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": final["content"]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": ids[0],
                        "content": [{"type": "text", "text": "a.txt"}],
                    },
                    {"type": "tool_result", "tool_use_id": ids[1], "content": "boom", "is_error": True},
                    {"type": "text", "text": "also, hurry"},
                ],
            },
        ],
    }
    msgs = decode_messages(body).conversation.messages
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "tool", "user"]
    assert msgs[2].parts == (ToolResult("call_a1b2c3", (Text("a.txt"),), False, "Bash"),)
    assert msgs[3].parts == (ToolResult("call_d4e5f6", (Text("boom"),), True, "Read"),)
    assert msgs[4].parts == (Text("also, hurry"),)


# --------------------------------------------------------------------------------------------------
# Decoding real harness bodies


def test_claude_code_turn1() -> None:
    req = decode_messages(claude_code_turn1())
    conv = req.conversation
    assert conv.system[0] == Text(BILLING)  # stripping is the prompt pipeline's job, not the codec's
    assert len(conv.system) == 3
    assert [m.role for m in conv.messages] == ["user", "system"]
    assert conv.messages[0].parts[1] == Text("run echo hello using your shell tool, then say done")
    assert [t.name for t in conv.tools] == ["Bash", "Read"]
    assert conv.tools[0].parameters["required"] == ["command"]
    opts = req.options
    assert (opts.model, opts.max_tokens, opts.stream) == ("capture-model", 32000, True)
    assert (opts.reasoning.mode, opts.reasoning.effort, opts.reasoning.enabled) == ("adaptive", "high", True)
    assert req.user_id == CLAUDE_USER_ID
    assert req.identity.session_id == "3f2b8c1e-6a4d-4f0e-9b7a-2d1c5e8f9a01"
    assert req.context_management == ContextManagement((ClearThinking(keep=None),))  # keep: "all"
    assert req.ignored == ()


def test_claude_code_turn2_with_our_reply() -> None:
    reply = build_message(
        turn(
            ("t", "I'll run it."),
            ("call", "call_9f8e", "Bash", '{"command": "echo hello"}'),
            finish="tool_calls",
        ),
        model="m",
        signer=SIGNER,
    )
    body = claude_code_turn2(reply["content"], anthropic_tool_id("call_9f8e"))
    msgs = decode_messages(body).conversation.messages
    assert [m.role for m in msgs] == ["user", "system", "assistant", "tool"]
    assert msgs[2].parts == (Text("I'll run it."), ToolCall("call_9f8e", "Bash", '{"command": "echo hello"}'))
    assert msgs[3].parts == (ToolResult("call_9f8e", (Text("hello"),), False, "Bash"),)


def test_options_mapping() -> None:
    body = {
        "model": "m",
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["END", "\n\nHuman:"],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],  # tool_choice must name one
        "tool_choice": {"type": "tool", "name": "Bash", "disable_parallel_tool_use": True},
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        "metadata": {"user_id": "user_abc_account__session_0b7c1d2e-aaaa-bbbb-cccc-000000000000"},
        "cache_control": {"type": "ephemeral"},
        "service_tier": "auto",
    }
    req = decode_messages(body)
    o = req.options
    assert (o.temperature, o.top_p, o.top_k, o.stop) == (0.2, 0.9, 40, ("END", "\n\nHuman:"))
    assert (o.tool_choice.mode, o.tool_choice.name, o.parallel_tool_calls) == ("named", "Bash", False)
    # Thinking cannot go with a forced tool (Anthropic's 400); with tool_choice auto it maps.
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 2048}}
    with pytest.raises(InvalidRequestError, match="Thinking may not be enabled"):
        decode_messages(body | thinking)
    r = decode_messages(body | thinking | {"tool_choice": {"type": "auto"}}).options.reasoning
    assert (r.mode, r.budget_tokens) == ("enabled", 2048)
    assert o.response_format is not None and o.response_format.schema == {"type": "object"}
    assert req.identity.session_id == "0b7c1d2e-aaaa-bbbb-cccc-000000000000"
    assert req.ignored == ("cache_control", "service_tier")  # harmless ones are reported (api/contract.py)
    assert decode_messages(body | {"thinking": {"type": "disabled"}}).options.reasoning.enabled is False
    for kind, mode in (("auto", "auto"), ("any", "required"), ("none", "none")):
        assert decode_messages(body | {"tool_choice": {"type": kind}}).options.tool_choice.mode == mode


def test_content_kinds() -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": "doc"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "thinking", "thinking": "hmm", "signature": "foreign-sig"},
                    {"type": "text", "text": "answer", "citations": None},
                ],
            },
            {"role": "assistant", "content": "continued"},
        ],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
    }
    req = decode_messages(body)
    user, assistant = req.conversation.messages
    assert user.parts == (Image("image/png", "iVBOR"), Image(url="https://x/y.png"), Text("doc"))
    # Consecutive assistant messages are one turn; foreign signatures are kept (they round-trip).
    assert assistant.parts == (Reasoning("hmm", "foreign-sig"), Text("answer"), Text("continued"))
    assert req.ignored == ("messages[1].content[0]", "tools[0]")
    assert req.conversation.tools == ()


def test_count_tokens_body_needs_no_max_tokens() -> None:
    req = decode_count_tokens({"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": "s"})
    assert req.conversation.system == (Text("s"),) and req.options.max_tokens is None
    with pytest.raises(InvalidRequestError) as err:
        decode_messages({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert err.value.param == "max_tokens"


def test_memory_restores_only_equal_arguments() -> None:
    memory = CallMemory()
    memory.remember(Message("assistant", (ToolCall("call_q1", "Bash", '{"command":"ls"}'),)))
    base = {"model": "m", "max_tokens": 5}
    use = USE | {"id": "toolu_q1", "name": "Bash", "input": {"command": "ls"}}
    same = base | {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [use]}]}
    assert (
        decode_messages(same, memory=memory).conversation.messages[1].parts[0].arguments == '{"command":"ls"}'
    )  # type: ignore[union-attr]
    assert decode_messages(same, memory=memory).restored == 1
    edited = json.loads(json.dumps(same).replace('"ls"', '"pwd"'))
    assert (
        decode_messages(edited, memory=memory).conversation.messages[1].parts[0].arguments
        == '{"command": "pwd"}'
    )  # type: ignore[union-attr]
    # Another scope never sees this turn.
    assert decode_messages(same, memory=memory, memory_scope="other").restored == 0


USER_X = [{"role": "user", "content": "x"}]


def body_with(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "max_tokens": 1, "messages": USER_X}
    for key, value in fields.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def one(role: str, *blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": role, "content": list(blocks)}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], "body"),
        (body_with(model=None), "model"),
        (body_with(max_tokens="1"), "max_tokens"),
        (body_with(max_tokens=True), "max_tokens"),
        (body_with(max_tokens=-1), "max_tokens"),
        (body_with(messages=[]), "messages"),
        (body_with(messages=None), "messages"),
        (body_with(messages=[{"role": "bot", "content": "x"}]), "messages[0].role"),
        (body_with(messages=[{"role": "user"}]), "messages[0].content"),
        (body_with(messages=[{"role": "user", "content": 3}]), "messages[0].content"),
        (body_with(messages=[{"role": "user", "content": []}]), "messages[0].content"),
        (body_with(messages=one("user", {"type": "video"})), "messages[0].content[0].type"),
        (body_with(messages=one("user", {"type": "text"})), "messages[0].content[0].text"),
        (body_with(messages=one("user", {"type": "tool_result", "tool_use_id": "toolu_nope"})),
         "messages[0].content[0].tool_use_id"),
        (body_with(messages=one("assistant", USE | {"id": "bad id!"})), "messages[0].content[0].id"),
        (body_with(messages=one("assistant", USE | {"input": "{}"})), "messages[0].content[0].input"),
        (body_with(messages=one("assistant", USE, USE)), "messages[0].content[1].id"),
        (body_with(messages=one("user", {"type": "thinking", "thinking": "x"})), "messages[0].content[0]"),
        (body_with(system=[{"type": "image"}]), "system[0].type"),
        (body_with(tools=[{"name": "x"}]), "tools[0].input_schema"),
        (body_with(tools=[{"name": "x", "input_schema": {"type": "object"}}] * 2), "tools[1].name"),
        (body_with(tool_choice={"type": "maybe"}), "tool_choice.type"),
        (body_with(temperature=1.5), "temperature"),
        (body_with(max_tokens=4000, thinking={"type": "enabled"}), "thinking.budget_tokens"),
        (body_with(max_tokens=9, thinking={"type": "enabled", "budget_tokens": 9}), "thinking.budget_tokens"),
        (body_with(stop_sequences=["a", 1]), "stop_sequences[1]"),
        (body_with(metadata={"user_id": 5}), "metadata.user_id"),
        (body_with(nvext={"agent_hints": {"priority": "high"}}), "nvext.agent_hints.priority"),
    ],
)  # fmt: skip
def test_malformed_bodies_name_the_field(body: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        decode_messages(body)
    assert err.value.param == param
    shaped = err.value.anthropic_body()
    assert shaped["type"] == "error" and shaped["error"]["type"] == "invalid_request_error"
    assert err.value.status_for("anthropic") == 400


def test_dispatch_off_holds_everything_after_the_first_call_until_the_end() -> None:
    events = turn(
        ("r", "a"), ("call", "call_1", "Bash", '{"command": "ls"}'), ("t", "more"), finish="tool_calls"
    )
    on = AnthropicStreamEncoder("m", signer=SIGNER, message_id="msg_x")
    off = AnthropicStreamEncoder("m", signer=SIGNER, message_id="msg_x", dispatch=False)
    parts_on = [on.start()] + [on.feed(e) for e in events]
    parts_off = [off.start()] + [off.feed(e) for e in events]
    assert b"".join(parts_on) == b"".join(parts_off)  # same stream, only later
    first_end = next(i for i, e in enumerate(events) if isinstance(e, ToolCallEnd)) + 1
    assert all(p == b"" for p in parts_off[first_end:-1]) and b"tool_use" in parts_off[-1]
    assert b"tool_use" in parts_on[first_end]
    failed = AnthropicStreamEncoder("m", signer=SIGNER, dispatch=False)
    out = encode_all(failed, events[:-1]) + failed.error(InvalidRequestError("x"))
    assert b"tool_use" in out and out.endswith(b"\n\n") and parse_sse(out)[-1][0] == "error"


def test_omitted_thinking_travels_sealed_in_the_signature_and_comes_back() -> None:
    events = turn(*INTERLEAVED, finish="tool_calls")
    raw = encode(events, omit_thinking=True)
    assert not any(d.get("delta", {}).get("type") == "thinking_delta" for _, d in parse_sse(raw))
    final = sdk_final(raw)
    thinking = [b for b in final.content if b.type == "thinking"]
    assert [b.thinking for b in thinking] == ["", ""] and all(b.signature for b in thinking)
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        ],
    }
    restored = decode_messages(body, signer=SIGNER).conversation.messages[1]
    assert [p.text for p in restored.parts if isinstance(p, Reasoning)] == [
        INTERLEAVED[0][1],
        INTERLEAVED[2][1],
    ]
    assert not any(isinstance(p, Reasoning) for p in decode_messages(body).conversation.messages[1].parts)
    built = build_message(events, model="m", signer=SIGNER, omit_thinking=True)
    assert built["content"][0]["thinking"] == "" and SIGNER.unseal_reasoning(built["content"][0]["signature"])
