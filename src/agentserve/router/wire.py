"""The route API's bodies: what a frontend sends on every request and what it gets back (pure).

Two encodings, chosen by `Content-Type` (the reply uses the request's):

- `application/x-msgpack` (what `RouterClient` sends): a map whose `block_hashes` is one `bin`
  value, the hashes as little-endian unsigned 64-bit integers back to back. A 24K-token prompt
  has 750 hashes: 6 KB, decoded with one `array.frombytes` instead of 750 integer objects.
- `application/json` (curl, debugging): `block_hashes` is an array of integers.

::

    POST /route          {"block_hashes", "prompt_tokens", "session_id"?, "priority"?, "osl"?, "exclude"?,
                          "parent_session_id"?}
      200                {"worker", "url", "overlap_blocks", "prompt_blocks", "cost", "policy", "ticket"}
    POST /finish         {"ticket"}                 204
    POST /worker_failed  {"worker"}                 204
    errors               {"error": {"type", "message"}}  (JSON, whatever the request's encoding)

docs/router.md has the measured cost of each encoding.
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import msgpack

from agentserve.router.disagg import PrefillPlan
from agentserve.router.placement import Decision, RouteRequest

MSGPACK = "application/x-msgpack"
JSON = "application/json"
Encoding = Literal["msgpack", "json"]
_U64_MAX = (1 << 64) - 1
_BIG_ENDIAN = sys.byteorder == "big"


class RouteWireError(ValueError):
    """A body the route API cannot read (the service answers 400)."""


def encoding_of(content_type: str | None) -> Encoding:
    base = (content_type or JSON).split(";", 1)[0].strip().lower()
    if base in (MSGPACK, "application/msgpack", "application/vnd.msgpack"):
        return "msgpack"
    if base == JSON:
        return "json"
    raise RouteWireError(f"unsupported content type {content_type!r} (use {MSGPACK} or {JSON})")


def media_type(encoding: Encoding) -> str:
    return MSGPACK if encoding == "msgpack" else JSON


def dumps(obj: Mapping[str, Any], encoding: Encoding) -> bytes:
    if encoding == "msgpack":
        data: bytes = msgpack.packb(obj)
        return data
    return json.dumps(obj, separators=(",", ":")).encode()


def loads(body: bytes, encoding: Encoding) -> dict[str, Any]:
    try:
        obj = msgpack.unpackb(body, raw=False) if encoding == "msgpack" else json.loads(body)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise RouteWireError(f"malformed {encoding} body: {exc}") from exc
    if not isinstance(obj, dict):
        raise RouteWireError("the body must be an object")
    return obj


def pack_hashes(hashes: Sequence[int]) -> bytes:
    packed = array("Q", hashes)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def unpack_hashes(data: bytes) -> array[int]:
    if len(data) % 8:
        raise RouteWireError("block_hashes must be a whole number of 8-byte values")
    hashes = array("Q")
    hashes.frombytes(data)
    if _BIG_ENDIAN:
        hashes.byteswap()
    return hashes


# -- /route ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RouteCall:
    request: RouteRequest
    exclude: frozenset[str]


def encode_route(request: RouteRequest, exclude: frozenset[str], encoding: Encoding) -> bytes:
    body: dict[str, Any] = {
        "block_hashes": pack_hashes(request.block_hashes)
        if encoding == "msgpack"
        else list(request.block_hashes),
        "prompt_tokens": request.prompt_tokens,
    }
    if request.session_id is not None:
        body["session_id"] = request.session_id
    if request.priority:
        body["priority"] = request.priority
    if request.osl is not None:
        body["osl"] = request.osl
    if request.parent_session_id is not None:
        body["parent_session_id"] = request.parent_session_id
    if exclude:
        body["exclude"] = sorted(exclude)
    return dumps(body, encoding)


def decode_route(body: bytes, encoding: Encoding) -> RouteCall:
    data = loads(body, encoding)
    unknown = set(data) - {
        "block_hashes",
        "prompt_tokens",
        "session_id",
        "priority",
        "osl",
        "exclude",
        "parent_session_id",
    }
    if unknown:
        raise RouteWireError(f"unknown fields: {', '.join(sorted(unknown))}")
    raw = data.get("block_hashes", [])
    hashes: Sequence[int]
    if isinstance(raw, bytes):
        hashes = unpack_hashes(raw)
    elif isinstance(raw, list):
        if not all(type(h) is int and 0 <= h <= _U64_MAX for h in raw):
            raise RouteWireError("block_hashes must be unsigned 64-bit integers")
        hashes = raw
    else:
        raise RouteWireError("block_hashes must be an array of integers (or msgpack bin)")
    prompt_tokens = _int(data, "prompt_tokens", required=True, minimum=0)
    assert prompt_tokens is not None
    session = data.get("session_id")
    if session is not None and not isinstance(session, str):
        raise RouteWireError("session_id must be a string")
    parent = data.get("parent_session_id")
    if parent is not None and not isinstance(parent, str):
        raise RouteWireError("parent_session_id must be a string")
    exclude = data.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(w, str) for w in exclude):
        raise RouteWireError("exclude must be an array of worker ids")
    request = RouteRequest(
        hashes,
        prompt_tokens,
        session,
        _int(data, "priority") or 0,
        _int(data, "osl", minimum=0),
        parent,
    )
    return RouteCall(request, frozenset(exclude))


def _int(
    data: Mapping[str, Any], key: str, *, required: bool = False, minimum: int | None = None
) -> int | None:
    value = data.get(key)
    if value is None:
        if required:
            raise RouteWireError(f"{key} is required")
        return None
    if type(value) is not int or (minimum is not None and value < minimum):
        bound = f" ≥ {minimum}" if minimum is not None else ""
        raise RouteWireError(f"{key} must be an integer{bound}")
    return value


def encode_decision(decision: Decision, url: str, encoding: Encoding, prefill_url: str = "") -> bytes:
    """The route reply; with prefill workers, the prefill plan and the prefill worker's URL."""
    plan = decision.prefill
    return dumps(
        {
            "worker": decision.worker,
            "url": url,
            "overlap_blocks": decision.overlap_blocks,
            "prompt_blocks": decision.prompt_blocks,
            "cost": decision.cost,
            "policy": decision.policy,
            "ticket": decision.ticket,
            **({} if decision.dp_rank is None else {"dp_rank": decision.dp_rank}),
            **({} if plan is None else {"prefill": {**asdict(plan), "url": prefill_url}}),
        },
        encoding,
    )


