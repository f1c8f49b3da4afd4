"""Reading trace files back: per-session summaries and a Perfetto timeline (`agentserve trace`).

Pure functions over parsed records, plus `load` (the only I/O: JSONL files, plain or gzip, in any
number). Tool events are joined to sessions by session id and to turns by tool-call id here, so
events the frontend could not join live (another replica, an evicted dispatch) still line up.

Definitions (docs/telemetry.md):
- cache hit ratio: cached / input tokens over the session's turns;
- model time: wall time covered by the session's requests (union of their intervals, so parallel
  sub-requests are not double counted); tool time: the same over harness-reported tool executions;
- dispatch lead time: for each dispatched call, the time from its dispatch to the end of its turn.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agentserve.frontend.subagents import spawn_name
from agentserve.telemetry.tool_events import ToolEventError, ToolEventRecord
from agentserve.telemetry.trace import ToolCallTrace, TraceRecord

NO_SESSION = "-"


@dataclass(slots=True)
class Loaded:
    requests: list[TraceRecord] = field(default_factory=list)
    tool_events: list[ToolEventRecord] = field(default_factory=list)
    skipped: int = 0  # lines that were not a record we know (truncated tail, other event types)


def parse_lines(lines: Iterable[str | bytes], into: Loaded | None = None) -> Loaded:
    out = into if into is not None else Loaded()
    for line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
            if obj.get("event_type") == "request_end":
                out.requests.append(TraceRecord.from_json(obj))
            else:
                out.tool_events.append(ToolEventRecord.from_json(obj))
        except (ValueError, ToolEventError):
            out.skipped += 1
    return out


def load(paths: Iterable[str | Path]) -> Loaded:
    """Records from JSONL trace files; gzip is recognised by its magic bytes, not the name."""
    out = Loaded()
    for path in paths:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        opener: Any = gzip.open if gz else open
        with opener(path, "rb") as f:
            try:
                parse_lines(f, out)
            except EOFError:  # a rotated file cut short (crash mid-compression): keep what was read
                out.skipped += 1
    return out


# --------------------------------------------------------------------------------------------------
# Small statistics


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by a set of [start, end] intervals."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


# --------------------------------------------------------------------------------------------------
# Summary


@dataclass(frozen=True, slots=True)
class SessionSummary:
    session_id: str
    turns: int
    errors: int  # turns that ended in error / were rejected
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    model_time_ms: float
    tool_time_ms: float
    tool_calls: int  # dispatched by the model
    tool_executions: int  # reported by the harness (terminal events)
    dispatch_lead_p50_ms: float | None
    dispatch_lead_mean_ms: float | None
    drift_events: int
    # The subagent tree (docs/subagents.md): the session's parent and its depth under the root.
    parent_session_id: str | None = None
    depth: int = 0

    @property
    def cache_hit_ratio(self) -> float | None:
        return None if self.input_tokens == 0 else self.cached_tokens / self.input_tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "turns": self.turns,
            "errors": self.errors,
            "ttft_p50_ms": _r(self.ttft_p50_ms),
            "ttft_p95_ms": _r(self.ttft_p95_ms),
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "cache_hit_ratio": None if self.cache_hit_ratio is None else round(self.cache_hit_ratio, 4),
            "model_time_ms": _r(self.model_time_ms),
            "tool_time_ms": _r(self.tool_time_ms),
            "tool_calls": self.tool_calls,
            "tool_executions": self.tool_executions,
            "dispatch_lead_p50_ms": _r(self.dispatch_lead_p50_ms),
            "dispatch_lead_mean_ms": _r(self.dispatch_lead_mean_ms),
            "drift_events": self.drift_events,
            "parent_session_id": self.parent_session_id,
            "depth": self.depth,
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _session(session_id: str | None) -> str:
    return session_id if session_id else NO_SESSION


def tool_spans(events: Iterable[ToolEventRecord]) -> list[ToolEventRecord]:
    """One terminal event per (session, call): the last reported (a retry may report twice)."""
    latest: dict[tuple[str, str], ToolEventRecord] = {}
    for record in events:
        e = record.event
        if e.terminal and e.started_at_unix_ms is not None and e.ended_at_unix_ms is not None:
            latest[(e.session_id, e.tool_call_id)] = record
    return list(latest.values())


def _summarize(session_id: str, requests: list[TraceRecord], spans: list[ToolEventRecord]) -> SessionSummary:
    ttfts = [r.ttft_ms for r in requests if r.ttft_ms is not None]
    leads = [c.lead_ms for r in requests for c in r.tool_calls if c.lead_ms is not None]
    tool_intervals = [(s.event.started_at_unix_ms or 0.0, s.event.ended_at_unix_ms or 0.0) for s in spans]
    return SessionSummary(
        session_id=session_id,
        turns=len(requests),
        errors=sum(r.status in ("error", "client_error", "server_error") for r in requests),
        ttft_p50_ms=percentile(ttfts, 0.5),
        ttft_p95_ms=percentile(ttfts, 0.95),
        input_tokens=sum(r.input_tokens for r in requests),
        cached_tokens=sum(r.cached_tokens for r in requests),
        output_tokens=sum(r.output_tokens for r in requests),
        model_time_ms=union_length((r.received_unix_ms, r.end_unix_ms) for r in requests),
        tool_time_ms=union_length(tool_intervals),
        tool_calls=sum(c.status == "dispatched" for r in requests for c in r.tool_calls),
        tool_executions=len(spans),
        dispatch_lead_p50_ms=percentile(leads, 0.5),
        dispatch_lead_mean_ms=sum(leads) / len(leads) if leads else None,
        drift_events=sum(r.drift is not None and r.drift.cause != "none" for r in requests),
    )


def session_parents(requests: Iterable[TraceRecord]) -> dict[str, str]:
    """Each subagent session's parent, as its records name it (the last one named wins)."""
    parents: dict[str, str] = {}
    for r in sorted(requests, key=lambda r: r.received_unix_ms):
        if r.parent_session_id and r.parent_session_id != r.session_id:
            parents[_session(r.session_id)] = r.parent_session_id
    return parents


