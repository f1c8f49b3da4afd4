from __future__ import annotations

import json
from typing import Any

import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from agentserve.api.errors import ContextLengthError, InvalidRequestError
from agentserve.api.responses import (
    ResponsesStreamEncoder,
    ResponseStore,
    build_response,
    decode_responses,
)
from agentserve.api.signing import Signer
from agentserve.api.turn import TurnAccumulator
from agentserve.conversation import Finish, Message, Reasoning, Text, ToolCall, ToolCallEnd, ToolResult, Usage

from .harness_bodies import CODEX_THREAD, EXEC_COMMAND, codex_turn1
from .helpers import Recorder, encode_all, openai_client, parse_sse, turn

SIGNER = Signer(b"r" * 32)
EVENT = pydantic.TypeAdapter(ResponseStreamEvent)

INTERLEAVED = (
    ("r", "List the files first."),
    ("call", "call_0a1b2c3d4e5f60718293a4b5", "exec_command", '{"cmd":"ls -la"}'),
    ("r", "Then print the readme."),
    ("call", "call_9f8e7d6c5b4a39281706f5e4", "exec_command", '{"cmd": "cat README.md", "workdir": "/repo"}'),
)


def request(**fields: Any) -> Any:
    body: dict[str, Any] = {
        "model": "gpt-oss",
        "input": "hi",
        "tools": [EXEC_COMMAND],
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    body.update(fields)
    return decode_responses(body, signer=SIGNER)


def encode(events: list[Any], req: Any = None, **kwargs: Any) -> bytes:
    encoder = ResponsesStreamEncoder(
        req or request(), signer=SIGNER, response_id="resp_1", created_at=1, **kwargs
    )
    return encoder.start() + encode_all(encoder, events)


def sdk_final(raw: bytes) -> Response:
    client = openai_client(Recorder(raw))
    with client.responses.stream(model="gpt-oss", input="hi") as s:
        return s.get_final_response()


def test_events_are_valid_numbered_and_complete() -> None:
    raw = encode(turn(*INTERLEAVED, ("t", "Both listed."), finish="tool_calls"))
    frames = parse_sse(raw)
    for name, data in frames:
        assert name == data["type"]
        EVENT.validate_python(data)  # the SDK's own schema for each event
    assert [d["sequence_number"] for _, d in frames] == list(range(len(frames)))
    kinds = [d["type"] for _, d in frames]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    done = [d["item"] for _, d in frames if d["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == [
        "reasoning",
        "function_call",
        "reasoning",
        "function_call",
        "message",
    ]
    assert [d["output_index"] for _, d in frames if d["type"] == "response.output_item.done"] == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert done[1] == {
        "type": "function_call",
        "id": "fc_0a1b2c3d4e5f60718293a4b5",
        "call_id": INTERLEAVED[1][1],
        "name": "exec_command",
        "arguments": INTERLEAVED[1][3],
        "status": "completed",
    }
    assert done[0]["content"] == [{"type": "reasoning_text", "text": "List the files first."}]
    assert SIGNER.unseal_reasoning(done[0]["encrypted_content"]) == "List the files first."
    completed = frames[-1][1]["response"]
    assert completed["output"] == done
    assert completed["usage"] == {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 60, "cache_write_tokens": 0},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 5},
        "total_tokens": 120,
    }
    Response.model_validate(completed)


def test_text_item_event_order() -> None:
    kinds = [d["type"] for _, d in parse_sse(encode(turn(("t", "Hello there"))))]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_summary_mirror_only_when_asked() -> None:
    events = turn(("r", "think"), ("t", "x"))
    plain = [d["type"] for _, d in parse_sse(encode(events))]
    assert not any("summary" in k for k in plain)
    asked = parse_sse(encode(events, request(reasoning={"summary": "auto"})))
    kinds = [d["type"] for _, d in asked]
    assert (
        "response.reasoning_summary_part.added" in kinds and "response.reasoning_summary_text.delta" in kinds
    )
    item = next(d["item"] for _, d in asked if d["type"] == "response.output_item.done")
    assert item["summary"] == [{"type": "summary_text", "text": "think"}]
    for _, d in asked:
        EVENT.validate_python(d)


