"""Harness tool events: strict validation, and the join to the request that dispatched the call.

A harness reports each tool execution as `tool_start` and then `tool_end` or `tool_error`, keyed by
the session id it sends on its requests and the tool-call id the model gave the call. The shape
follows Dynamo's agent-trace records (`agent_context` + `tool`, same field names), JSON instead of
msgpack:

    {"event_type": "tool_end", "event_time_unix_ms": 1754000000123,
     "agent_context": {"session_id": "s-1"},
     "tool": {"tool_call_id": "call_1", "tool_name": "Bash", "started_at_unix_ms": 1754000000001,
              "ended_at_unix_ms": 1754000000123, "output_bytes": 512}}

Everything is untrusted: sizes and charsets are bounded, unknown keys are rejected, and the error
names the offending field (`ToolEventError` is an `InvalidRequestError`, so the HTTP layer answers
400 in the OpenAI error shape like any other bad request).

`DispatchIndex` remembers recent dispatches (session id + call id → request) in a bounded LRU, so a
tool event is joined to its request while it happens: the record written to the sink names the
dispatching request and the gap from dispatch to tool start. Events whose call is unknown (evicted,
or dispatched by another frontend replica) are still recorded; the trace CLI joins those offline by
the same keys.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, get_args

from agentserve.api._check import (
    at,
    check_surrogates,
    expect_dict,
    expect_list,
    opt_dict,
    opt_int,
    opt_number,
    opt_str,
)
from agentserve.api.errors import InvalidRequestError
from agentserve.api.nvext import MAX_ID_LENGTH, is_valid_id
from agentserve.telemetry.trace import SCHEMA, DispatchedCall

ToolEventType: TypeAlias = Literal["tool_start", "tool_end", "tool_error"]
TOOL_EVENT_TYPES: tuple[str, ...] = get_args(ToolEventType)
ToolStatus: TypeAlias = Literal["running", "succeeded", "error", "cancelled"]
TOOL_STATUSES: tuple[str, ...] = get_args(ToolStatus)

MAX_BODY_BYTES = 64 * 1024  # one HTTP body or one ZeroMQ message
MAX_EVENTS_PER_BODY = 100
MAX_FRAMES = 3  # [payload] or Dynamo-style [topic, seq, payload]
MAX_DURATION_MS = 7 * 24 * 3600 * 1000.0
MAX_UNIX_MS = 2**53  # beyond this a JSON number is not an exact integer anywhere

_SCHEMAS = (SCHEMA, "dynamo.agent.trace.v1")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:/@+-]{1,128}\Z")  # MCP names: mcp__server__tool
_TOKEN = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")

# Synonyms harnesses send for the same outcome (Dynamo accepts these too).
_STATUS_SYNONYMS: dict[str, ToolStatus] = {
    "running": "running",
    "started": "running",
    "succeeded": "succeeded",
    "success": "succeeded",
    "ok": "succeeded",
    "completed": "succeeded",
    "error": "error",
    "failed": "error",
    "failure": "error",
    "cancelled": "cancelled",
    "canceled": "cancelled",
}
_ALLOWED_STATUS: dict[str, tuple[ToolStatus, ...]] = {
    "tool_start": ("running",),
    "tool_end": ("succeeded", "cancelled", "error"),
    "tool_error": ("error", "cancelled"),
}
_DEFAULT_STATUS: dict[str, ToolStatus] = {
    "tool_start": "running",
    "tool_end": "succeeded",
    "tool_error": "error",
}

_TOP_KEYS = frozenset({"schema", "event_type", "event_time_unix_ms", "event_source", "agent_context", "tool"})
_CONTEXT_KEYS = frozenset({"session_id", "parent_session_id", "trajectory_id"})
_TOOL_KEYS = frozenset(
    {
        "tool_call_id",
        "tool_name",
        "tool_class",
        "status",
        "started_at_unix_ms",
        "ended_at_unix_ms",
        "duration_ms",
        "output_bytes",
        "output_tokens",
        "error_type",
    }
)


class ToolEventError(InvalidRequestError):
    """A tool event that does not fit the schema (400 on the HTTP endpoint, counted on ZeroMQ)."""


@dataclass(frozen=True, slots=True)
class ToolEvent:
    event_type: ToolEventType
    session_id: str
    tool_call_id: str
    event_time_unix_ms: float
    status: ToolStatus
    parent_session_id: str | None = None
    trajectory_id: str | None = None
    tool_name: str | None = None
    tool_class: str | None = None
    started_at_unix_ms: float | None = None
    ended_at_unix_ms: float | None = None
    duration_ms: float | None = None
    output_bytes: int | None = None
    output_tokens: int | None = None
    error_type: str | None = None

    @property
    def terminal(self) -> bool:
        return self.event_type != "tool_start"


@dataclass(frozen=True, slots=True)
class ToolEventRecord:
    """What goes to the trace sink: the event, and the request that dispatched the call if known."""

    event: ToolEvent
    dispatch: DispatchedCall | None = None

    @property
    def dispatch_to_start_ms(self) -> float | None:
        if self.dispatch is None or self.event.started_at_unix_ms is None:
            return None
        return round(self.event.started_at_unix_ms - self.dispatch.dispatch_unix_ms, 3)

    def to_json(self) -> dict[str, Any]:
        e = self.event
        tool_name = e.tool_name
        if tool_name is None and self.dispatch is not None and _TOOL_NAME.match(self.dispatch.name):
            tool_name = self.dispatch.name  # the model's name for the call, when the harness sent none
        return {
            "schema": SCHEMA,
            "event_type": e.event_type,
            "event_time_unix_ms": e.event_time_unix_ms,
            "event_source": "harness",
            "agent_context": {
                "session_id": e.session_id,
                "parent_session_id": e.parent_session_id,
                "trajectory_id": e.trajectory_id,
            },
            "tool": {
                "tool_call_id": e.tool_call_id,
                "tool_name": tool_name,
                "tool_class": e.tool_class,
                "status": e.status,
                "started_at_unix_ms": e.started_at_unix_ms,
                "ended_at_unix_ms": e.ended_at_unix_ms,
                "duration_ms": e.duration_ms,
                "output_bytes": e.output_bytes,
                "output_tokens": e.output_tokens,
                "error_type": e.error_type,
            },
            "join": None
            if self.dispatch is None
            else {
                "request_id": self.dispatch.request_id,
                "dispatch_unix_ms": self.dispatch.dispatch_unix_ms,
                "dispatch_to_start_ms": self.dispatch_to_start_ms,
            },
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ToolEventRecord:
        """Read a sink line back (the trace CLI): the same strict rules as on the way in."""
        body = {k: v for k, v in obj.items() if k != "join"}
        tool = body.get("tool")
        if isinstance(tool, dict):
            body["tool"] = {k: v for k, v in tool.items() if v is not None}
        event = parse_tool_event(body, received_unix_ms=0.0)
        join = obj.get("join")
        dispatch = None
        if isinstance(join, dict):
            request_id, unix_ms = join.get("request_id"), join.get("dispatch_unix_ms")
            if (
                isinstance(request_id, str)
                and isinstance(unix_ms, int | float)
                and not isinstance(unix_ms, bool)
            ):
                dispatch = DispatchedCall(
                    request_id, event.session_id, event.tool_call_id, event.tool_name or "", float(unix_ms)
                )
        return cls(event, dispatch)


# --------------------------------------------------------------------------------------------------
# Validation (pure)


def _fail(message: str, param: str) -> ToolEventError:
    return ToolEventError(message, param=param)


def _only(d: dict[str, Any], allowed: frozenset[str], path: str) -> None:
    for key in d:
        if key not in allowed:
            raise _fail("unknown field", at(path, key))


def _required_object(
    d: dict[str, Any], key: str, allowed: frozenset[str], path: str
) -> tuple[dict[str, Any], str]:
    """The object under `key`, which must be there and hold only `allowed` keys, and its path."""
    opath = at(path, key)
    obj: dict[str, Any] | None = _checked(opt_dict, d, key, path)
    if obj is None:
        raise _fail("field required", opath)
    _only(obj, allowed, opath)
    return obj, opath


def _required_id(d: dict[str, Any], key: str, path: str) -> str:
    value = _id(d, key, path, required=True)
    assert value is not None  # `required` raised otherwise
    return value


def _id(d: dict[str, Any], key: str, path: str, *, required: bool) -> str | None:
    try:
        value = opt_str(d, key, path)
    except InvalidRequestError as exc:
        raise _fail(exc.message, at(path, key)) from None
    if value is None:
        if required:
            raise _fail("field required", at(path, key))
        return None
    if not is_valid_id(value):
        raise _fail(f"must be 1-{MAX_ID_LENGTH} characters of letters, digits and ._:@/+=#~-", at(path, key))
    return value


def _match(d: dict[str, Any], key: str, path: str, pattern: re.Pattern[str], what: str) -> str | None:
    value: str | None = _checked(opt_str, d, key, path)
    if value is not None and pattern.match(value) is None:
        raise _fail(f"must be {what}", at(path, key))
    return value


def _checked(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one of the api._check readers, re-raising its error as a ToolEventError."""
    try:
        return fn(*args, **kwargs)
    except ToolEventError:
        raise
    except InvalidRequestError as exc:
        raise _fail(exc.message, exc.param or "") from None