def decode_decision(body: bytes, encoding: Encoding) -> tuple[Decision, str]:
    decision, url, _ = decode_routed(body, encoding)
    return decision, url


def decode_routed(body: bytes, encoding: Encoding) -> tuple[Decision, str, str]:
    """(decision, the worker's URL, the prefill worker's URL ("" without a remote prefill))."""
    data = loads(body, encoding)
    try:
        raw = data.get("prefill")
        plan = None if raw is None else _prefill_plan(raw)
        decision = Decision(
            str(data["worker"]),
            int(data["overlap_blocks"]),
            int(data["prompt_blocks"]),
            float(data["cost"]),
            str(data["policy"]),
            int(data["ticket"]),
            dp_rank=None if data.get("dp_rank") is None else int(data["dp_rank"]),
            prefill=plan,
        )
        return decision, str(data["url"]), "" if raw is None else str(raw.get("url") or "")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RouteWireError(f"malformed decision: {exc}") from exc


def _prefill_plan(raw: Mapping[str, Any]) -> PrefillPlan:
    where = raw["where"]
    if where not in ("local", "remote"):
        raise ValueError(f"prefill.where {where!r}")
    remote = raw.get("remote_ttft_s")
    worker = raw.get("prefill_worker")
    ticket = raw.get("ticket")
    return PrefillPlan(
        where,
        str(raw["reason"]),
        int(raw["uncached_tokens"]),
        int(raw["threshold"]),
        float(raw["local_ttft_s"]),
        float(raw["local_stall_s"]),
        prefill_worker=None if worker is None else str(worker),
        remote_ttft_s=None if remote is None else float(remote),
        transfer_tokens=int(raw.get("transfer_tokens", 0)),
        transfer_s=float(raw.get("transfer_s", 0.0)),
        ticket=None if ticket is None else int(ticket),
    )


# -- /finish, /worker_failed -----------------------------------------------------------------------


def encode_ticket(ticket: int, encoding: Encoding) -> bytes:
    return dumps({"ticket": ticket}, encoding)


def decode_ticket(body: bytes, encoding: Encoding) -> int:
    ticket = _int(loads(body, encoding), "ticket", required=True, minimum=0)
    assert ticket is not None
    return ticket


def encode_worker(worker: str, encoding: Encoding) -> bytes:
    return dumps({"worker": worker}, encoding)


def decode_worker(body: bytes, encoding: Encoding) -> str:
    worker = loads(body, encoding).get("worker")
    if not isinstance(worker, str) or not worker:
        raise RouteWireError("worker must be a non-empty string")
    return worker


def error_body(kind: str, message: str) -> bytes:
    return json.dumps({"error": {"type": kind, "message": message}}).encode()
