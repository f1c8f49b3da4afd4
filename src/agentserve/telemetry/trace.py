"""The per-request trace record and the sans-IO builder that accumulates it.

One `TraceRecord` per request: ids, API, model, worker, timings, token counts, block hashes for
replay, tool calls with their dispatch offsets, stripped spans and a drift summary. It never holds
prompt or response text: the builder reads only the shape of the output events (kinds, indices,
tool names and ids, argument sizes), so a record can be shared without leaking a conversation.

Field names follow Dynamo's agent trace (`request_end` records, `ttft_ms`, `prefill_wait_time_ms`,
`replay.input_sequence_hashes`, ...) where the meaning is the same, so tooling written for one reads
the other with little glue.

`TraceBuilder` does no I/O and keeps no global state: the frontend calls it at each step of a
request, with times from one monotonic clock (injected, or passed as `t`), and gets the record back
from `finished` / `rejected`. All durations are computed from that clock; the wall clock is read once,
at `started`, to place the request on a timeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias, get_args

from agentserve.api.identity import AgentIdentity
from agentserve.api.nvext import is_valid_id
from agentserve.config import ALL_APIS, ApiName
from agentserve.conversation import (
    Finish,
    FinishReason,
    OutputEvent,
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
    Usage,
)
from agentserve.prompt.drift import DriftReport

SCHEMA = "agentserve.trace.v1"
EVENT_SOURCE = "agentserve"

RejectedStatus: TypeAlias = Literal["client_error", "server_error"]
Status: TypeAlias = FinishReason | RejectedStatus
STATUSES: tuple[str, ...] = (*get_args(FinishReason), *get_args(RejectedStatus))

CallStatus: TypeAlias = Literal["dispatched", "truncated", "malformed", "incomplete"]
CALL_STATUSES: tuple[str, ...] = get_args(CallStatus)

DriftCause: TypeAlias = Literal["none", "rewound", "reset", "output", "history", "unknown"]
DRIFT_CAUSES: tuple[str, ...] = get_args(DriftCause)

# Names and ids in a record come from the model's output or the caller; bound them so one bad
# request cannot make a record (or a table column) arbitrarily large.
MAX_NAME_CHARS = 256


def _bounded(value: str) -> str:
    return value if len(value) <= MAX_NAME_CHARS else value[:MAX_NAME_CHARS]


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


# --------------------------------------------------------------------------------------------------
# Record


@dataclass(frozen=True, slots=True)
class ToolCallTrace:
    """One tool call of the output. Offsets are from the request's start; `lead_ms` is how long
    before the end of the turn the call was dispatched (what streaming dispatch buys the harness)."""

    index: int
    id: str
    name: str
    status: CallStatus
    dispatch_ms: float | None = None
    dispatch_token: int | None = None  # output tokens generated when the call was dispatched
    lead_ms: float | None = None
    arguments_bytes: int = 0  # size of the arguments JSON (never the arguments themselves)

    def to_json(self) -> dict[str, Any]:
        return {
            "tool_call_index": self.index,
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "dispatch_ms": self.dispatch_ms,
            "dispatch_token": self.dispatch_token,
            "lead_ms": self.lead_ms,
            "arguments_bytes": self.arguments_bytes,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ToolCallTrace:
        status = d.get("status")
        return cls(
            index=_int(d, "tool_call_index"),
            id=_str(d, "id"),
            name=_str(d, "name"),
            status=status if status in CALL_STATUSES else "incomplete",
            dispatch_ms=_opt_float(d, "dispatch_ms"),
            dispatch_token=_opt_int(d, "dispatch_token"),
            lead_ms=_opt_float(d, "lead_ms"),
            arguments_bytes=_opt_int(d, "arguments_bytes") or 0,
        )


@dataclass(frozen=True, slots=True)
class WorkerTrace:
    worker_id: str
    overlap_blocks: int  # leading prompt blocks the router found cached on the worker
    prompt_blocks: int


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError("expected a list")
    return value


@dataclass(frozen=True, slots=True)
class MigrationTrace:
    """The stream moved from a worker that died mid-stream to another (router.dispatch)."""

    from_worker: str
    to_worker: str
    resumed_tokens: int  # output tokens re-sent as prompt to the new worker
    gap_ms: float | None  # failure → first token from the new worker

    def to_json(self) -> dict[str, Any]:
        return {
            "from_worker": self.from_worker,
            "to_worker": self.to_worker,
            "resumed_tokens": self.resumed_tokens,
            "gap_ms": self.gap_ms,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MigrationTrace:
        gap = d.get("gap_ms")
        return cls(
            _str(d, "from_worker"),
            _str(d, "to_worker"),
            _int(d, "resumed_tokens"),
            float(gap) if isinstance(gap, int | float) and not isinstance(gap, bool) else None,
        )


@dataclass(frozen=True, slots=True)
class PrefillTrace:
    """Where the prompt was prefilled (disaggregated prefill, router/disagg.py): the router's plan
    with its predicted costs, and what happened (`outcome`)."""

    where: str  # planned: local | remote
    reason: str  # below-threshold | no-prefill-worker | remote
    outcome: str  # local | remote | prefill-failed | transfer-failed
    uncached_tokens: int  # prompt tokens the decode worker lacked
    threshold: int
    local_ttft_ms: float  # predicted
    local_stall_ms: float  # predicted extra wait of each stream decoding on the decode worker
    prefill_worker: str | None = None
    remote_ttft_ms: float | None = None  # predicted: queue + prefill + transfer
    transfer_ms: float | None = None  # predicted
    prefill_ms: float | None = None  # measured: the context-only request on the prefill worker
    received_tokens: int | None = None  # prompt tokens whose KV the decode worker pulled

    def to_json(self) -> dict[str, Any]:
        return {
            "where": self.where,
            "reason": self.reason,
            "outcome": self.outcome,
            "uncached_tokens": self.uncached_tokens,
            "threshold": self.threshold,
            "predicted_local_ttft_ms": self.local_ttft_ms,
            "predicted_local_stall_ms": self.local_stall_ms,
            "prefill_worker": self.prefill_worker,
            "predicted_remote_ttft_ms": self.remote_ttft_ms,
            "predicted_transfer_ms": self.transfer_ms,
            "prefill_ms": self.prefill_ms,
            "received_tokens": self.received_tokens,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PrefillTrace:
        return cls(
            _str(d, "where"),
            _str(d, "reason"),
            _str(d, "outcome"),
            _int(d, "uncached_tokens"),
            _int(d, "threshold"),
            _float(d, "predicted_local_ttft_ms"),
            _float(d, "predicted_local_stall_ms"),
            _opt_str(d, "prefill_worker"),
            _opt_float(d, "predicted_remote_ttft_ms"),
            _opt_float(d, "predicted_transfer_ms"),
            _opt_float(d, "prefill_ms"),
            _opt_int(d, "received_tokens"),
        )


@dataclass(frozen=True, slots=True)
class ReplayTrace:
    """What a replay tool needs to re-create the request's KV footprint (Dynamo's `replay`)."""

    block_size: int
    input_length: int
    # Chained block hashes. Written as 16 hex digits (JSON numbers lose 64-bit precision), formatted
    # at serialisation, on the sink's thread, not per request.
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DriftSummary:
    """The drift report without its text: where the prompt stopped extending the previous turn."""

    drifted: bool
    first_differing_token: int
    reusable_tokens: int
    previous_tokens: int
    prompt_tokens: int
    cause: DriftCause

    def to_json(self) -> dict[str, Any]:
        return {
            "drifted": self.drifted,
            "first_differing_token": self.first_differing_token,
            "reusable_tokens": self.reusable_tokens,
            "previous_tokens": self.previous_tokens,
            "prompt_tokens": self.prompt_tokens,
            "cause": self.cause,
        }


def drift_cause(report: DriftReport, previous_prompt_tokens: int | None = None) -> DriftCause:
    """Classify a drift report by where the prompts part (a bounded enum: it is a metric label).

    - `none`: the prompt extends the previous prompt + output; everything is reusable.
    - `rewound`: the prompt is a prefix of the previous one (a retry, a regenerate, a rollback).
    - `reset`: not even the first token matches (a new conversation under the same session id).
    - `output`: the prompt rewrote the previous turn's output (dropped reasoning, re-serialised
      tool calls): a replay-policy problem. Needs the previous prompt's length.
    - `history`: the prompt rewrote earlier history (a volatile span, compaction).
    - `unknown`: drifted, but the previous prompt's length is not known.
    """
    if report.index >= report.previous_tokens:
        return "none"
    if report.index >= report.prompt_tokens:
        return "rewound"
    if report.index == 0:
        return "reset"
    if previous_prompt_tokens is None:
        return "unknown"
    return "output" if report.index >= previous_prompt_tokens else "history"


def summarize_drift(report: DriftReport, previous_prompt_tokens: int | None = None) -> DriftSummary:
    return DriftSummary(
        drifted=report.drifted,
        first_differing_token=report.index,
        reusable_tokens=report.reusable_tokens,
        previous_tokens=report.previous_tokens,
        prompt_tokens=report.prompt_tokens,
        cause=drift_cause(report, previous_prompt_tokens),
    )


@dataclass(frozen=True, slots=True)
class TraceRecord:
    request_id: str
    api: ApiName
    model: str
    status: Status
    received_unix_ms: float  # wall clock at `started`
    end_unix_ms: float  # wall clock at the end (received + total)
    session_id: str | None = None
    parent_session_id: str | None = None
    trajectory_id: str | None = None
    identity_source: str | None = None
    parent_source: str | None = None  # where the parent link came from (a header, the billing line, inferred)
    x_request_id: str | None = None
    # timings, ms (None: the request never got there)
    preprocess_ms: float | None = None  # received -> prompt rendered and tokenized
    prefill_wait_ms: float | None = None  # received -> prefill started (preprocess + queueing)
    prefill_ms: float | None = None  # prefill started -> first token
    ttft_ms: float | None = None
    decode_ms: float | None = None  # first token -> last output
    total_ms: float = 0.0
    avg_itl_ms: float | None = None  # mean inter-token latency over the decode
    # tokens
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    reasoning_segments: int = 0
    worker: WorkerTrace | None = None
    replay: ReplayTrace | None = None
    tool_calls: tuple[ToolCallTrace, ...] = ()
    stripped: Mapping[str, int] = field(default_factory=dict)
    drift: DriftSummary | None = None
    error_code: str | None = None
    migrations: tuple[MigrationTrace, ...] = ()
    prefill: PrefillTrace | None = None

    @property
    def kv_hit_rate(self) -> float | None:
        if self.worker is None or self.worker.prompt_blocks <= 0:
            return None
        return self.worker.overlap_blocks / self.worker.prompt_blocks

    def to_json(self) -> dict[str, Any]:
        """The JSONL line's object: Dynamo-style envelope, `request` holding this request's facts."""
        request: dict[str, Any] = {
            "request_id": self.request_id,
            "x_request_id": self.x_request_id,
            "api": self.api,
            "model": self.model,
            "status": self.status,
            "error_code": self.error_code,
            "request_received_unix_ms": self.received_unix_ms,
            "preprocess_time_ms": self.preprocess_ms,
            "prefill_wait_time_ms": self.prefill_wait_ms,
            "prefill_time_ms": self.prefill_ms,
            "ttft_ms": self.ttft_ms,
            "decode_time_ms": self.decode_ms,
            "total_time_ms": self.total_ms,
            "avg_itl_ms": self.avg_itl_ms,
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "reasoning_segments": self.reasoning_segments,
            "kv_hit_rate": self.kv_hit_rate,
            "worker": None
            if self.worker is None
            else {
                "worker_id": self.worker.worker_id,
                "overlap_blocks": self.worker.overlap_blocks,
                "prompt_blocks": self.worker.prompt_blocks,
            },
            "replay": None
            if self.replay is None
            else {
                "trace_block_size": self.replay.block_size,
                "input_length": self.replay.input_length,
                "input_sequence_hashes": [f"{h:016x}" for h in self.replay.hashes],
            },
            "tool_calls": [c.to_json() for c in self.tool_calls],
            "stripped": dict(self.stripped),
            "drift": None if self.drift is None else self.drift.to_json(),
            "migrations": [m.to_json() for m in self.migrations],
            "prefill": None if self.prefill is None else self.prefill.to_json(),
        }
        return {
            "schema": SCHEMA,
            "event_type": "request_end",
            "event_time_unix_ms": self.end_unix_ms,
            "event_source": EVENT_SOURCE,
            "agent_context": {
                "session_id": self.session_id,
                "parent_session_id": self.parent_session_id,
                "trajectory_id": self.trajectory_id,
                "source": self.identity_source,
                # Only on a subagent's records: readers of the envelope before it see no change.
                **({"parent_source": self.parent_source} if self.parent_source is not None else {}),
            },
            "request": request,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TraceRecord:
        """Read a record back (the trace CLI). Raises ValueError on a line that is not one."""
        if obj.get("event_type") != "request_end":
            raise ValueError("not a request_end record")
        ctx = _obj(obj, "agent_context")
        r = _obj(obj, "request")
        api = r.get("api")
        status = r.get("status")
        if api not in ALL_APIS or status not in STATUSES:
            raise ValueError("unknown api or status")
        worker = r.get("worker")
        replay = r.get("replay")
        drift = r.get("drift")
        stripped = {} if r.get("stripped") is None else r["stripped"]
        if not isinstance(stripped, dict) or not all(type(v) is int for v in stripped.values()):
            raise ValueError("stripped must map rule names to counts")
        tool_calls = [] if r.get("tool_calls") is None else r["tool_calls"]
        if not isinstance(tool_calls, list):
            raise ValueError("tool_calls must be a list")
        return cls(
            request_id=_str(r, "request_id"),
            api=api,
            model=_str(r, "model"),
            status=status,
            received_unix_ms=_float(r, "request_received_unix_ms"),
            end_unix_ms=_float(obj, "event_time_unix_ms"),
            session_id=_opt_str(ctx, "session_id"),
            parent_session_id=_opt_str(ctx, "parent_session_id"),
            trajectory_id=_opt_str(ctx, "trajectory_id"),
            identity_source=_opt_str(ctx, "source"),
            parent_source=_opt_str(ctx, "parent_source"),
            x_request_id=_opt_str(r, "x_request_id"),
            preprocess_ms=_opt_float(r, "preprocess_time_ms"),
            prefill_wait_ms=_opt_float(r, "prefill_wait_time_ms"),
            prefill_ms=_opt_float(r, "prefill_time_ms"),
            ttft_ms=_opt_float(r, "ttft_ms"),
            decode_ms=_opt_float(r, "decode_time_ms"),
            total_ms=_float(r, "total_time_ms"),
            avg_itl_ms=_opt_float(r, "avg_itl_ms"),
            input_tokens=_opt_int(r, "input_tokens") or 0,
            cached_tokens=_opt_int(r, "cached_tokens") or 0,
            output_tokens=_opt_int(r, "output_tokens") or 0,
            reasoning_tokens=_opt_int(r, "reasoning_tokens") or 0,
            reasoning_segments=_opt_int(r, "reasoning_segments") or 0,
            worker=None
            if worker is None
            else WorkerTrace(
                _str(worker, "worker_id"), _int(worker, "overlap_blocks"), _int(worker, "prompt_blocks")
            ),
            replay=None
            if replay is None
            else ReplayTrace(
                _int(replay, "trace_block_size"),
                _int(replay, "input_length"),
                _hashes(replay.get("input_sequence_hashes")),
            ),
            tool_calls=tuple(ToolCallTrace.from_json(_as_obj(c)) for c in tool_calls),
            stripped=dict(stripped),
            drift=None
            if drift is None
            else DriftSummary(
                drifted=bool(drift.get("drifted")),
                first_differing_token=_int(drift, "first_differing_token"),
                reusable_tokens=_int(drift, "reusable_tokens"),
                previous_tokens=_int(drift, "previous_tokens"),
                prompt_tokens=_int(drift, "prompt_tokens"),
                cause=drift.get("cause") if drift.get("cause") in DRIFT_CAUSES else "unknown",
            ),
            error_code=_opt_str(r, "error_code"),
            migrations=tuple(MigrationTrace.from_json(_as_obj(m)) for m in _list(r.get("migrations"))),
            prefill=None if r.get("prefill") is None else PrefillTrace.from_json(_as_obj(r["prefill"])),
        )


# Small readers for `from_json`: trace files are read back by the CLI and may be hand-edited or
# truncated, so every shape problem is a ValueError naming the key, never a KeyError/TypeError.


def _as_obj(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("expected an object")
    return value


def _obj(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = d.get(key)
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be an object")
    return value


def _str(d: Mapping[str, Any], key: str) -> str:
    value = d.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string")
    return value


def _opt_str(d: Mapping[str, Any], key: str) -> str | None:
    value = d.get(key)
    return None if value is None else _str(d, key)


def _int(d: Mapping[str, Any], key: str) -> int:
    value = d.get(key)
    if type(value) is not int:
        raise ValueError(f"{key} must be an integer")
    return value


def _opt_int(d: Mapping[str, Any], key: str) -> int | None:
    return None if d.get(key) is None else _int(d, key)


def _float(d: Mapping[str, Any], key: str) -> float:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number")
    return float(value)


def _opt_float(d: Mapping[str, Any], key: str) -> float | None:
    return None if d.get(key) is None else _float(d, key)


def _hashes(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
        raise ValueError("input_sequence_hashes must be a list of hex strings")
    return tuple(int(h, 16) for h in value)  # int() raises ValueError on a non-hex string


# --------------------------------------------------------------------------------------------------
# Builder


@dataclass(frozen=True, slots=True)
class DispatchedCall:
    """Returned by `TraceBuilder.on_event` at a dispatch point, for joining harness tool events."""

    request_id: str
    session_id: str | None
    call_id: str
    name: str
    dispatch_unix_ms: float


# Events that only move the output clock: the per-token bulk of a stream.
_CONTENT: frozenset[type[OutputEvent]] = frozenset({TextDelta, ReasoningDelta, ToolCallArgsDelta})


@dataclass(slots=True)
class _Call:
    index: int
    id: str
    name: str
    status: CallStatus = "incomplete"
    dispatch_t: float | None = None
    dispatch_token: int | None = None
    arguments_bytes: int = 0


class TraceBuilder:
    """Accumulates one request's trace. Every method takes an optional `t` (seconds on the builder's
    monotonic clock; default: read the injected clock). Calls may be skipped: a step never reached
    leaves its timings None. The first call of any method starts the request if `started` was not
    called."""

    __slots__ = (
        "_block_size",
        "_calls",
        "_clock",
        "_drift",
        "_first_token_t",
        "_hashes",
        "_identity",
        "_input_length",
        "_last_output_t",
        "_migrations",
        "_parent_source",
        "_prefill",
        "_prefill_t",
        "_reasoning_segments",
        "_record",
        "_rendered_t",
        "_replay_hashes",
        "_routed_t",
        "_stripped",
        "_t0",
        "_tokens_seen",
        "_unix0_ms",
        "_wall_clock",
        "_worker",
        "api",
        "model",
        "request_id",
        "x_request_id",
    )

    def __init__(
        self,
        request_id: str,
        api: ApiName,
        model: str,
        *,
        identity: AgentIdentity | None = None,
        x_request_id: str | None = None,
        replay_hashes: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.request_id = _bounded(request_id)
        self.api: ApiName = api
        self.model = _bounded(model)
        # The caller's x-request-id is untrusted: kept only when it is a well-formed id.
        self.x_request_id = x_request_id if x_request_id and is_valid_id(x_request_id) else None
        self._identity = identity or AgentIdentity()
        self._parent_source: str | None = None
        self._replay_hashes = replay_hashes
        self._clock = clock
        self._wall_clock = wall_clock
        self._t0: float | None = None
        self._unix0_ms = 0.0
        self._rendered_t: float | None = None
        self._routed_t: float | None = None
        self._prefill_t: float | None = None
        self._first_token_t: float | None = None
        self._last_output_t: float | None = None
        self._tokens_seen = 0
        self._hashes: Sequence[int] = ()
        self._block_size = 0
        self._input_length = 0
        self._stripped: dict[str, int] = {}
        self._drift: DriftSummary | None = None
        self._migrations: list[MigrationTrace] = []
        self._prefill: PrefillTrace | None = None
        self._worker: WorkerTrace | None = None
        self._calls: dict[int, _Call] = {}
        self._reasoning_segments = 0
        self._record: TraceRecord | None = None

    @property
    def session_id(self) -> str | None:
        return self._identity.session_id

    def relabel(self, session_id: str) -> None:
        """Record the request under `session_id` (a header-less conversation's turn 1, once its reply
        gives it the key its later turns show: `prompt.session.key_after`)."""
        self._identity = replace(self._identity, session_id=session_id)

    def linked(self, session_id: str, parent_session_id: str, source: str) -> None:
        """Record the request as a subagent's turn under `parent_session_id` (`frontend.subagents`:
        a link the identity headers did not carry whole, e.g. inferred from a spawn call)."""
        self._identity = replace(self._identity, session_id=session_id, parent_session_id=parent_session_id)
        self._parent_source = source

    @property
    def record(self) -> TraceRecord | None:
        """The finished record (None until `finished` or `rejected`)."""
        return self._record

    def _now(self, t: float | None) -> float:
        now = self._clock() if t is None else t
        if self._t0 is None:
            self._t0 = now
            self._unix0_ms = self._wall_clock() * 1000.0
        return now

    def started(self, t: float | None = None) -> None:
        """The request arrived (call first: everything is measured from here)."""
        self._now(t)

    def rendered(
        self,
        *,
        block_hashes: Sequence[int],
        block_size: int,
        input_length: int,
        stripped: Mapping[str, int] | None = None,
        drift: DriftReport | None = None,
        previous_prompt_tokens: int | None = None,
        t: float | None = None,
    ) -> None:
        """The prompt is rendered and tokenized: its block hashes, strip counts and drift report
        (`previous_prompt_tokens`, the previous turn's prompt length, lets the drift cause tell a
        rewritten output from rewritten history)."""
        self._rendered_t = self._now(t)
        self._hashes = block_hashes
        self._block_size = block_size
        self._input_length = input_length
        self._stripped = {_bounded(k): v for k, v in (stripped or {}).items() if v}
        self._drift = None if drift is None else summarize_drift(drift, previous_prompt_tokens)

    def routed(
        self, worker: str, overlap_blocks: int, *, prompt_blocks: int | None = None, t: float | None = None
    ) -> None:
        """The router placed the request (`overlap_blocks` of the prompt cached on `worker`)."""
        self._routed_t = self._now(t)
        blocks = len(self._hashes) if prompt_blocks is None else prompt_blocks
        self._worker = WorkerTrace(_bounded(worker), overlap_blocks, blocks)

    def migrated(self, from_worker: str, to_worker: str, resumed_tokens: int, gap_ms: float | None) -> None:
        """The stream moved to another worker after its worker died mid-stream."""
        self._migrations.append(
            MigrationTrace(_bounded(from_worker), _bounded(to_worker), resumed_tokens, gap_ms)
        )

    def prefill_placed(self, prefill: PrefillTrace) -> None:
        """Where the prompt was prefilled (prefill workers exist)."""
        self._prefill = prefill

    def prefill_started(self, t: float | None = None) -> None:
        """The worker began prefill (optional: without it prefill is taken to start when routed)."""
        self._prefill_t = self._now(t)

    def first_token(self, t: float | None = None) -> None:
        """The worker's first output token arrived (it may produce no event: a held-back marker)."""
        now = self._now(t)
        if self._first_token_t is None:
            self._first_token_t = now
        self._last_output_t = now

    def on_event(
        self, event: OutputEvent, t: float | None = None, *, output_tokens: int | None = None
    ) -> DispatchedCall | None:
        """Feed each parsed output event. `output_tokens`: tokens generated so far (the dispatch token
        index). Returns the call at its dispatch point (ToolCallEnd), else None."""
        now = self._now(t)
        if output_tokens is not None:
            self._tokens_seen = output_tokens
        if isinstance(event, Finish):
            return None
        if self._first_token_t is None:
            self._first_token_t = now
        self._last_output_t = now
        if isinstance(event, ToolCallArgsDelta | ReasoningEnd):
            if isinstance(event, ReasoningEnd):
                self._reasoning_segments += 1
            return None
        if isinstance(event, ToolCallStart):
            self._calls.setdefault(event.index, _Call(event.index, _bounded(event.id), _bounded(event.name)))
        elif isinstance(event, ToolCallEnd):
            call = self._calls.setdefault(event.index, _Call(event.index, "", ""))
            call.status = "dispatched"
            call.dispatch_t = now
            call.dispatch_token = self._tokens_seen
            call.arguments_bytes = len(event.arguments.encode())
            return DispatchedCall(
                self.request_id,
                self.session_id,
                call.id,
                call.name,
                round(self._unix0_ms + (now - self._start()) * 1000.0, 3),
            )
        elif isinstance(event, ToolCallError):
            call = self._calls.setdefault(event.index, _Call(event.index, "", ""))
            call.status = event.reason
        return None

    def on_events(
        self, events: Sequence[OutputEvent], t: float | None = None, *, output_tokens: int | None = None
    ) -> Sequence[DispatchedCall]:
        """`on_event` for the events of one engine step, all at one time: one clock read per step,
        and content deltas only move the output clock (this runs per token). Returns the calls
        dispatched among them."""
        now = self._now(t)
        if output_tokens is not None:
            self._tokens_seen = output_tokens
        content = False
        dispatched: list[DispatchedCall] | None = None
        for event in events:
            if type(event) in _CONTENT:
                content = True
                continue
            call = self.on_event(event, now)
            if call is not None:
                dispatched = [call] if dispatched is None else [*dispatched, call]
        if content:
            if self._first_token_t is None:
                self._first_token_t = now
            self._last_output_t = now
        return () if dispatched is None else dispatched

    def _start(self) -> float:
        assert self._t0 is not None  # set by `_now`, which every public method calls first
        return self._t0

    def finished(self, usage: Usage, reason: FinishReason, t: float | None = None) -> TraceRecord:
        """The stream ended (the Finish event's usage and reason). Idempotent: returns the first record."""
        if self._record is None:
            self._record = self._build(self._now(t), reason, usage, None)
        return self._record

    def rejected(
        self, status: RejectedStatus, t: float | None = None, *, error_code: str | None = None
    ) -> TraceRecord:
        """The request was answered with an error before (or instead of) finishing its stream."""
        if self._record is None:
            code = error_code if error_code and is_valid_id(error_code) else None
            self._record = self._build(self._now(t), status, Usage(), code)
        return self._record

    def _build(self, end: float, status: Status, usage: Usage, error_code: str | None) -> TraceRecord:
        t0 = self._start()
        prefill_start = self._prefill_t if self._prefill_t is not None else self._routed_t
        first = self._first_token_t
        last = self._last_output_t if self._last_output_t is not None else end
        preprocess = None if self._rendered_t is None else _ms(self._rendered_t - t0)
        prefill_wait = None if prefill_start is None else _ms(prefill_start - t0)
        prefill = None if prefill_start is None or first is None else _ms(max(0.0, first - prefill_start))
        itl = None
        if first is not None and usage.output_tokens > 1:
            itl = _ms((last - first) / (usage.output_tokens - 1))
        calls = tuple(
            ToolCallTrace(
                index=c.index,
                id=c.id,
                name=c.name,
                status=c.status,
                dispatch_ms=None if c.dispatch_t is None else _ms(c.dispatch_t - t0),
                dispatch_token=c.dispatch_token,
                lead_ms=None if c.dispatch_t is None else _ms(max(0.0, end - c.dispatch_t)),
                arguments_bytes=c.arguments_bytes,
            )
            for c in sorted(self._calls.values(), key=lambda c: c.index)
        )
        replay = None
        if self._block_size:
            hashes = tuple(self._hashes) if self._replay_hashes else ()
            replay = ReplayTrace(self._block_size, self._input_length, hashes)
        ident = self._identity
        total = _ms(end - t0)
        return TraceRecord(
            request_id=self.request_id,
            api=self.api,
            model=self.model,
            status=status,
            received_unix_ms=round(self._unix0_ms, 3),
            end_unix_ms=round(self._unix0_ms + total, 3),
            session_id=ident.session_id,
            parent_session_id=ident.parent_session_id,
            trajectory_id=ident.trajectory_id,
            identity_source=ident.source,
            parent_source=self._parent_source or ident.parent_source,
            x_request_id=self.x_request_id,
            preprocess_ms=preprocess,
            prefill_wait_ms=prefill_wait,
            prefill_ms=prefill,
            ttft_ms=None if first is None else _ms(first - t0),
            decode_ms=None if first is None else _ms(max(0.0, last - first)),
            total_ms=total,
            avg_itl_ms=itl,
            input_tokens=usage.input_tokens,
            cached_tokens=usage.cached_tokens,
            output_tokens=usage.output_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            reasoning_segments=self._reasoning_segments,
            worker=self._worker,
            replay=replay,
            tool_calls=calls,
            stripped=dict(self._stripped),
            drift=self._drift,
            error_code=error_code,
            migrations=tuple(self._migrations),
            prefill=self._prefill,
        )