def test_function_call_dispatch_point_is_output_item_done_at_tool_call_end() -> None:
    encoder = ResponsesStreamEncoder(request(), signer=SIGNER)
    encoder.start()
    events = turn(("call", "call_5", "exec_command", '{"cmd": "echo hello"}'), finished=False, size=2)
    before = b"".join(encoder.feed(e) for e in events[:-1])
    assert b"function_call" not in before
    assert isinstance(events[-1], ToolCallEnd)
    kinds = [d["type"] for _, d in parse_sse(encoder.feed(events[-1]))]
    assert kinds[0] == "response.output_item.added" and kinds[-1] == "response.output_item.done"
    assert "response.function_call_arguments.done" in kinds


def test_live_arguments_stream_and_failure_is_response_failed() -> None:
    raw = encode(turn(*INTERLEAVED, finish="tool_calls", size=4), stream_tool_arguments=True)
    frames = parse_sse(raw)
    deltas = [d["delta"] for _, d in frames if d["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == INTERLEAVED[1][3] + INTERLEAVED[3][3] and len(deltas) > 2
    final = sdk_final(raw)
    assert [o.type for o in final.output] == ["reasoning", "function_call", "reasoning", "function_call"]
    bad = parse_sse(
        encode(turn(("bad", "call_x", "exec_command", '{"cm', "raw")), stream_tool_arguments=True)
    )
    assert bad[-1][1]["type"] == "response.failed"
    assert bad[-1][1]["response"]["error"]["code"] == "server_error"


def test_sdk_final_response() -> None:
    final = sdk_final(encode(turn(*INTERLEAVED, ("t", "Done."), finish="tool_calls")))
    assert final.status == "completed"
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.call_id, c.arguments) for c in calls] == [
        (INTERLEAVED[1][1], INTERLEAVED[1][3]),
        (INTERLEAVED[3][1], INTERLEAVED[3][3]),
    ]
    assert final.output_text == "Done."
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens == 60
    assert final.usage.output_tokens_details.reasoning_tokens == 5


@pytest.mark.parametrize("live", [False, True])
def test_a_call_id_outside_the_id_alphabet_keeps_one_item_id_from_added_to_done(live: bool) -> None:
    # Kimi's calls carry their own ids (`functions.NAME:IDX`); the item id derived from one must not
    # change between events, or the SDK refuses the stream.
    kimi = ("call", "functions.exec_command:0", "exec_command", '{"cmd": "ls"}')
    raw = encode(turn(kimi, finish="tool_calls"), stream_tool_arguments=live)
    ids = {d["item"]["id"] for _, d in parse_sse(raw) if d["type"].startswith("response.output_item.")}
    assert len(ids) == 1 and ids.pop().startswith("fc_")
    final = sdk_final(raw)
    assert [(o.type, getattr(o, "call_id", None)) for o in final.output] == [
        ("function_call", "functions.exec_command:0")
    ]


def test_failed_call_becomes_text_and_length_is_incomplete() -> None:
    final = sdk_final(encode(turn(("bad", "call_x", "exec_command", '{"cm', "<call>{"))))
    assert [o.type for o in final.output] == ["message"] and final.output_text == "<call>{"
    frames = parse_sse(encode(turn(("t", "long"), ("cut", "call_c", "exec_command", '{"c'), finish="length")))
    assert frames[-1][1]["type"] == "response.incomplete"
    response = frames[-1][1]["response"]
    assert (
        response["incomplete_details"] == {"reason": "max_output_tokens"}
        and response["status"] == "incomplete"
    )
    Response.model_validate(response)


def test_context_length_failure_for_codex() -> None:
    encoder = ResponsesStreamEncoder(request(), signer=SIGNER)
    frames = parse_sse(encoder.fail(ContextLengthError(300000, 262144, param="input")))
    assert [d["type"] for _, d in frames] == ["response.created", "response.in_progress", "response.failed"]
    error = frames[-1][1]["response"]["error"]
    assert error["code"] == "context_length_exceeded" and "prompt is too long" in error["message"]
    assert encoder.done and encoder.finish(Finish("stop")) == b""
    engine = parse_sse(encode(turn(("t", "x"), finish="error")))
    assert engine[-1][1]["type"] == "response.failed"
    EVENT.validate_python(engine[-1][1])


def test_non_stream_matches_stream() -> None:
    events = turn(*INTERLEAVED, ("t", "Done."), finish="tool_calls")
    body = build_response(events, request(), signer=SIGNER, response_id="resp_1", created_at=1)
    parsed = Response.model_validate(body)
    streamed = sdk_final(encode(events))

    def shape(r: Response) -> list[Any]:
        dumped = [o.model_dump(exclude_none=True) for o in r.output]
        return [{k: v for k, v in o.items() if k not in ("id", "encrypted_content")} for o in dumped]

    assert shape(parsed) == shape(streamed)
    client = openai_client(Recorder(body))
    got = client.responses.create(model="gpt-oss", input="x")
    assert got.output_text == "Done."
    length = build_response(turn(("t", "x"), finish="length"), request(), signer=SIGNER)
    assert length["status"] == "incomplete"


