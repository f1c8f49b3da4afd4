"""Synthetic trace files made with the real TraceBuilder (tests, and the example timeline in docs/).

`known_trace()` is small and hand-timed, so the summary numbers can be worked out by hand (see the
expectations in test_telemetry_report.py). `synthetic_trace()` is a seeded agent session mix: a main
agent with parallel tool calls, a sub-agent, and a second conversation. Run as a script to write one:

    PYTHONPATH=src python tests/unit/telemetry/telemetry_synth.py /tmp/trace.jsonl
    agentserve trace /tmp/trace.jsonl --perfetto docs/telemetry-example.perfetto.json
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field
from typing import Any

from agentserve.api.identity import AgentIdentity
from agentserve.conversation import ReasoningDelta, ReasoningEnd, TextDelta, ToolCallEnd, ToolCallStart, Usage
from agentserve.prompt.drift import DriftReport
from agentserve.telemetry.tool_events import DispatchIndex, ToolEventRecord, parse_tool_event
from agentserve.telemetry.trace import TraceBuilder

BASE_S = 1_754_000_000.0  # wall clock (s) at monotonic t = 0


@dataclass
class Call:
    id: str
    name: str
    dispatch_t: float  # monotonic seconds
    tool_start_t: float | None = None  # harness-reported execution, same timeline
    tool_end_t: float | None = None
    error: str | None = None


@dataclass
class Turn:
    session: str | None
    start: float
    first_token: float
    end: float
    usage: Usage
    calls: list[Call] = field(default_factory=list)
    parent: str | None = None
    worker: str = "worker-0"
    routed: float | None = None
    drift: DriftReport | None = None
    previous_prompt_tokens: int | None = None
    rejected: bool = False
    request_id: str = ""


def build(turns: list[Turn]) -> list[dict[str, Any]]:
    """Trace lines (request records, then tool events joined as the frontend would)."""
    index = DispatchIndex()
    lines: list[dict[str, Any]] = []
    for n, turn in enumerate(turns):
        b = TraceBuilder(
            turn.request_id or f"req-{n}",
            "anthropic",
            "qwen3-coder",
            identity=AgentIdentity(turn.session, turn.parent, None, "header:x-claude-code-session-id"),
            wall_clock=lambda start=turn.start: BASE_S + start,
        )
        b.started(t=turn.start)
        if turn.rejected:
            lines.append(b.rejected("client_error", t=turn.end, error_code="invalid_request_error").to_json())
            continue
        hashes = list(range(turn.usage.input_tokens // 32))
        b.rendered(
            block_hashes=hashes,
            block_size=32,
            input_length=turn.usage.input_tokens,
            stripped={"anthropic_billing": 1},
            drift=turn.drift,
            previous_prompt_tokens=turn.previous_prompt_tokens,
            t=turn.start + 0.002,
        )
        routed = turn.routed if turn.routed is not None else turn.start + 0.005
        b.routed(turn.worker, turn.usage.cached_tokens // 32, t=routed)
        b.first_token(t=turn.first_token)
        b.on_event(ReasoningDelta("..."), turn.first_token, output_tokens=1)
        b.on_event(ReasoningEnd(), turn.first_token + 0.001, output_tokens=2)
        tokens = 2
        for i, call in enumerate(turn.calls):
            tokens += 5
            b.on_event(ToolCallStart(i, call.id, call.name), call.dispatch_t - 0.01, output_tokens=tokens)
            dispatched = b.on_event(ToolCallEnd(i, "{}"), call.dispatch_t, output_tokens=tokens + 5)
            if dispatched is not None:
                index.add(dispatched)
        if not turn.calls:
            b.on_event(TextDelta("done"), turn.end, output_tokens=turn.usage.output_tokens)
        lines.append(b.finished(turn.usage, "tool_calls" if turn.calls else "stop", t=turn.end).to_json())
    for turn in turns:
        for call in turn.calls:
            if call.tool_start_t is None or turn.session is None:
                continue
            lines.append(_tool_line(index, turn.session, call, "tool_start"))
            if call.tool_end_t is not None:
                lines.append(
                    _tool_line(index, turn.session, call, "tool_error" if call.error else "tool_end")
                )
    return lines


def _tool_line(index: DispatchIndex, session: str, call: Call, event_type: str) -> dict[str, Any]:
    assert call.tool_start_t is not None
    tool: dict[str, Any] = {
        "tool_call_id": call.id,
        "started_at_unix_ms": (BASE_S + call.tool_start_t) * 1000,
    }
    when = call.tool_start_t
    if event_type != "tool_start":
        assert call.tool_end_t is not None
        when = call.tool_end_t
        tool["ended_at_unix_ms"] = (BASE_S + call.tool_end_t) * 1000
        if call.error:
            tool["error_type"] = call.error
    obj = {
        "event_type": event_type,
        "event_time_unix_ms": (BASE_S + when) * 1000,
        "agent_context": {"session_id": session},
        "tool": tool,
    }
    record: ToolEventRecord = index.join(parse_tool_event(obj, received_unix_ms=0.0))
    return record.to_json()


def known_turns() -> list[Turn]:
    a, b = "sess-a", "sess-b"
    return [
        Turn(a, 0.0, 0.210, 0.500, Usage(1000, 30, 0), [Call("call_1", "Bash", 0.400, 0.420, 1.420)]),
        Turn(b, 0.100, 0.400, 0.900, Usage(500, 5, 250), worker="worker-1"),
        Turn(
            a,
            1.500,
            1.600,
            1.800,
            Usage(1200, 40, 1000),
            [
                Call("call_2", "Read", 1.700, 1.710, 2.010),
                Call("call_3", "Grep", 1.750, 1.760, 2.260, "exit_1"),
            ],
        ),
        Turn(
            a,
            2.300,
            2.350,
            2.600,
            Usage(1300, 10, 1200),
            drift=DriftReport(900, 1240, 1300, "", "", ""),
            previous_prompt_tokens=1200,
        ),
        Turn(None, 3.0, 3.0, 3.001, Usage(), rejected=True),
    ]


def known_trace() -> list[dict[str, Any]]:
    lines = build(known_turns())
    # A tool event for a session with no requests in these files (another frontend's, say).
    lines.append(
        {
            "event_type": "tool_end",
            "event_time_unix_ms": (BASE_S + 5.0) * 1000,
            "agent_context": {"session_id": "sess-c"},
            "tool": {"tool_call_id": "x1", "tool_name": "Write", "duration_ms": 200.0},
        }
    )
    return lines


def synthetic_trace(seed: int = 7) -> list[dict[str, Any]]:
    """A main agent (5 turns, parallel calls), a sub-agent under it, and a second conversation."""
    rng = random.Random(seed)
    turns: list[Turn] = []
    call_no = 0

    def session(name: str, start: float, n_turns: int, parent: str | None = None) -> None:
        nonlocal call_no
        t = start
        prompt = 12_000 + rng.randrange(4000)
        for k in range(n_turns):
            ttft = (0.9 if k == 0 else 0.12) + rng.random() * 0.1
            n_calls = 0 if k == n_turns - 1 else rng.choice([1, 1, 2, 3])
            first = t + ttft
            calls = []
            d = first + 0.3
            for _ in range(n_calls):
                d += 0.2 + rng.random() * 0.6
                call_no += 1
                run = 0.05 + rng.random() * (2.0 if rng.random() < 0.3 else 0.4)
                calls.append(
                    Call(
                        f"toolu_{call_no:04d}",
                        rng.choice(["Bash", "Read", "Edit", "Grep"]),
                        d,
                        d + 0.01,
                        d + 0.01 + run,
                    )
                )
            end = (d if calls else first + 0.8) + 0.15 + rng.random() * 0.2
            cached = 0 if k == 0 else prompt - 400
            usage = Usage(prompt, 60 + rng.randrange(400), cached, rng.randrange(50))
            turns.append(Turn(name, t, first, end, usage, calls, parent=parent, worker=f"worker-{k % 2}"))
            tools_done = max((c.tool_end_t or 0.0) for c in calls) if calls else end
            t = max(end, tools_done) + 0.05
            prompt += usage.output_tokens + 300 + rng.randrange(800)

    session("main-7f3a", 0.0, 5)
    session("sub-agent-1", 3.0, 3, parent="main-7f3a")
    session("conversation-2", 1.5, 4)
    return build(turns)


def write_jsonl(path: str, lines: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    write_jsonl(sys.argv[1], synthetic_trace())