def _time(d: dict[str, Any], key: str, path: str) -> float | None:
    value: float | None = _checked(opt_number, d, key, path, minimum=0, maximum=MAX_UNIX_MS)
    return value


def parse_tool_event(obj: Any, *, received_unix_ms: float, path: str = "") -> ToolEvent:
    """Validate one decoded tool event. `received_unix_ms` is the event time when none is sent."""
    d: dict[str, Any] = _checked(expect_dict, obj, path or "body")
    _only(d, _TOP_KEYS, path)
    schema = _checked(opt_str, d, "schema", path)
    if schema is not None and schema not in _SCHEMAS:
        raise _fail(f"must be {SCHEMA!r}", at(path, "schema"))
    source = _checked(opt_str, d, "event_source", path)
    if source is not None and source != "harness":
        raise _fail("must be 'harness'", at(path, "event_source"))
    event_type = d.get("event_type")
    if event_type is None:
        raise _fail("field required", at(path, "event_type"))
    if event_type not in TOOL_EVENT_TYPES:
        raise _fail("must be one of 'tool_start', 'tool_end', 'tool_error'", at(path, "event_type"))
    event_time = _time(d, "event_time_unix_ms", path)

    ctx, cpath = _required_object(d, "agent_context", _CONTEXT_KEYS, path)
    session_id = _required_id(ctx, "session_id", cpath)
    tool, tpath = _required_object(d, "tool", _TOOL_KEYS, path)
    call_id = _required_id(tool, "tool_call_id", tpath)

    raw_status = _checked(opt_str, tool, "status", tpath)
    if raw_status is None:
        status = _DEFAULT_STATUS[event_type]
    else:
        normal = _STATUS_SYNONYMS.get(raw_status.lower())
        if normal is None or normal not in _ALLOWED_STATUS[event_type]:
            allowed = ", ".join(_ALLOWED_STATUS[event_type])
            raise _fail(f"must be one of {allowed} for {event_type}", at(tpath, "status"))
        status = normal

    started = _time(tool, "started_at_unix_ms", tpath)
    ended = _time(tool, "ended_at_unix_ms", tpath)
    duration = _checked(opt_number, tool, "duration_ms", tpath, minimum=0, maximum=MAX_DURATION_MS)
    when = event_time if event_time is not None else received_unix_ms
    if event_type == "tool_start":
        if ended is not None or duration is not None:
            raise _fail("a tool_start has no end time or duration", tpath)
        started = when if started is None else started
    else:
        if started is None and duration is None:
            raise _fail("a terminal event needs started_at_unix_ms or duration_ms", tpath)
        ended = when if ended is None else ended
        if started is None:
            assert duration is not None
            started = ended - duration
        if ended < started:
            raise _fail("must not be before started_at_unix_ms", at(tpath, "ended_at_unix_ms"))
        if duration is None:
            duration = round(ended - started, 3)
        # A duration sent with both ends is kept as sent: harnesses time it on a monotonic clock.
        if ended - started > MAX_DURATION_MS:
            raise _fail("the tool ran for more than a week", tpath)

    error_type = _match(tool, "error_type", tpath, _TOKEN, "1-64 characters of letters, digits and _.:-")
    if error_type is not None and status == "succeeded":
        raise _fail("only a failed or cancelled tool has an error_type", at(tpath, "error_type"))
    return ToolEvent(
        event_type=event_type,
        session_id=session_id,
        tool_call_id=call_id,
        event_time_unix_ms=when,
        status=status,
        parent_session_id=_id(ctx, "parent_session_id", cpath, required=False),
        trajectory_id=_id(ctx, "trajectory_id", cpath, required=False),
        tool_name=_match(
            tool, "tool_name", tpath, _TOOL_NAME, "1-128 characters of letters, digits and _.:/@+-"
        ),
        tool_class=_match(tool, "tool_class", tpath, _TOKEN, "1-64 characters of letters, digits and _.:-"),
        started_at_unix_ms=started,
        ended_at_unix_ms=ended,
        duration_ms=duration,
        output_bytes=_checked(opt_int, tool, "output_bytes", tpath, minimum=0, maximum=2**53),
        output_tokens=_checked(opt_int, tool, "output_tokens", tpath, minimum=0, maximum=2**53),
        error_type=error_type,
    )