# --------------------------------------------------------------------------------------------------
# Round trips (store: false, everything comes back)


def _next_request_body(final: Response, *, drop_content: bool = False) -> dict[str, Any]:
    items = []
    for o in final.output:
        item = o.model_dump(exclude_none=True)
        if drop_content and item["type"] == "reasoning":
            item.pop("content", None)
        items.append(item)
    outputs = [
        {"type": "function_call_output", "call_id": o.call_id, "output": "ok"}
        for o in final.output
        if o.type == "function_call"
    ]
    recorder = Recorder(encode(turn(("t", "done."))))
    with openai_client(recorder).responses.stream(
        model="gpt-oss",
        input=[{"role": "user", "content": "go"}, *items, *outputs],
        store=False,  # type: ignore[list-item]
    ) as s:
        s.get_final_response()
    return recorder.requests[0]


@pytest.mark.parametrize("drop_content", [False, True])
def test_round_trip_reproduces_the_assistant_turn(drop_content: bool) -> None:
    events = turn(*INTERLEAVED, ("t", "Running."), finish="tool_calls")
    final = sdk_final(encode(events))
    body = _next_request_body(final, drop_content=drop_content)
    msgs = decode_responses(body, signer=SIGNER).conversation.messages
    original = TurnAccumulator().feed_all(events).message()
    assert msgs[1] == original
    assert [type(p).__name__ for p in msgs[1].parts] == [
        "Reasoning",
        "ToolCall",
        "Reasoning",
        "ToolCall",
        "Text",
    ]
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "tool"]
    assert msgs[2].parts == (ToolResult(INTERLEAVED[1][1], (Text("ok"),), False, "exec_command"),)


def test_foreign_or_tampered_encrypted_content_falls_back_to_content() -> None:
    other = Signer(b"x" * 32)
    items = [
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "encrypted_content": other.seal_reasoning("secret"),
         "content": [{"type": "reasoning_text", "text": "visible"}]},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "a summary"}],
         "encrypted_content": "gAAAA-openai-opaque"},
    ]  # fmt: skip
    msgs = decode_responses({"model": "m", "input": items}, signer=SIGNER).conversation.messages
    assert msgs == (Message("assistant", (Reasoning("visible"),)),)


# --------------------------------------------------------------------------------------------------
# Codex bodies


def test_codex_turn1() -> None:
    req = decode_responses(codex_turn1(), signer=SIGNER)
    conv = req.conversation
    assert conv.system == (
        Text("You are Codex, a coding agent ..."),
        Text("<skills_instructions>...</skills_instructions>"),
        Text("<permissions instructions>...</permissions instructions>"),
    )
    assert [m.role for m in conv.messages] == ["user", "user"]
    assert [t.name for t in conv.tools] == ["exec_command", "write_stdin", "spawn_agent"]
    assert req.tool_kinds["spawn_agent"].namespace == "multi_agent_v1"
    assert req.ignored == ("tools[3]", "client_metadata")  # web_search runs on OpenAI's side
    assert (req.store, req.include, req.prompt_cache_key) == (
        False,
        ("reasoning.encrypted_content",),
        CODEX_THREAD,
    )
    assert req.identity.session_id == CODEX_THREAD
    o = req.options
    assert (o.stream, o.parallel_tool_calls, o.tool_choice.mode, o.reasoning.summary) == (
        True,
        True,
        "auto",
        "auto",
    )


def test_codex_turn2_appends_our_items_and_outputs() -> None:
    body = codex_turn1()
    req = decode_responses(body, signer=SIGNER)
    events = turn(
        ("t", "I'll run it."),
        ("call", "call_b9072715aa", "exec_command", '{"cmd":"echo hello"}'),
        finish="tool_calls",
    )
    final = build_response(events, req, signer=SIGNER)
    body["input"] += [dict(item) for item in final["output"]]
    body["input"].append(
        {
            "type": "function_call_output",
            "id": "fco_019a",
            "call_id": "call_b9072715aa",
            "output": "Chunk ID: 1a2b3c\nOutput:\nhello\n",
        }
    )
    conv = decode_responses(body, signer=SIGNER).conversation
    assert conv.messages[2:] == (
        Message(
            "assistant",
            (Text("I'll run it."), ToolCall("call_b9072715aa", "exec_command", '{"cmd":"echo hello"}')),
        ),
        Message(
            "tool",
            (
                ToolResult(
                    "call_b9072715aa", (Text("Chunk ID: 1a2b3c\nOutput:\nhello\n"),), False, "exec_command"
                ),
            ),
        ),
    )


