"""The round-trip law, for random turns and chunkings, through each official SDK.

OutputEvents → our encoder → the SDK's decoded message → sent back by the SDK as the next request's
history → our decoder → the very assistant turn the events describe (segment order, signatures,
canonical call ids, byte-exact argument text). Chat Completions flattens the turn, so it needs the
call memory; Anthropic needs it only for argument spacing; Responses needs nothing.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentserve.api.anthropic import AnthropicStreamEncoder, decode_messages
from agentserve.api.chat import ChatStreamEncoder, decode_chat
from agentserve.api.memory import CallMemory
from agentserve.api.responses import ResponsesStreamEncoder, decode_responses
from agentserve.api.signing import Signer
from agentserve.api.turn import TurnAccumulator
from agentserve.conversation import Message, OutputEvent

from .helpers import Recorder, anthropic_client, encode_all, openai_client, turn

SIGNER = Signer(b"p" * 32)
words = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)
json_scalars = st.one_of(st.integers(-1000, 1000), st.booleans(), st.none(), st.text(max_size=10))
args = st.dictionaries(
    st.text(max_size=8), st.one_of(json_scalars, st.lists(json_scalars, max_size=3)), max_size=4
)
formats = st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 2}, {"ensure_ascii": False}])


@st.composite
def turns(draw: st.DrawFn) -> tuple[list[OutputEvent], list[str]]:
    segments: list[tuple[Any, ...]] = []
    ids: list[str] = []
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["r", "t", "call"]))
        if kind == "call" or (i == 0 and not ids and draw(st.booleans())):
            call_id = f"call_{draw(st.binary(min_size=12, max_size=12)).hex()}{i}"
            text = json.dumps(draw(args), **draw(formats))
            segments.append(("call", call_id, draw(st.sampled_from(["bash", "read", "edit"])), text))
            ids.append(call_id)
        elif kind == "r" or (segments and segments[-1][0] == "t"):
            segments.append(("r", draw(words)))
        else:
            segments.append(("t", draw(words)))
    if not ids:  # an agent turn: at least one call, so every API can find it again
        segments.append(("call", "call_" + "ab" * 12, "bash", "{}"))
        ids.append("call_" + "ab" * 12)
    events = turn(*segments, finish="tool_calls", size=draw(st.integers(1, 7)))
    return events, ids


def expected(events: list[OutputEvent], signed: bool) -> Message:
    return TurnAccumulator().feed_all(events).message(SIGNER if signed else None)


@settings(max_examples=40, deadline=None)
@given(turns())
def test_anthropic(case: tuple[list[OutputEvent], list[str]]) -> None:
    events, _ = case
    encoder = AnthropicStreamEncoder("m", signer=SIGNER)
    raw = encoder.start() + encode_all(encoder, events)
    with anthropic_client(Recorder(raw)).messages.stream(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "go"}]
    ) as s:
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    recorder = Recorder(raw)
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "ok"} for u in uses],
        },
    ]
    with anthropic_client(recorder).messages.stream(model="m", max_tokens=10, messages=history) as s:  # type: ignore[arg-type]
        s.get_final_message()
    memory = CallMemory()
    memory.remember(expected(events, signed=False))
    assert decode_messages(recorder.requests[0], memory=memory).conversation.messages[1] == expected(
        events, True
    )


@settings(max_examples=40, deadline=None)
@given(turns())
def test_chat(case: tuple[list[OutputEvent], list[str]]) -> None:
    events, _ = case
    encoder = ChatStreamEncoder("m")
    raw = encoder.start() + encode_all(encoder, events)
    with openai_client(Recorder(raw)).chat.completions.stream(
        model="m", messages=[{"role": "user", "content": "go"}]
    ) as s:
        message = s.get_final_completion().choices[0].message
    calls = [
        c.model_dump(exclude={"index": True, "function": {"parsed_arguments"}})
        for c in message.tool_calls or []
    ]
    recorder = Recorder(raw)
    history = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": message.content,
            "tool_calls": calls,
        },  # reasoning dropped, as pi does
        *({"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls),
    ]
    with openai_client(recorder).chat.completions.stream(model="m", messages=history) as s:  # type: ignore[arg-type]
        s.get_final_completion()
    memory = CallMemory()
    memory.remember(expected(events, signed=False))
    assert decode_chat(recorder.requests[0], memory=memory).conversation.messages[1] == expected(
        events, False
    )


@settings(max_examples=40, deadline=None)
@given(turns())
def test_responses(case: tuple[list[OutputEvent], list[str]]) -> None:
    events, _ = case
    request = decode_responses(
        {"model": "m", "input": "go", "include": ["reasoning.encrypted_content"]}, signer=SIGNER
    )
    encoder = ResponsesStreamEncoder(request, signer=SIGNER)
    raw = encoder.start() + encode_all(encoder, events)
    with openai_client(Recorder(raw)).responses.stream(model="m", input="go") as s:
        final = s.get_final_response()
    items = [o.model_dump(exclude_none=True) for o in final.output]
    outputs = [
        {"type": "function_call_output", "call_id": o.call_id, "output": "ok"}
        for o in final.output
        if o.type == "function_call"
    ]
    recorder = Recorder(raw)
    with openai_client(recorder).responses.stream(
        model="m",
        input=[{"role": "user", "content": "go"}, *items, *outputs],
        store=False,  # type: ignore[list-item]
    ) as s:
        s.get_final_response()
    assert decode_responses(recorder.requests[0], signer=SIGNER).conversation.messages[1] == expected(
        events, False
    )