def decode_tool_events(body: bytes | str, *, received_unix_ms: float) -> list[ToolEvent]:
    """One HTTP body (`POST /v1/agent/tool_events`): an event object, or an array of up to 100."""
    raw = body.encode() if isinstance(body, str) else body
    if len(raw) > MAX_BODY_BYTES:
        raise _fail(f"body larger than {MAX_BODY_BYTES} bytes", "body")
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _fail("body is not valid JSON", "body") from None
    try:
        check_surrogates(value, raw)  # no record (a trace line, a metric label) gets invalid text
    except InvalidRequestError as exc:
        raise _fail(exc.message, exc.param or "body") from None
    if isinstance(value, list):
        items = _checked(expect_list, value, "body")
        if not items:
            raise _fail("at least one event required", "body")
        if len(items) > MAX_EVENTS_PER_BODY:
            raise _fail(f"at most {MAX_EVENTS_PER_BODY} events per body", "body")
        return [
            parse_tool_event(v, received_unix_ms=received_unix_ms, path=f"[{i}]") for i, v in enumerate(items)
        ]
    return [parse_tool_event(value, received_unix_ms=received_unix_ms)]


def decode_zmq_message(frames: list[bytes], *, received_unix_ms: float) -> list[ToolEvent]:
    """One ZeroMQ message: the last frame is the JSON body; leading frames (topic, sequence number,
    as Dynamo's publisher sends them) are ignored."""
    if not frames or len(frames) > MAX_FRAMES:
        raise _fail(f"a message has 1 to {MAX_FRAMES} frames", "frames")
    return decode_tool_events(frames[-1], received_unix_ms=received_unix_ms)


