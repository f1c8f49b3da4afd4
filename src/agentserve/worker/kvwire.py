"""KV events on the ZeroMQ wire (pure encode/decode, and a gap detector for subscribers).

One PUB message carries a batch of consecutive events (usually one engine iteration's)::

    frame 0  topic                  b"kv" by default (subscribers filter on it)
    frame 1  first sequence number  8 bytes, unsigned big-endian
    frame 2  events                 msgpack array; event i has sequence number first + i:
               ["stored", [hash, ...], parent_hash or nil, num_tokens]
               ["removed", [hash, ...]]
               ["cleared"]

Hashes are unsigned 64-bit `block_hashes` values. Sequence numbers start at 1 when an engine
starts (its first event is `cleared`) and grow by one per event; a subscriber that sees a jump
lost events (a slow subscriber past the PUB high-water mark, or it joined late) and resyncs from
the worker's snapshot endpoint.

A heartbeat is an empty batch whose sequence number is the *next* one the publisher will use
(last published + 1). A publisher sends one whenever it has been idle for `HEARTBEAT_INTERVAL_S`,
so a subscriber tells a quiet worker from a dead one, and also learns of events lost at the end
of a burst (the heartbeat's number jumps) without waiting for the next event. Subscribers that
only decode events see heartbeats as empty lists.

Attention data parallelism: an engine whose ranks each hold their own KV cache publishes one stream
per rank, each numbered from 1 by itself, on the topic `<topic>/<rank>` (`rank_topic`); a worker
without ranks uses `<topic>` alone. A subscriber to `<topic>` receives every rank's stream (ZeroMQ
filters by prefix) and tells them apart by the message's topic frame (`topic_rank`); a snapshot
is per rank too (`GET /kv/snapshot?dp_rank=N`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgpack

from agentserve.worker.engine import MEDIUM_CPU, MEDIUM_GPU, AllCleared, BlockRemoved, BlockStored, KvEvent

DEFAULT_TOPIC = b"kv"
HEARTBEAT_INTERVAL_S = 0.5  # an idle publisher sends a heartbeat this often
_SEQ = struct.Struct(">Q")
_EMPTY_ARRAY = b"\x90"  # msgpack fixarray of length 0


class KvWireError(ValueError):
    pass


def rank_topic(topic: bytes, dp_rank: int | None) -> bytes:
    """The topic of one attention-DP rank's stream (`topic` itself without ranks)."""
    return topic if dp_rank is None else topic + b"/" + str(dp_rank).encode()


def topic_rank(frame: bytes, topic: bytes) -> int | None:
    """The attention-DP rank a message's topic frame names (None: a worker without ranks)."""
    if frame == topic:
        return None
    rest = frame[len(topic) + 1 :]
    if not frame.startswith(topic + b"/") or not rest.isdigit() or len(rest) > 6:
        raise KvWireError(f"unknown KV event topic {frame[:64]!r}")
    return int(rest)


def split_by_rank(events: Sequence[KvEvent]) -> dict[int | None, list[KvEvent]]:
    """A batch's events per attention-DP rank, in order (one entry, None, without ranks)."""
    first = events[0].dp_rank if events else None
    if all(e.dp_rank == first for e in events):  # the common case: one rank per batch
        return {first: list(events)}
    out: dict[int | None, list[KvEvent]] = {}
    for event in events:
        out.setdefault(event.dp_rank, []).append(event)
    return out


def _event_body(event: KvEvent) -> list[Any]:
    # The tier goes last and only when it is not the GPU: older peers read the same bytes.
    if isinstance(event, BlockStored):
        body = ["stored", list(event.block_hashes), event.parent_hash, event.num_tokens]
        if event.medium != MEDIUM_GPU:
            body.append(event.medium)
        return body
    if isinstance(event, BlockRemoved):
        return (
            ["removed", list(event.block_hashes)]
            if event.medium == MEDIUM_GPU
            else [
                "removed",
                list(event.block_hashes),
                event.medium,
            ]
        )
    return ["cleared"]


