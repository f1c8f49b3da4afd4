"""Many generate streams on one worker connection: the multiplexed framing (pure, sans-IO).

Per-request HTTP streams cost a socket write on the worker and a read on the frontend for every
token of every stream (half of each process in the per-token regime, docs/frontend.md). On a
multiplexed connection the worker writes the frames of all its streams that one engine step
produced in one write, and the frontend reads and demultiplexes them in one go.

The connection is one HTTP/1.1 exchange kept open both ways: `POST /generate/mux` with a chunked
request body that carries the client's messages and a chunked response that carries the
worker's. Each message is a msgpack array (concatenated, no other framing)::

    client -> worker   [OPEN, sid, body]             body: the /generate request (agentserve.worker.wire)
                       [CANCEL, sid]                 the caller left: abort the engine request
    worker -> client   [ACCEPT, sid]                 the engine took the request (HTTP's 200)
                       [REFUSE, sid, status, error]  error {"type", "message"}; status as /generate's
                       [FRAME, sid, frame]           a step frame or an error frame (wire.step_to_frame)
                       [TOKENS, sid, token_ids, text]  a step with nothing else (most of them): no
                                                     map to build and decode per token
                       [STEPS, [sid, ...], [token_ids, ...], [text, ...]]  TOKENS of many streams
                                                     (one engine step's, in one message)

`sid` is the client's stream number on this connection (unique while open). A stream ends with
its frame that has a `finish_reason` or an `error`, or with REFUSE. The connection ending ends all
of its streams (the worker aborts them; the client fails them, and the router migrates them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import msgpack

from agentserve.worker.engine import Step
from agentserve.worker.wire import Frame, WireError, step_to_frame

MEDIA_TYPE = "application/x-agentserve-mux"
PATH = "/generate/mux"

OPEN, CANCEL = 0, 1
ACCEPT, REFUSE, FRAME, TOKENS, STEPS = 0, 1, 2, 3, 4


@dataclass(frozen=True, slots=True)
class Open:
    sid: int
    body: Any


@dataclass(frozen=True, slots=True)
class Cancel:
    sid: int


@dataclass(frozen=True, slots=True)
class Accepted:
    sid: int


@dataclass(frozen=True, slots=True)
class Refused:
    sid: int
    status: int
    kind: str
    message: str


@dataclass(slots=True)
class Steps:
    """A STEPS message: entry i is stream `sids[i]`'s step (`token_ids[i]`, `texts[i]`)."""

    sids: list[int]
    token_ids: list[list[int]]
    texts: list[str]


ClientMessage: TypeAlias = Open | Cancel
# Frames are the hot path: they come out as tuples, not dataclasses: (sid, frame) or
# (sid, token_ids, text).
WorkerMessage: TypeAlias = Accepted | Refused | Steps | tuple[int, Frame] | tuple[int, list[int], str]

_pack = msgpack.Packer().pack


def encode_open(sid: int, body: Frame) -> bytes:
    return _pack([OPEN, sid, body])  # type: ignore[no-any-return]


def encode_cancel(sid: int) -> bytes:
    return _pack([CANCEL, sid])  # type: ignore[no-any-return]


def encode_accept(sid: int) -> bytes:
    return _pack([ACCEPT, sid])  # type: ignore[no-any-return]


def encode_refuse(sid: int, status: int, kind: str, message: str) -> bytes:
    return _pack([REFUSE, sid, status, {"type": kind, "message": message}])  # type: ignore[no-any-return]


def encode_frame(sid: int, frame: Frame) -> bytes:
    return _pack([FRAME, sid, frame])  # type: ignore[no-any-return]


def plain(step: Step) -> bool:
    """The step carries tokens and text only (it can go in TOKENS or STEPS)."""
    return (
        step.cached_tokens is None
        and step.finish_reason is None
        and step.logprobs is None
        and step.received_tokens is None
    )


