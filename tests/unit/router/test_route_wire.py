"""The route API's bodies: both encodings round-trip, bad bodies are refused with a reason."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentserve.router.placement import Decision, RouteRequest
from agentserve.router.wire import (
    RouteWireError,
    decode_decision,
    decode_route,
    decode_ticket,
    decode_worker,
    encode_decision,
    encode_route,
    encode_ticket,
    encode_worker,
    encoding_of,
)

U64 = st.integers(0, (1 << 64) - 1)


@given(
    hashes=st.lists(U64, max_size=50),
    tokens=st.integers(0, 10**6),
    session=st.none() | st.text(max_size=10),
    priority=st.integers(-(2**31), 2**31),
    osl=st.none() | st.integers(0, 10**5),
    exclude=st.frozensets(st.text(min_size=1, max_size=5), max_size=3),
    encoding=st.sampled_from(["msgpack", "json"]),
)
def test_route_requests_round_trip(
    *,
    hashes: list[int],
    tokens: int,
    session: str | None,
    priority: int,
    osl: int | None,
    exclude: frozenset[str],
    encoding: str,
) -> None:
    request = RouteRequest(hashes, tokens, session, priority, osl)
    call = decode_route(encode_route(request, exclude, encoding), encoding)  # type: ignore[arg-type]
    assert list(call.request.block_hashes) == hashes
    assert (call.request.prompt_tokens, call.request.session_id) == (tokens, session)
    assert (call.request.priority, call.request.osl, call.exclude) == (priority, osl, exclude)


def test_msgpack_carries_hashes_as_one_little_endian_blob() -> None:
    body = msgpack.unpackb(encode_route(RouteRequest([1, 2**64 - 1], 64), frozenset(), "msgpack"))
    assert body["block_hashes"] == b"\x01" + b"\x00" * 7 + b"\xff" * 8
    assert set(body) == {"block_hashes", "prompt_tokens"}  # defaults are left out


def test_decisions_round_trip() -> None:
    d = Decision("w-1", 3, 10, 7.5, "kv", 42)
    for encoding in ("msgpack", "json"):
        back, url = decode_decision(encode_decision(d, "http://h:1", encoding), encoding)  # type: ignore[arg-type]
        assert back == d and url == "http://h:1"
    assert decode_ticket(encode_ticket(9, "msgpack"), "msgpack") == 9
    assert decode_worker(encode_worker("w", "json"), "json") == "w"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"block_hashes": [1]}, "prompt_tokens is required"),
        ({"prompt_tokens": -1}, "prompt_tokens must be an integer ≥ 0"),
        ({"prompt_tokens": 1, "block_hashes": [1.5]}, "unsigned 64-bit"),
        ({"prompt_tokens": 1, "block_hashes": [2**64]}, "unsigned 64-bit"),
        ({"prompt_tokens": 1, "block_hashes": "ab"}, "array of integers"),
        ({"prompt_tokens": 1, "session_id": 3}, "session_id must be a string"),
        ({"prompt_tokens": 1, "priority": "high"}, "priority must be an integer"),
        ({"prompt_tokens": 1, "exclude": "w"}, "exclude must be an array"),
        ({"prompt_tokens": 1, "colour": "red"}, "unknown fields: colour"),
        ({"prompt_tokens": True}, "prompt_tokens must be an integer"),
    ],
)
def test_bad_route_bodies_are_refused_with_the_reason(body: dict[str, object], message: str) -> None:
    with pytest.raises(RouteWireError, match=message):
        decode_route(json.dumps(body).encode(), "json")


def test_bad_encodings_are_refused() -> None:
    with pytest.raises(RouteWireError, match="whole number of 8-byte"):
        decode_route(msgpack.packb({"prompt_tokens": 1, "block_hashes": b"abc"}), "msgpack")
    with pytest.raises(RouteWireError, match="malformed json"):
        decode_route(b"{", "json")
    with pytest.raises(RouteWireError, match="must be an object"):
        decode_route(b"[]", "json")
    with pytest.raises(RouteWireError, match="unsupported content type"):
        encoding_of("text/plain")
    assert encoding_of("application/json; charset=utf-8") == "json"
    assert encoding_of(None) == "json"
    with pytest.raises(RouteWireError, match="malformed decision"):
        decode_decision(b'{"worker": "w"}', "json")