def accepted_body(records: Iterable[ToolEventRecord]) -> dict[str, int]:
    """The HTTP endpoint's answer (202): how many events were accepted and how many joined a request."""
    records = list(records)
    return {"accepted": len(records), "joined": sum(r.dispatch is not None for r in records)}


# --------------------------------------------------------------------------------------------------
# Join


class DispatchIndex:
    """Recent dispatches by (session id, call id), LRU-bounded. Thread-safe: requests add from the
    event loop, the ZeroMQ listener looks up from its thread."""

    def __init__(self, capacity: int = 65536) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self._capacity = capacity
        self._calls: OrderedDict[tuple[str, str], DispatchedCall] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, call: DispatchedCall) -> None:
        if call.session_id is None or not call.call_id:
            return  # nothing a harness could name it by
        key = (call.session_id, call.call_id)
        with self._lock:
            self._calls[key] = call
            self._calls.move_to_end(key)
            while len(self._calls) > self._capacity:
                self._calls.popitem(last=False)

    def get(self, session_id: str, call_id: str) -> DispatchedCall | None:
        with self._lock:
            return self._calls.get((session_id, call_id))

    def join(self, event: ToolEvent) -> ToolEventRecord:
        return ToolEventRecord(event, self.get(event.session_id, event.tool_call_id))

    def join_all(self, events: Iterable[ToolEvent]) -> list[ToolEventRecord]:
        return [self.join(e) for e in events]