def test_code_mode_custom_tool_in_additional_tools() -> None:
    exec_tool = {"type": "custom", "name": "exec", "description": "Run JavaScript",
                 "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}  # fmt: skip
    body = {
        "model": "gpt-6.1-sol",
        "input": [
            {"type": "additional_tools", "id": "at_1", "role": "developer",
             "tools": [{"type": "namespace", "name": "functions", "tools": [exec_tool]}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        ],
        "store": False,
    }  # fmt: skip
    req = decode_responses(body, signer=SIGNER)
    assert req.conversation.tools[0].name == "exec"
    assert req.conversation.tools[0].parameters["required"] == ["input"]
    script = 'await tools.exec_command({cmd: "echo hello"})'
    arguments = json.dumps({"input": script})
    raw = encode(turn(("call", "call_c0de", "exec", arguments), finish="tool_calls"), req)
    frames = parse_sse(raw)
    for _, d in frames:
        EVENT.validate_python(d)
    item = next(d["item"] for _, d in frames if d["type"] == "response.output_item.done")
    assert item == {"type": "custom_tool_call", "id": "ctc_c0de", "call_id": "call_c0de", "name": "exec",
                    "input": script, "namespace": "functions"}  # fmt: skip
    body["input"] += [item, {"type": "custom_tool_call_output", "call_id": "call_c0de",
                             "output": [{"type": "input_text", "text": "Script completed\n"},
                                        {"type": "input_text", "text": "hello\n"}]}]  # fmt: skip
    msgs = decode_responses(body, signer=SIGNER).conversation.messages
    assert msgs[1].parts == (ToolCall("call_c0de", "exec", arguments),)
    assert msgs[2].parts[0] == ToolResult(
        "call_c0de", (Text("Script completed\n"), Text("hello\n")), False, "exec"
    )


def test_previous_response_id() -> None:
    store = ResponseStore(max_responses=2)
    first = decode_responses(
        {"model": "m", "input": "hi", "instructions": "be brief"}, signer=SIGNER, store=store
    )
    events = turn(("call", "call_p1", "f", "{}"), finish="tool_calls")
    store.remember(first, "resp_a", TurnAccumulator().feed_all(events).message())
    second = decode_responses(
        {
            "model": "m",
            "previous_response_id": "resp_a",
            "input": [{"type": "function_call_output", "call_id": "call_p1", "output": "x"}],
        },
        signer=SIGNER,
        store=store,
    )
    assert [m.role for m in second.conversation.messages] == ["user", "assistant", "tool"]
    assert second.conversation.system == ()  # instructions do not carry over
    with_developer = decode_responses(
        {
            "model": "m",
            "instructions": "be brief",
            "input": [
                {"type": "message", "role": "developer", "content": "You are Codex."},
                {"type": "message", "role": "user", "content": "hi"},
            ],
        },
        signer=SIGNER,
        store=store,
    )
    store.remember(with_developer, "resp_dev", TurnAccumulator().feed_all(events).message())
    continued = decode_responses(
        {
            "model": "m",
            "instructions": "now be verbose",
            "previous_response_id": "resp_dev",
            "input": [{"type": "function_call_output", "call_id": "call_p1", "output": "x"}],
        },
        signer=SIGNER,
        store=store,
    )
    # Developer input items are history and carry over; the old instructions are replaced.
    assert continued.conversation.system == (Text("now be verbose"), Text("You are Codex."))
    for store_arg in (store, None):
        with pytest.raises(InvalidRequestError) as err:
            decode_responses(
                {"model": "m", "previous_response_id": "resp_zz", "input": "x"},
                signer=SIGNER,
                store=store_arg,
            )
        assert err.value.code == "previous_response_not_found" and err.value.param == "previous_response_id"
    store.put("resp_b", ())
    store.put("resp_c", ())
    assert store.get("resp_a") is None and store.get("resp_dev") is None  # bounded: the oldest went first
    unstored = decode_responses({"model": "m", "input": "x", "store": False}, signer=SIGNER)
    store.remember(unstored, "resp_d", Message("assistant", ()))
    assert store.get("resp_d") is None


def test_options_and_echo() -> None:
    req = request(
        instructions="sys",
        reasoning={"effort": "high", "summary": "detailed"},
        text={
            "verbosity": "low",
            "format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}},
        },
        max_output_tokens=512,
        temperature=0.7,
        tool_choice={"type": "function", "name": "exec_command"},
        parallel_tool_calls=False,
        client_metadata={"thread_id": "t"},
        truncation="auto",
    )
    o = req.options
    assert (o.max_tokens, o.temperature, o.verbosity, o.parallel_tool_calls) == (512, 0.7, "low", False)
    assert (o.reasoning.effort, o.reasoning.summary, o.tool_choice.name) == (
        "high",
        "detailed",
        "exec_command",
    )
    assert o.response_format is not None and o.response_format.name == "out"
    body = build_response(turn(("t", "{}")), req, signer=SIGNER)
    Response.model_validate(body)
    assert body["instructions"] == "sys" and body["reasoning"] == {"effort": "high", "summary": "detailed"}
    assert body["text"]["verbosity"] == "low" and body["max_output_tokens"] == 512 and body["store"] is False


def body_with(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "input": "x"}
    for key, value in fields.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (1, "body"),
        (body_with(model=None), "model"),
        (body_with(input=None), "input"),
        (body_with(input=5), "input"),
        (body_with(input=[{"type": "message", "role": "robot", "content": "x"}]), "input[0].role"),
        (body_with(input=[{"type": "message", "role": "user"}]), "input[0].content"),
        (body_with(input=[{"type": "message", "role": "user", "content": [{"type": "input_file"}]}]),
         "input[0].content[0].type"),
        (body_with(input=[{"type": "frobnicate"}]), "input[0].type"),
        (body_with(input=[{"type": "item_reference", "id": "x"}]), "input[0]"),
        (body_with(input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}]),
         "input[0].call_id"),
        (body_with(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]),
         "input[0].arguments"),
        (body_with(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]), "input[0].call_id"),
        (body_with(input=[{"type": "reasoning", "content": [{"type": "reasoning_text"}]}]),
         "input[0].content[0].text"),
        (body_with(tools=[{"type": "function"}]), "tools[0].name"),
        (body_with(tools=[{"type": "function", "name": "a"}, {"type": "custom", "name": "a"}]),
         "tools[1].name"),
        (body_with(tool_choice="maybe"), "tool_choice"),
        (body_with(reasoning={"effort": "huge"}), "reasoning.effort"),
        (body_with(text={"verbosity": "loud"}), "text.verbosity"),
        (body_with(include="reasoning.encrypted_content"), "include"),
        (body_with(max_output_tokens=0), "max_output_tokens"),
        (body_with(background=True), "background"),
        (body_with(nvext={"agent_context": {"session_id": "has space"}}), "nvext.agent_context.session_id"),
    ],
)  # fmt: skip
def test_malformed_bodies_name_the_field(body: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        decode_responses(body, signer=SIGNER)
    assert err.value.param == param


def test_sdk_raises_on_http_error_body() -> None:
    error = InvalidRequestError("bad input", param="input")
    client = openai_client(Recorder(error.openai_body(), status=error.status_for("openai")))
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input="x")
    assert err.value.param == "input" and err.value.code is None


def test_usage_zero_division_free() -> None:
    body = build_response(turn(("t", "x"), usage=Usage()), request(), signer=SIGNER)
    assert body["usage"]["total_tokens"] == 0


def test_dispatch_off_and_pings() -> None:
    events = turn(("call", "call_1", "exec_command", "{}"), ("t", "after"), finish="tool_calls")
    on = ResponsesStreamEncoder(request(), signer=SIGNER, response_id="resp_1", created_at=1)
    off = ResponsesStreamEncoder(request(), signer=SIGNER, response_id="resp_1", created_at=1, dispatch=False)
    parts_on = [on.feed(e) for e in events]
    parts_off = [off.feed(e) + off.ping() for e in events]
    first_end = next(i for i, e in enumerate(events) if isinstance(e, ToolCallEnd))
    assert b"output_item.done" in parts_on[first_end]
    assert parts_off[first_end] == off.ping()
    kinds = [[d["type"] for _, d in parse_sse(b"".join(parts))] for parts in (parts_on, parts_off)]
    assert kinds[0] == kinds[1]  # the same stream, only later (message ids are random)
    final = sdk_final(b"".join(parts_off))
    assert [o.type for o in final.output] == ["function_call", "message"]