def tree_order(names: Sequence[str], parents: Mapping[str, str]) -> list[tuple[str, int]]:
    """`names` (in order of first activity) as a forest: each root, then its children depth first,
    with their depths. A parent that has no records of its own roots its children where it is first
    named; a cycle (ids are untrusted) is broken where it closes."""
    children: dict[str, list[str]] = {}
    for name in names:
        parent = parents.get(name)
        if parent is not None:
            children.setdefault(parent, []).append(name)
    out: list[tuple[str, int]] = []
    placed: set[str] = set()

    def visit(name: str, depth: int) -> None:
        stack = [(name, depth)]
        while stack:
            node, d = stack.pop()
            if node in placed:
                continue
            placed.add(node)
            out.append((node, d))
            stack.extend((c, d + 1) for c in reversed(children.get(node, [])))

    known = set(names)
    for name in names:
        parent = parents.get(name)
        if parent is None or parent not in known:
            visit(name, 0 if parent is None else 1)
    for name in names:  # what a cycle left out
        visit(name, 0)
    return out


def summarize(loaded: Loaded) -> list[SessionSummary]:
    """One summary per session: roots in order of first activity, each followed by its subagents."""
    by_session: dict[str, list[TraceRecord]] = {}
    for r in sorted(loaded.requests, key=lambda r: r.received_unix_ms):
        by_session.setdefault(_session(r.session_id), []).append(r)
    spans_by_session: dict[str, list[ToolEventRecord]] = {}
    for s in tool_spans(loaded.tool_events):
        spans_by_session.setdefault(s.event.session_id, []).append(s)
    names = list(by_session) + [s for s in spans_by_session if s not in by_session]
    parents = session_parents(loaded.requests)
    return [
        replace(
            _summarize(n, by_session.get(n, []), spans_by_session.get(n, [])),
            parent_session_id=parents.get(n),
            depth=depth,
        )
        for n, depth in tree_order(names, parents)
    ]