def encode_steps(sids: list[int], token_ids: list[Any], texts: list[str]) -> bytes:
    """Plain steps of several streams (the same length each list) as one STEPS message."""
    return _pack([STEPS, sids, token_ids, texts])  # type: ignore[no-any-return]


def encode_step(sid: int, step: Step) -> bytes:
    """A step as TOKENS when that is all it carries, else as a FRAME."""
    if plain(step):
        return _pack([TOKENS, sid, step.token_ids, step.text])  # type: ignore[no-any-return]
    return _pack([FRAME, sid, step_to_frame(step)])  # type: ignore[no-any-return]


def _sid(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise WireError(f"a stream id is a non-negative integer, not {value!r}")
    return value


class _Decoder:
    def __init__(self) -> None:
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=64 * 1024 * 1024 + 4096)

    def _messages(self, data: bytes) -> list[Any]:
        self._unpacker.feed(data)
        try:
            messages = list(self._unpacker)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
            raise WireError("malformed mux message") from exc
        for m in messages:
            if not isinstance(m, list) or len(m) < 2:
                raise WireError(f"a mux message is an array [kind, sid, ...], not {m!r:.80}")
        return messages


class ClientMessageDecoder(_Decoder):
    """The worker's side: bytes from the client in, `Open`/`Cancel` out."""

    def feed(self, data: bytes) -> list[ClientMessage]:
        out: list[ClientMessage] = []
        for m in self._messages(data):
            kind = m[0]
            if kind == OPEN and len(m) == 3:
                out.append(Open(_sid(m[1]), m[2]))
            elif kind == CANCEL and len(m) == 2:
                out.append(Cancel(_sid(m[1])))
            else:
                raise WireError(f"unknown client mux message {m!r:.80}")
        return out


class WorkerMessageDecoder(_Decoder):
    """The frontend's side: bytes from the worker in, `Accepted`/`Refused`/(sid, frame) out."""

    def feed(self, data: bytes) -> list[WorkerMessage]:
        out: list[WorkerMessage] = []
        for m in self._messages(data):
            kind = m[0]
            if kind == STEPS and len(m) == 4:
                sids, ids, texts = m[1], m[2], m[3]
                if not (type(sids) is list and type(ids) is list and type(texts) is list):
                    raise WireError("a STEPS message is [4, [sid...], [token_ids...], [text...]]")
                if not len(sids) == len(ids) == len(texts):
                    raise WireError("a STEPS message's lists differ in length")
                # Checked in C-speed passes, not a Python loop per entry: most tokens come this way.
                if not (
                    all(type(x) is int and x >= 0 for x in sids)
                    and all(type(x) is list for x in ids)
                    and all(type(x) is str for x in texts)
                ):
                    raise WireError("a STEPS entry is a stream id, token ids and a text")
                out.append(Steps(sids, ids, texts))
            elif kind == TOKENS and len(m) == 4 and isinstance(m[2], list) and isinstance(m[3], str):
                out.append((_sid(m[1]), m[2], m[3]))
            elif kind == FRAME and len(m) == 3 and isinstance(m[2], dict):
                out.append((_sid(m[1]), m[2]))
            elif kind == ACCEPT and len(m) == 2:
                out.append(Accepted(_sid(m[1])))
            elif kind == REFUSE and len(m) == 4 and isinstance(m[3], dict) and type(m[2]) is int:
                err = m[3]
                out.append(
                    Refused(_sid(m[1]), m[2], str(err.get("type", "error")), str(err.get("message", "")))
                )
            else:
                raise WireError(f"unknown worker mux message {m!r:.80}")
        return out


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk of a chunked body (the client's request side)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


__all__ = [
    "MEDIA_TYPE",
    "PATH",
    "Accepted",
    "Cancel",
    "ClientMessage",
    "ClientMessageDecoder",
    "Open",
    "Refused",
    "Steps",
    "WorkerMessage",
    "WorkerMessageDecoder",
    "chunk",
    "encode_accept",
    "encode_cancel",
    "encode_frame",
    "encode_open",
    "encode_refuse",
    "encode_step",
    "encode_steps",
    "plain",
]
