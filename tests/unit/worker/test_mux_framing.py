"""The multiplexed generate framing (agentserve.worker.mux): bytes in, events out, in any split."""

from __future__ import annotations

import msgpack
import pytest

from agentserve.worker import mux
from agentserve.worker.wire import WireError


def test_client_messages_round_trip_through_any_split() -> None:
    data = mux.encode_open(0, {"token_ids": [1, 2], "sampling": {"max_tokens": 3}}) + mux.encode_cancel(7)
    data += mux.encode_open(1, {"token_ids": [3]})
    for size in (1, 2, 3, 5, len(data)):
        decoder = mux.ClientMessageDecoder()
        events: list[mux.ClientMessage] = []
        for i in range(0, len(data), size):
            events += decoder.feed(data[i : i + size])
        assert events == [
            mux.Open(0, {"token_ids": [1, 2], "sampling": {"max_tokens": 3}}),
            mux.Cancel(7),
            mux.Open(1, {"token_ids": [3]}),
        ]


def test_worker_messages_round_trip_and_frames_come_out_as_tuples() -> None:
    frame = {"token_ids": [5], "text": "hé", "cached_tokens": 4}
    data = (
        mux.encode_accept(3)
        + mux.encode_frame(3, frame)
        + mux.encode_refuse(4, 409, "duplicate_request", "in use")
        + mux.encode_frame(3, {"error": {"type": "engine_error", "message": "x"}})
    )
    decoder = mux.WorkerMessageDecoder()
    out = []
    for b in data:  # one byte at a time: nothing lost or duplicated at any boundary
        out += decoder.feed(bytes([b]))
    assert out == [
        mux.Accepted(3),
        (3, frame),
        mux.Refused(4, 409, "duplicate_request", "in use"),
        (3, {"error": {"type": "engine_error", "message": "x"}}),
    ]


@pytest.mark.parametrize(
    "raw",
    [
        msgpack.packb([9, 1]),  # unknown kind
        msgpack.packb([0, -1, {}]),  # negative stream id
        msgpack.packb([0, "a", {}]),  # stream id not an integer
        msgpack.packb({"kind": 0}),  # not an array
        msgpack.packb([1]),  # too short
        msgpack.packb([1, True]),  # a bool is not a stream id
        b"\xc1",  # never-used msgpack byte
    ],
)
def test_malformed_client_messages_raise_wire_errors(raw: bytes) -> None:
    with pytest.raises(WireError):
        mux.ClientMessageDecoder().feed(raw)


@pytest.mark.parametrize(
    "raw",
    [
        msgpack.packb([2, 1, "not a frame"]),
        msgpack.packb([1, 1, "503", {}]),  # refusal status not an integer
        msgpack.packb([0, 1, 2]),  # accept with extra fields
        msgpack.packb([7, 1]),
    ],
)
def test_malformed_worker_messages_raise_wire_errors(raw: bytes) -> None:
    with pytest.raises(WireError):
        mux.WorkerMessageDecoder().feed(raw)


def test_chunk_is_http1_chunked_encoding() -> None:
    assert mux.chunk(b"hello") == b"5\r\nhello\r\n"
    assert mux.chunk(b"x" * 26) == b"1a\r\n" + b"x" * 26 + b"\r\n"


def test_plain_steps_go_as_tokens_and_the_rest_as_frames() -> None:
    from agentserve.conversation import Usage
    from agentserve.worker.engine import Step

    plain = Step([7, 8], "ab")
    first = Step([1], "x", cached_tokens=16)
    last = Step([2], "y", finish_reason="stop", usage=Usage(3, 2, 0))
    data = b"".join(mux.encode_step(5, s) for s in (first, plain, last))
    out = mux.WorkerMessageDecoder().feed(data)
    assert out[1] == (5, [7, 8], "ab")  # no map for a plain step
    assert out[0] == (5, {"token_ids": [1], "text": "x", "cached_tokens": 16})
    frame = out[2][1]
    assert isinstance(frame, dict) and frame["finish_reason"] == "stop"
    assert frame["usage"] == {"input_tokens": 3, "output_tokens": 2, "cached_tokens": 0}
    assert len(mux.encode_step(5, plain)) < len(mux.encode_frame(5, {"token_ids": [7, 8], "text": "ab"}))


def test_steps_messages_carry_many_streams_and_reject_ragged_lists() -> None:
    data = mux.encode_steps([1, 4], [[10], [11, 12]], ["a", "bc"])
    assert mux.WorkerMessageDecoder().feed(data) == [mux.Steps([1, 4], [[10], [11, 12]], ["a", "bc"])]
    with pytest.raises(WireError):
        mux.WorkerMessageDecoder().feed(mux.encode_steps([1, 4], [[10]], ["a", "b"]))
    with pytest.raises(WireError):
        mux.WorkerMessageDecoder().feed(msgpack.packb([4, [1], [7], ["a"]]))  # ids not a list
    with pytest.raises(WireError):
        mux.WorkerMessageDecoder().feed(msgpack.packb([4, [-1], [[7]], ["a"]]))  # negative sid
    with pytest.raises(WireError):
        mux.WorkerMessageDecoder().feed(msgpack.packb([4, [1], [[7]], [b"a"]]))  # text not a str


def test_steps_with_logprobs_go_as_frames_and_merge() -> None:
    from agentserve.worker.client import merge_steps
    from agentserve.worker.engine import Step, TokenLogprob
    from agentserve.worker.wire import frame_to_step

    first = Step([7], "a", logprobs=[TokenLogprob(7, -0.25, ((7, -0.25),))])
    second = Step([8], "b", logprobs=[TokenLogprob(8, 0.0)])
    assert not mux.plain(first)
    out = mux.WorkerMessageDecoder().feed(mux.encode_step(2, first) + mux.encode_step(2, second))
    steps = [frame_to_step(frame) for _, frame in out]  # type: ignore[misc]
    assert steps == [first, second]
    merged = merge_steps(steps)
    assert (merged.token_ids, merged.text, merged.logprobs) == (
        [7, 8],
        "ab",
        [*first.logprobs, *second.logprobs],
    )  # type: ignore[misc]
