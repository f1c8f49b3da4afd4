from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentserve.constraints.spec import Constraint
from agentserve.conversation import Usage
from agentserve.worker.engine import (
    AllCleared,
    BlockRemoved,
    BlockStored,
    GenerateRequest,
    Hints,
    SamplingParams,
    Step,
    TokenLogprob,
)
from agentserve.worker.kvwire import GapDetector, KvWireError, decode_batch, encode_batch, peek_range
from agentserve.worker.wire import (
    DEFAULT_FRAMING,
    StreamError,
    WireError,
    decode_body,
    decode_request,
    encode_frame,
    encode_request,
    error_frame,
    frame_decoder,
    frame_to_step,
    framing_for_accept,
    step_to_frame,
)

FRAMINGS = ("ndjson", "msgpack", "sse")

REQUEST = GenerateRequest(
    "r1",
    [1, 2, 3, 2**32 - 1],
    SamplingParams(
        max_tokens=64, temperature=0.7, top_k=20, stop=("</x>",), stop_token_ids=(7,), ignore_eos=True
    ),
    priority=3,
    hints=Hints(turn=2, last_user_message="hi", last_message="ok"),
)


def test_request_round_trips_through_json_and_msgpack() -> None:
    body = encode_request(REQUEST)
    for raw in (json.loads(json.dumps(body)), msgpack.unpackb(msgpack.packb(body))):
        got = decode_request(raw)
        assert list(got.prompt_token_ids) == list(REQUEST.prompt_token_ids)
        assert (got.request_id, got.sampling, got.priority, got.hints) == (
            REQUEST.request_id,
            REQUEST.sampling,
            REQUEST.priority,
            REQUEST.hints,
        )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "object"),
        ({}, "token_ids is required"),
        ({"token_ids": "abc", "sampling": {"max_tokens": 1}}, "list"),
        ({"token_ids": [1, -1], "sampling": {"max_tokens": 1}}, "32-bit"),
        ({"token_ids": [1, 2**32], "sampling": {"max_tokens": 1}}, "32-bit"),
        ({"token_ids": [1.5], "sampling": {"max_tokens": 1}}, "32-bit"),
        ({"token_ids": [1]}, "max_tokens is required"),
        ({"token_ids": [1], "sampling": {"max_tokens": 0}}, "at least 1"),
        ({"token_ids": [1], "sampling": {"max_tokens": True}}, "number"),
        ({"token_ids": [1], "sampling": {"max_tokens": 1, "temperature": "hot"}}, "wrong type"),
        ({"token_ids": [1], "sampling": {"max_tokens": 1, "beam": 4}}, "unknown sampling"),
        ({"token_ids": [1], "sampling": {"max_tokens": 1, "stop": [1]}}, "strings"),
        ({"token_ids": [1], "sampling": {"max_tokens": 1, "ignore_eos": 1}}, "boolean"),
        ({"token_ids": [1], "sampling": {"max_tokens": 1}, "model": "x"}, "unknown fields"),
        ({"token_ids": [1], "sampling": {"max_tokens": 1}, "hints": {"turn": 0}}, "at least 1"),
        ({"token_ids": [1], "sampling": {"max_tokens": 1}, "hints": {"mood": 1}}, "unknown hints"),
        ({"token_ids": [1], "sampling": {"max_tokens": 1}, "request_id": 5}, "request_id"),
        ({"token_ids": [1], "sampling": {"max_tokens": 1, "include_stop": "yes"}}, "boolean"),
        ({"token_ids": [1], "sampling": {"max_tokens": 1}, "cache_salt": 7}, "cache_salt"),
        ({"token_ids": [1], "sampling": {"max_tokens": 1}, "cache_salt": ""}, "cache_salt"),
    ],
)
def test_bad_requests_are_explained(body: object, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_request(body)


def test_a_single_stop_string_is_accepted() -> None:
    req = decode_request({"token_ids": [1], "sampling": {"max_tokens": 1, "stop": "END"}})
    assert req.sampling.stop == ("END",)


def test_bodies_by_content_type() -> None:
    assert decode_body("application/json; charset=utf-8", b'{"a": 1}') == {"a": 1}
    assert decode_body(None, b"[1]") == [1]
    assert decode_body("application/x-msgpack", msgpack.packb({"a": 1})) == {"a": 1}
    with pytest.raises(WireError, match="not valid"):
        decode_body("application/json", b"{")
    with pytest.raises(WireError, match="not valid"):
        decode_body("application/msgpack", b"\xc1")
    with pytest.raises(WireError, match="unsupported"):
        decode_body("text/plain", b"x")


def test_accept_header_picks_the_framing() -> None:
    assert framing_for_accept(None) == DEFAULT_FRAMING
    assert framing_for_accept("*/*") == DEFAULT_FRAMING
    assert framing_for_accept("application/x-msgpack") == "msgpack"
    assert framing_for_accept("text/html, text/event-stream;q=0.9") == "sse"
    assert framing_for_accept("application/x-ndjson") == "ndjson"


STEPS = [
    Step([1, 2], "hé", 64),
    Step([3], "\n\n"),
    Step([], ""),
    Step([4], "data: x\n\ny", None, "stop", Usage(10, 4, 64)),
]

frames_st = st.lists(
    st.builds(
        lambda ids, text: step_to_frame(Step(ids, text)),
        st.lists(st.integers(0, 2**32 - 1), max_size=4),
        st.text(max_size=20),
    ),
    min_size=1,
    max_size=8,
)


@pytest.mark.parametrize("framing", FRAMINGS)
def test_steps_survive_every_framing(framing: str) -> None:
    data = b"".join(encode_frame(framing, step_to_frame(s)) for s in STEPS)  # type: ignore[arg-type]
    assert [frame_to_step(f) for f in frame_decoder(framing).feed(data)] == STEPS  # type: ignore[arg-type]


@pytest.mark.parametrize("framing", FRAMINGS)
@given(frames=frames_st, cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_decoding_does_not_depend_on_how_bytes_are_split(framing: str, frames: list, cuts: list[int]) -> None:
    data = b"".join(encode_frame(framing, f) for f in frames)  # type: ignore[arg-type]
    points = sorted({c % (len(data) + 1) for c in cuts})
    decoder = frame_decoder(framing)  # type: ignore[arg-type]
    got = []
    prev = 0
    for p in [*points, len(data)]:
        got += decoder.feed(data[prev:p])
        prev = p
    assert [frame_to_step(f) for f in got] == [frame_to_step(f) for f in frames]


def test_error_frames_raise_stream_errors_and_malformed_frames_wire_errors() -> None:
    with pytest.raises(StreamError, match="engine_error: boom"):
        frame_to_step(error_frame("engine_error", "boom"))
    with pytest.raises(WireError):
        frame_to_step({"text": "x"})
    with pytest.raises(WireError, match="finish_reason"):
        frame_to_step({"token_ids": [], "text": "", "finish_reason": "tired"})
    with pytest.raises(WireError):
        frame_decoder("ndjson").feed(b"{nope}\n")


# -- KV events on ZeroMQ ----------------------------------------------------------------------------

EVENTS = [
    AllCleared(7),
    BlockStored(8, (2**64 - 1, 5), None, 64),
    BlockStored(9, (6,), 5, 32),
    BlockRemoved(10, (5, 6)),
]


def test_kv_batches_round_trip_with_sequence_numbers() -> None:
    frames = encode_batch(EVENTS, b"kv")
    assert frames[0] == b"kv" and frames[1] == (7).to_bytes(8, "big")
    assert decode_batch(frames) == EVENTS
    assert peek_range(frames) == (7, 4)


def test_large_batches_peek_their_size() -> None:
    many = [BlockRemoved(i, (i,)) for i in range(1, 70_001)]
    frames = encode_batch(many)
    assert peek_range(frames) == (1, 70_000)
    assert peek_range(encode_batch(many[:300])) == (1, 300)


def test_kv_batches_must_be_consecutive_and_well_formed() -> None:
    with pytest.raises(KvWireError, match="breaks the sequence"):
        encode_batch([AllCleared(1), AllCleared(3)])
    with pytest.raises(KvWireError):
        encode_batch([])
    with pytest.raises(KvWireError, match="3 frames"):
        decode_batch([b"kv", b"x"])
    with pytest.raises(KvWireError, match="unknown event"):
        decode_batch([b"kv", (1).to_bytes(8, "big"), msgpack.packb([["moved"]])])
    with pytest.raises(KvWireError, match="malformed"):
        decode_batch([b"kv", (1).to_bytes(8, "big"), msgpack.packb([["stored"]])])


def test_gap_detector_counts_lost_events_and_restarts() -> None:
    gaps = GapDetector()
    assert gaps.feed(1, 3) == 0
    assert gaps.feed(4, 1) == 0
    assert gaps.feed(10, 2) == 5
    assert gaps.feed(1, 1) == 0  # the engine restarted
    assert (gaps.lost, gaps.gaps, gaps.received) == (5, 2, 7)


def test_family_stops_and_cache_salt_cross_the_wire() -> None:
    sampling = SamplingParams(max_tokens=9, stop=("[e~[",), stop_token_ids=(39, 38), include_stop=True)
    request = GenerateRequest("r", [1, 2], sampling, cache_salt="tenant-a")
    body = encode_request(request)
    for raw in (json.loads(json.dumps(body)), msgpack.unpackb(msgpack.packb(body))):
        got = decode_request(raw)
        assert got.sampling == sampling and got.cache_salt == "tenant-a"
    assert decode_request(encode_request(GenerateRequest("r", [1]))).cache_salt is None


def test_a_constraint_crosses_the_wire() -> None:
    constraint = Constraint('start: %json{"type":"object"}\n', {"type": "object"})
    request = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=9), constraint=constraint)
    body = encode_request(request)
    for raw in (json.loads(json.dumps(body)), msgpack.unpackb(msgpack.packb(body))):
        assert decode_request(raw).constraint == constraint
    assert decode_request(encode_request(GenerateRequest("r", [1]))).constraint is None
    base = {"token_ids": [1], "sampling": {"max_tokens": 1}}
    for bad, message in (
        ("start", "must be an object"),
        ({"grammar": ""}, "non-empty string"),
        ({"grammar": "x", "regex": "y"}, "unknown constraint fields"),
        ({"grammar": "x", "json_schema": []}, "json_schema must be an object"),
    ):
        with pytest.raises(WireError, match=message):
            decode_request(base | {"constraint": bad})