def total(loaded: Loaded) -> SessionSummary:
    """All sessions together (time unions are over the whole trace)."""
    return _summarize("(all)", loaded.requests, tool_spans(loaded.tool_events))


# --------------------------------------------------------------------------------------------------
# Table

_PRINTABLE = re.compile(r"[^A-Za-z0-9._:@/+=#~()-]")


def _cell(value: str, width: int) -> str:
    # Ids come from files and ultimately from clients: no control characters reach the terminal.
    clean = _PRINTABLE.sub("?", value)
    return clean if len(clean) <= width else clean[: width - 1] + "…"


def _fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f}s" if value >= 10_000 else f"{value:.0f}ms"


def format_table(summaries: Sequence[SessionSummary], overall: SessionSummary | None = None) -> str:
    header = (
        "session",
        "turns",
        "ttft p50",
        "ttft p95",
        "cache hit",
        "model time",
        "tool time",
        "tool/model",
        "calls",
        "lead p50",
        "drift",
    )
    rows = [header]
    for s in [*summaries, *([overall] if overall is not None else [])]:
        ratio = "-" if s.model_time_ms <= 0 else f"{s.tool_time_ms / s.model_time_ms:.2f}"
        hit = "-" if s.cache_hit_ratio is None else f"{100 * s.cache_hit_ratio:.1f}%"
        # Subagents sit under their parent, indented by depth (the id itself is sanitised first).
        indent = "  " * min(s.depth, 8) + ("└ " if s.depth else "")
        rows.append(
            (
                indent + _cell(s.session_id, 40 - len(indent)),
                str(s.turns),
                _fmt_ms(s.ttft_p50_ms),
                _fmt_ms(s.ttft_p95_ms),
                hit,
                _fmt_ms(s.model_time_ms),
                _fmt_ms(s.tool_time_ms),
                ratio,
                str(s.tool_calls),
                _fmt_ms(s.dispatch_lead_p50_ms),
                str(s.drift_events),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# Perfetto / Chrome trace-event JSON


def _lanes(intervals: Sequence[tuple[float, float]]) -> list[int]:
    """Greedy lane per interval so that intervals in one lane never overlap (slices on one track
    must nest; parallel tool calls and concurrent turns of one session do not)."""
    lane_end: list[float] = []
    out = [0] * len(intervals)
    for i in sorted(range(len(intervals)), key=lambda i: intervals[i]):
        start, end = intervals[i]
        for lane, busy_until in enumerate(lane_end):
            if busy_until <= start:
                lane_end[lane] = end
                out[i] = lane
                break
        else:
            lane_end.append(end)
            out[i] = len(lane_end) - 1
    return out


_TOOLS_TID = 1000  # tool lanes after the model lanes on each session's track group


def perfetto(loaded: Loaded) -> dict[str, Any]:
    """A Chrome trace-event JSON object (open in ui.perfetto.dev or chrome://tracing).

    One process per session (its track group): `model` lanes carry a slice per turn with `queue`,
    `prefill` and `decode` inside and an instant at each tool dispatch; `tools` lanes carry one
    slice per tool execution reported by the harness, with a flow arrow from its dispatch. A
    subagent's group sits right below its parent's, with a `spawn` arrow from the parent's spawning
    call (Agent, spawn_agent, …) to the subagent's first turn. Times are microseconds from the first
    event.
    """
    requests = sorted(loaded.requests, key=lambda r: r.received_unix_ms)
    spans = tool_spans(loaded.tool_events)
    starts = [r.received_unix_ms for r in requests] + [s.event.started_at_unix_ms or 0.0 for s in spans]
    origin = min(starts) if starts else 0.0

    def us(unix_ms: float) -> float:
        return round((unix_ms - origin) * 1000.0, 3)

    sessions: dict[str, int] = {}
    for name in [_session(r.session_id) for r in requests] + [s.event.session_id for s in spans]:
        sessions.setdefault(name, len(sessions) + 1)
    # Track groups in tree order: a subagent's group right below its parent's (whose tool lane holds
    # the spawning call the child runs inside).
    order = {
        name: n for n, (name, _depth) in enumerate(tree_order(list(sessions), session_parents(requests)))
    }

    events: list[dict[str, Any]] = []
    threads: set[tuple[int, int, str]] = set()
    calls_by_id: dict[tuple[str, str], tuple[TraceRecord, ToolCallTrace, int]] = {}

    by_session: dict[str, list[TraceRecord]] = {}
    for r in requests:
        by_session.setdefault(_session(r.session_id), []).append(r)
    turn_tids: dict[str, list[int]] = {}
    for session, turns in by_session.items():
        pid = sessions[session]
        lanes = _lanes([(r.received_unix_ms, r.end_unix_ms) for r in turns])
        for n, (r, lane) in enumerate(zip(turns, lanes, strict=True), start=1):
            tid = lane + 1
            turn_tids.setdefault(session, []).append(tid)
            threads.add((pid, tid, "model" if lane == 0 else f"model {lane + 1}"))
            events += _turn_events(r, n, pid, tid, us)
            for call in r.tool_calls:
                if call.id:
                    calls_by_id[(session, call.id)] = (r, call, tid)
    for child, parent in session_parents(requests).items():
        spawn = _spawning_call(by_session.get(parent, []), by_session[child][0])
        if spawn is None:
            continue
        index, at = spawn
        flow = len(events)
        common = {"name": "spawn", "cat": "flow", "id": flow}
        events.append(
            {**common, "ph": "s", "ts": us(at), "pid": sessions[parent], "tid": turn_tids[parent][index]}
        )
        first = by_session[child][0]
        events.append(
            {
                **common,
                "ph": "f",
                "bp": "e",
                "ts": us(first.received_unix_ms),
                "pid": sessions[child],
                "tid": turn_tids[child][0],
            }
        )

    spans_by_session: dict[str, list[ToolEventRecord]] = {}
    for s in spans:
        spans_by_session.setdefault(s.event.session_id, []).append(s)
    for session, tool_list in spans_by_session.items():
        pid = sessions[session]
        tool_list.sort(key=lambda s: s.event.started_at_unix_ms or 0.0)
        lanes = _lanes(
            [(s.event.started_at_unix_ms or 0.0, s.event.ended_at_unix_ms or 0.0) for s in tool_list]
        )
        for s, lane in zip(tool_list, lanes, strict=True):
            tid = _TOOLS_TID + lane
            threads.add((pid, tid, "tools" if lane == 0 else f"tools {lane + 1}"))
            e = s.event
            joined = calls_by_id.get((session, e.tool_call_id))
            name = (
                e.tool_name or (s.dispatch.name if s.dispatch else "") or (joined[1].name if joined else "")
            )
            args: dict[str, Any] = {"tool_call_id": e.tool_call_id, "status": e.status}
            if e.error_type:
                args["error_type"] = e.error_type
            if joined is not None:
                args["request_id"] = joined[0].request_id
            elif s.dispatch is not None:
                args["request_id"] = s.dispatch.request_id
            start, end = e.started_at_unix_ms or 0.0, e.ended_at_unix_ms or 0.0
            if joined is not None and joined[1].dispatch_ms is not None:
                # An arrow from the dispatch point (inside the turn's decode) to the execution.
                dispatch_at = joined[0].received_unix_ms + joined[1].dispatch_ms
                if start >= dispatch_at:
                    flow = len(events)
                    common = {"name": "dispatch", "cat": "flow", "id": flow, "pid": pid}
                    events.append({**common, "ph": "s", "ts": us(dispatch_at), "tid": joined[2]})
                    events.append({**common, "ph": "f", "bp": "e", "ts": us(start), "tid": tid})
            events.append(
                {
                    "name": _cell(name or "tool", 128),
                    "cat": "tool",
                    "ph": "X",
                    "ts": us(start),
                    "dur": round(max(0.0, end - start) * 1000.0, 3),
                    "pid": pid,
                    "tid": tid,
                    "args": args,
                }
            )

    parents = session_parents(requests)
    meta: list[dict[str, Any]] = []
    for session, pid in sessions.items():
        label = f"session {_cell(session, 128)}"
        if session in parents:  # a sub-agent: say whose
            label += f" (parent {_cell(parents[session] or '', 128)})"
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
        meta.append(
            {
                "name": "process_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"sort_index": order.get(session, pid)},
            }
        )
    for pid, tid, name in sorted(threads):
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        meta.append(
            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        )
    # Per track, in time order; a parent slice before the children that start with it.
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e.get("dur", 0.0), e["ph"] != "X"))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": {"origin_unix_ms": origin}}


