"""TraceBuilder: timing math with an injected clock, tool-call dispatch offsets, no text in records."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentserve.api.identity import AgentIdentity
from agentserve.conversation import (
    Finish,
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
from agentserve.telemetry.trace import TraceBuilder, TraceRecord, drift_cause


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def builder(clock: Clock | None = None, **kwargs: object) -> TraceBuilder:
    return TraceBuilder(
        "req-1",
        "chat",
        "qwen3",
        identity=AgentIdentity("sess-1", "parent-1", "traj-1", "header:x-agentserve-session-id"),
        clock=clock or Clock(),
        wall_clock=lambda: 1000.0,
        **kwargs,  # type: ignore[arg-type]
    )


def report(index: int, previous: int, prompt: int) -> DriftReport:
    return DriftReport(index, previous, prompt, "before", "prev-after", "prompt-after")


def test_timings_tokens_and_dispatch_offsets_from_explicit_times() -> None:
    b = builder()
    b.started(t=10.0)
    b.rendered(
        block_hashes=[1, 2, 0xFFFF_FFFF_FFFF_FFFF, 4],
        block_size=32,
        input_length=100,
        stripped={"anthropic_billing": 1, "date": 0},
        t=10.002,
    )
    b.routed("worker-a", 3, t=10.005)
    b.prefill_started(t=10.010)
    b.first_token(t=10.110)
    b.on_event(ReasoningDelta("thinking"), 10.120, output_tokens=2)
    b.on_event(ReasoningEnd(), 10.130, output_tokens=3)
    b.on_event(TextDelta("hi"), 10.140, output_tokens=4)
    assert b.on_event(ToolCallStart(0, "call_a", "Bash"), 10.150, output_tokens=5) is None
    b.on_event(ToolCallArgsDelta(0, '{"cmd":'), 10.160, output_tokens=7)
    dispatched = b.on_event(ToolCallEnd(0, '{"cmd":"ls"}'), 10.200, output_tokens=9)
    b.on_event(ToolCallStart(1, "call_b", "Read"), 10.210, output_tokens=10)
    b.on_event(ToolCallError(1, "truncated", '{"path": "/etc'), 10.300, output_tokens=12)
    b.on_event(Finish("tool_calls", Usage(100, 12, 60, 4)), 10.310)
    record = b.finished(Usage(100, 12, 60, 4), "tool_calls", t=10.320)

    assert dispatched is not None
    assert (dispatched.request_id, dispatched.session_id, dispatched.call_id, dispatched.name) == (
        "req-1",
        "sess-1",
        "call_a",
        "Bash",
    )
    assert dispatched.dispatch_unix_ms == pytest.approx(1_000_200.0)

    assert record.received_unix_ms == 1_000_000.0
    assert record.end_unix_ms == pytest.approx(1_000_320.0)
    assert record.preprocess_ms == pytest.approx(2.0)
    assert record.prefill_wait_ms == pytest.approx(10.0)
    assert record.prefill_ms == pytest.approx(100.0)
    assert record.ttft_ms == pytest.approx(110.0)
    assert record.decode_ms == pytest.approx(190.0)  # first token -> last output event (10.300)
    assert record.total_ms == pytest.approx(320.0)
    assert record.avg_itl_ms == pytest.approx(190.0 / 11, abs=1e-3)  # 12 tokens, 11 gaps
    assert (record.input_tokens, record.output_tokens, record.cached_tokens, record.reasoning_tokens) == (
        100,
        12,
        60,
        4,
    )
    assert record.reasoning_segments == 1
    assert record.kv_hit_rate == pytest.approx(0.75)
    assert record.worker is not None and record.worker.worker_id == "worker-a"
    assert record.replay is not None
    assert record.replay.hashes == (1, 2, 0xFFFF_FFFF_FFFF_FFFF, 4)
    assert record.to_json()["request"]["replay"]["input_sequence_hashes"] == [
        "0000000000000001",
        "0000000000000002",
        "ffffffffffffffff",
        "0000000000000004",
    ]
    assert dict(record.stripped) == {"anthropic_billing": 1}  # zero counts are not spans

    first, second = record.tool_calls
    assert (first.id, first.name, first.status) == ("call_a", "Bash", "dispatched")
    assert first.dispatch_ms == pytest.approx(200.0)
    assert first.dispatch_token == 9
    assert first.lead_ms == pytest.approx(120.0)  # dispatched 120 ms before the turn ended
    assert first.arguments_bytes == len('{"cmd":"ls"}')
    assert (second.id, second.status, second.dispatch_ms, second.lead_ms) == (
        "call_b",
        "truncated",
        None,
        None,
    )


def test_injected_clock_is_read_when_no_time_is_passed() -> None:
    clock = Clock(5.0)
    b = builder(clock)
    b.started()
    clock.t = 5.25
    b.routed("w", 0)
    clock.t = 5.5
    b.on_event(TextDelta("x"))  # no first_token call: the first event is the first token
    clock.t = 6.5
    b.on_event(TextDelta("y"))
    clock.t = 7.0
    record = b.finished(Usage(10, 3), "stop")
    assert record.prefill_wait_ms == pytest.approx(250.0)
    assert record.prefill_ms == pytest.approx(250.0)  # routed -> first token when prefill start is unknown
    assert record.ttft_ms == pytest.approx(500.0)
    assert record.avg_itl_ms == pytest.approx(500.0)  # (6.5 - 5.5) s over 2 gaps
    assert record.total_ms == pytest.approx(2000.0)
    assert record.preprocess_ms is None and record.replay is None and record.kv_hit_rate is None


def test_a_request_without_output_has_no_ttft_or_itl_and_a_call_never_closed_is_incomplete() -> None:
    b = builder()
    b.started(t=1.0)
    b.on_event(Finish("stop"), 1.5)
    record = b.finished(Usage(5, 0), "stop", t=1.5)
    assert (record.ttft_ms, record.decode_ms, record.avg_itl_ms) == (None, None, None)

    b = builder()
    b.started(t=0.0)
    b.on_event(ToolCallStart(0, "c", "f"), 0.1)
    record = b.finished(Usage(5, 1), "length", t=0.2)
    assert record.tool_calls[0].status == "incomplete"
    assert record.avg_itl_ms is None  # one output token: no gap to average


def test_finished_is_idempotent_and_rejected_records_a_bounded_error_code() -> None:
    b = builder()
    b.started(t=0.0)
    first = b.finished(Usage(1, 1), "stop", t=1.0)
    assert b.finished(Usage(9, 9), "error", t=5.0) is first
    assert b.record is first

    b = builder()
    b.started(t=0.0)
    record = b.rejected("client_error", t=0.01, error_code="context_length_exceeded")
    assert (record.status, record.error_code, record.total_ms) == (
        "client_error",
        "context_length_exceeded",
        10.0,
    )
    b = builder()
    assert b.rejected("server_error", t=0.0, error_code="bad code with spaces").error_code is None


def test_untrusted_x_request_id_is_dropped_unless_well_formed() -> None:
    assert builder(x_request_id="abc-123").x_request_id == "abc-123"
    assert builder(x_request_id="a b\n").x_request_id is None
    assert builder(x_request_id="x" * 500).x_request_id is None


def test_long_tool_names_and_ids_are_bounded() -> None:
    b = builder()
    b.on_event(ToolCallStart(0, "i" * 1000, "n" * 1000), 0.0)
    record = b.finished(Usage(), "stop", t=0.1)
    assert len(record.tool_calls[0].id) == 256 and len(record.tool_calls[0].name) == 256


def test_replay_hashes_can_be_left_out() -> None:
    b = builder(replay_hashes=False)
    b.rendered(block_hashes=[1, 2], block_size=16, input_length=40, t=0.0)
    record = b.finished(Usage(40), "stop", t=0.1)
    assert record.replay is not None
    assert (record.replay.block_size, record.replay.input_length, record.replay.hashes) == (16, 40, ())


@pytest.mark.parametrize(
    ("index", "previous", "prompt", "previous_prompt", "cause"),
    [
        (100, 100, 150, 80, "none"),  # extends prompt + output
        (100, 100, 100, 80, "none"),  # identical (a retry that adds nothing)
        (50, 100, 50, 80, "rewound"),  # the new prompt is a prefix of the old one
        (0, 100, 120, 80, "reset"),
        (90, 100, 120, 80, "output"),  # differs inside the previous turn's output
        (80, 100, 120, 80, "output"),  # ... at its very first token
        (40, 100, 120, 80, "history"),
        (40, 100, 120, None, "unknown"),
    ],
)
def test_drift_cause(index: int, previous: int, prompt: int, previous_prompt: int | None, cause: str) -> None:
    assert drift_cause(report(index, previous, prompt), previous_prompt) == cause


def test_drift_summary_keeps_positions_but_no_text() -> None:
    b = builder()
    b.rendered(
        block_hashes=[],
        block_size=32,
        input_length=120,
        drift=report(40, 100, 120),
        previous_prompt_tokens=80,
        t=0.0,
    )
    record = b.finished(Usage(120), "stop", t=0.1)
    assert record.drift is not None
    assert record.drift.to_json() == {
        "drifted": True,
        "first_differing_token": 40,
        "reusable_tokens": 40,
        "previous_tokens": 100,
        "prompt_tokens": 120,
        "cause": "history",
    }
    line = json.dumps(record.to_json())
    assert "prev-after" not in line and "prompt-after" not in line and "before" not in line


def test_record_json_envelope_and_round_trip() -> None:
    b = builder(x_request_id="xr-1")
    b.started(t=0.0)
    b.rendered(
        block_hashes=[7], block_size=32, input_length=20, stripped={"date": 2}, drift=report(5, 9, 30), t=0.01
    )
    b.routed("w-1", 1, t=0.02)
    b.first_token(t=0.1)
    b.on_event(ToolCallStart(0, "c1", "Bash"), 0.2, output_tokens=3)
    b.on_event(ToolCallEnd(0, "{}"), 0.3, output_tokens=4)
    record = b.finished(Usage(20, 5, 10, 0), "tool_calls", t=0.5)
    obj = json.loads(json.dumps(record.to_json()))
    assert obj["schema"] == "agentserve.trace.v1"
    assert obj["event_type"] == "request_end"
    assert obj["event_source"] == "agentserve"
    assert obj["agent_context"] == {
        "session_id": "sess-1",
        "parent_session_id": "parent-1",
        "trajectory_id": "traj-1",
        "source": "header:x-agentserve-session-id",
    }
    r = obj["request"]
    assert r["replay"] == {
        "trace_block_size": 32,
        "input_length": 20,
        "input_sequence_hashes": ["0000000000000007"],
    }
    assert r["worker"] == {"worker_id": "w-1", "overlap_blocks": 1, "prompt_blocks": 1}
    assert r["kv_hit_rate"] == 1.0
    assert r["tool_calls"][0]["tool_call_index"] == 0
    assert TraceRecord.from_json(obj) == record


@pytest.mark.parametrize(
    "mutate",
    [
        lambda o: o.update(event_type="tool_end"),
        lambda o: o.pop("request"),
        lambda o: o["request"].update(api="grpc"),
        lambda o: o["request"].update(status="fine"),
        lambda o: o["request"].update(total_time_ms="1"),
        lambda o: o["request"].update(tool_calls={}),
        lambda o: o["request"].update(stripped={"a": "1"}),
        lambda o: o["agent_context"].update(session_id=5),
        lambda o: o["request"].update(
            replay={"trace_block_size": 32, "input_length": 1, "input_sequence_hashes": ["zz"]}
        ),
    ],
)
def test_from_json_rejects_malformed_records_with_value_error(mutate: object) -> None:
    b = builder()
    obj = b.finished(Usage(1, 1), "stop", t=0.0).to_json()
    mutate(obj)  # type: ignore[operator]
    with pytest.raises(ValueError):
        TraceRecord.from_json(obj)


# ----------------------------------------------------------------------------- no text, ever

SECRET = "LEAKMARK"
secrets = st.text(alphabet=string.ascii_letters, min_size=6, max_size=20).map(lambda s: SECRET + s)
names = st.text(alphabet=string.digits, min_size=1, max_size=4).map(lambda s: "tool_" + s)


@st.composite
def event_streams(draw: st.DrawFn) -> tuple[list[OutputEvent], list[str]]:
    texts: list[str] = []
    events: list[OutputEvent] = []
    for index in range(draw(st.integers(0, 4))):
        before = draw(st.lists(secrets, max_size=3))
        texts += before
        kind = draw(st.sampled_from(["text", "reasoning"]))
        for text in before:
            events.append(TextDelta(text) if kind == "text" else ReasoningDelta(text))
        if kind == "reasoning" and before:
            events.append(ReasoningEnd())
        events.append(ToolCallStart(index, f"call_{index}", draw(names)))
        value = draw(secrets)
        arguments = json.dumps({"arg": value})
        texts.append(value)
        events.append(ToolCallArgsDelta(index, arguments[:5]))
        events.append(ToolCallArgsDelta(index, arguments[5:]))
        if draw(st.booleans()):
            events.append(ToolCallEnd(index, arguments))
        else:
            events.append(ToolCallError(index, "malformed", arguments, message=value))
    tail = draw(st.lists(secrets, max_size=3))
    texts += tail
    events += [TextDelta(t) for t in tail]
    return events, texts


@given(event_streams(), st.lists(secrets, min_size=3, max_size=3))
def test_no_prompt_or_response_text_ever_reaches_a_record(
    stream: tuple[list[OutputEvent], list[str]], context: list[str]
) -> None:
    events, texts = stream
    b = builder()
    b.started(t=0.0)
    drift = DriftReport(3, 10, 12, context[0], context[1], context[2])
    b.rendered(
        block_hashes=[1, 2], block_size=32, input_length=64, drift=drift, previous_prompt_tokens=8, t=0.001
    )
    for n, event in enumerate(events):
        b.on_event(event, 0.01 * (n + 1), output_tokens=n)
    record = b.finished(Usage(64, len(events), 32, 1), "tool_calls", t=1.0)
    for ensure_ascii in (True, False):
        line = json.dumps(record.to_json(), ensure_ascii=ensure_ascii)
        assert SECRET not in line
    assert not any(t in line for t in texts + context)


def test_a_migrated_stream_is_in_the_record_and_round_trips() -> None:
    b = builder()
    b.migrated("w-0", "w-1", 37, 4.5)
    b.migrated("w-1", "w-2", 80, None)
    record = b.finished(Usage(10, 120), "stop", t=0.0)
    obj = json.loads(json.dumps(record.to_json()))
    assert obj["request"]["migrations"] == [
        {"from_worker": "w-0", "to_worker": "w-1", "resumed_tokens": 37, "gap_ms": 4.5},
        {"from_worker": "w-1", "to_worker": "w-2", "resumed_tokens": 80, "gap_ms": None},
    ]
    assert TraceRecord.from_json(obj) == record
    assert builder().finished(Usage(1, 1), "stop", t=0.0).to_json()["request"]["migrations"] == []
    obj["request"]["migrations"] = {"not": "a list"}
    with pytest.raises(ValueError):
        TraceRecord.from_json(obj)
    del obj["request"]["migrations"]  # records written before the field read back with none
    assert TraceRecord.from_json(obj).migrations == ()


def test_a_prefill_decision_is_in_the_record_and_round_trips() -> None:
    from agentserve.telemetry.trace import PrefillTrace

    b = builder()
    b.prefill_placed(
        PrefillTrace(
            "remote", "remote", "transfer-failed", 90_000, 961, 6042.7, 5849.9, "p0", 6100.0, 246.8, 5900.0, 0
        )
    )
    record = b.finished(Usage(90_000, 12), "stop", t=0.0)
    obj = json.loads(json.dumps(record.to_json()))
    assert obj["request"]["prefill"]["outcome"] == "transfer-failed"
    assert obj["request"]["prefill"]["predicted_local_stall_ms"] == 5849.9
    assert TraceRecord.from_json(obj) == record
    del obj["request"]["prefill"]  # records written before the field read back with none
    assert TraceRecord.from_json(obj).prefill is None