def _medium(value: object) -> str:
    if value not in (MEDIUM_GPU, MEDIUM_CPU):
        raise KvWireError(f"unknown KV medium {value!r}")
    return str(value)


def encode_batch(events: Sequence[KvEvent], topic: bytes = DEFAULT_TOPIC) -> list[bytes]:
    """The frames of one message; the events' sequence numbers must be consecutive."""
    if not events:
        raise KvWireError("an empty batch has no sequence number")
    first = events[0].seq
    for i, event in enumerate(events):
        if event.seq != first + i:
            raise KvWireError(f"event {event.seq} breaks the sequence after {first + i - 1}")
    payload = msgpack.packb([_event_body(e) for e in events])
    return [topic, _SEQ.pack(first), payload]


def encode_heartbeat(next_seq: int, topic: bytes = DEFAULT_TOPIC) -> list[bytes]:
    """An empty batch carrying the sequence number the next event will have."""
    return [topic, _SEQ.pack(next_seq), _EMPTY_ARRAY]


def decode_batch(frames: Sequence[bytes]) -> list[KvEvent]:
    return decode_message(frames)[1]


def decode_message(frames: Sequence[bytes]) -> tuple[int, list[KvEvent]]:
    """(first sequence number, events); no events: a heartbeat, the number is the next one."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise KvWireError("a KV event message has 3 frames: topic, 8-byte sequence number, events")
    (first,) = _SEQ.unpack(frames[1])
    try:
        bodies = msgpack.unpackb(frames[2], raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise KvWireError(f"malformed events payload: {exc}") from exc
    if not isinstance(bodies, list):
        raise KvWireError("the events payload must be an array")
    events: list[KvEvent] = []
    for i, body in enumerate(bodies):
        seq = first + i
        try:
            kind = body[0]
            if kind == "stored":
                medium = body[4] if len(body) > 4 else MEDIUM_GPU
                events.append(BlockStored(seq, tuple(body[1]), body[2], body[3], _medium(medium)))
            elif kind == "removed":
                medium = body[2] if len(body) > 2 else MEDIUM_GPU
                events.append(BlockRemoved(seq, tuple(body[1]), _medium(medium)))
            elif kind == "cleared":
                events.append(AllCleared(seq))
            else:
                raise KvWireError(f"unknown event kind {kind!r}")
        except (IndexError, TypeError) as exc:
            raise KvWireError(f"malformed event {body!r}") from exc
    return first, events


def peek_range(frames: Sequence[bytes]) -> tuple[int, int]:
    """(first sequence number, number of events) without building events (fast gap checks)."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise KvWireError("a KV event message has 3 frames: topic, 8-byte sequence number, events")
    (first,) = _SEQ.unpack(frames[1])
    header = frames[2][:5]
    if not header:
        raise KvWireError("empty events payload")
    tag = header[0]
    if tag & 0xF0 == 0x90:  # fixarray
        return first, tag & 0x0F
    if tag == 0xDC:
        return first, int.from_bytes(header[1:3], "big")
    if tag == 0xDD:
        return first, int.from_bytes(header[1:5], "big")
    raise KvWireError("the events payload must be an array")


class GapDetector:
    """Tracks the next expected sequence number; reports events lost in between."""

    def __init__(self) -> None:
        self.expected: int | None = None
        self.lost = 0
        self.gaps = 0
        self.received = 0

    def feed(self, first: int, count: int) -> int:
        """Account for events first..first+count-1; returns how many were missed before them."""
        missed = 0
        if self.expected is not None and first != self.expected:
            if first > self.expected:
                missed = first - self.expected
                self.lost += missed
            self.gaps += 1  # a jump back means the engine restarted: also a resync point
        self.expected = first + count
        self.received += count
        return missed