def _spawning_call(parent_turns: Sequence[TraceRecord], first: TraceRecord) -> tuple[int, float] | None:
    """(index of the parent's turn, dispatch time) of the last spawning call the parent dispatched
    before the subagent's first turn arrived (None: none recorded)."""
    best: tuple[int, float] | None = None
    for i, r in enumerate(parent_turns):
        for call in r.tool_calls:
            if call.dispatch_ms is None or spawn_name(call.name) is None:
                continue
            at = r.received_unix_ms + call.dispatch_ms
            if at <= first.received_unix_ms and (best is None or at >= best[1]):
                best = (i, at)
    return best


def _turn_events(
    r: TraceRecord, n: int, pid: int, tid: int, us: Callable[[float], float]
) -> list[dict[str, Any]]:
    t0 = r.received_unix_ms
    args: dict[str, Any] = {
        "request_id": r.request_id,
        "api": r.api,
        "model": r.model,
        "status": r.status,
        "input_tokens": r.input_tokens,
        "cached_tokens": r.cached_tokens,
        "output_tokens": r.output_tokens,
        "ttft_ms": r.ttft_ms,
    }
    if r.worker is not None:
        args["worker"] = r.worker.worker_id
    if r.drift is not None and r.drift.cause != "none":
        args["drift"] = r.drift.cause
    out: list[dict[str, Any]] = [
        {
            "name": f"turn {n}",
            "cat": "request",
            "ph": "X",
            "ts": us(t0),
            "dur": round(us(t0 + r.total_ms) - us(t0), 3),
            "pid": pid,
            "tid": tid,
            "args": args,
        }
    ]
    # Stage boundaries, clamped into the turn so children always nest inside their parent.
    bounds: list[tuple[str, float | None, float | None]] = [
        ("preprocess", 0.0, r.preprocess_ms),
        ("queue", r.preprocess_ms or 0.0, r.prefill_wait_ms),
        ("prefill", r.prefill_wait_ms, r.ttft_ms),
        (
            "decode",
            r.ttft_ms,
            r.ttft_ms + r.decode_ms if r.ttft_ms is not None and r.decode_ms is not None else None,
        ),
    ]
    for name, start, end in bounds:
        if start is None or end is None:
            continue
        start, end = min(max(start, 0.0), r.total_ms), min(max(end, 0.0), r.total_ms)
        if end <= start:
            continue
        out.append(
            {
                "name": name,
                "cat": "stage",
                "ph": "X",
                "ts": us(t0 + start),
                "dur": round(us(t0 + end) - us(t0 + start), 3),  # ends exactly where the next starts
                "pid": pid,
                "tid": tid,
            }
        )
    for call in r.tool_calls:
        if call.dispatch_ms is None:
            continue
        out.append(
            {
                "name": f"dispatch {_cell(call.name or 'tool', 128)}",
                "cat": "dispatch",
                "ph": "i",
                "s": "t",
                "ts": us(t0 + min(call.dispatch_ms, r.total_ms)),
                "pid": pid,
                "tid": tid,
                "args": {"tool_call_id": call.id, "token": call.dispatch_token, "lead_ms": call.lead_ms},
            }
        )
    return out