def test_logprobs_and_logit_bias_cross_the_wire() -> None:
    sampling = SamplingParams(max_tokens=9, logprobs=3, logit_bias=((17, -100.0), (5, 2.5)))
    body = encode_request(GenerateRequest("r", [1, 2], sampling))
    for raw in (json.loads(json.dumps(body)), msgpack.unpackb(msgpack.packb(body))):
        assert decode_request(raw).sampling == sampling
    assert decode_request(encode_request(GenerateRequest("r", [1]))).sampling.logprobs is None
    base = {"token_ids": [1], "sampling": {"max_tokens": 1}}
    for bad in (
        {"logprobs": 21},
        {"logprobs": True},
        {"logit_bias": {"5": 1}},
        {"logit_bias": [[5]]},
        {"logit_bias": [[-1, 1.0]]},
        {"logit_bias": [[5, 101]]},
    ):
        with pytest.raises(WireError, match=r"logprobs|logit_bias"):
            decode_request(base | {"sampling": {"max_tokens": 1, **bad}})
    step = Step([4, 9], "ab", logprobs=[TokenLogprob(4, -0.5, ((4, -0.5), (3, -2.0))), TokenLogprob(9, 0.0)])
    for framing in FRAMINGS:
        (frame,) = frame_decoder(framing).feed(encode_frame(framing, step_to_frame(step)))  # type: ignore[arg-type]
        assert frame_to_step(frame) == step
    assert "logprobs" not in step_to_frame(Step([4], "a"))
    with pytest.raises(WireError):
        frame_to_step({"token_ids": [4], "text": "a", "logprobs": [[4, "x", []]]})
