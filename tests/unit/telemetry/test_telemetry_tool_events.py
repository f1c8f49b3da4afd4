"""Harness tool events: strict validation, the live join, the HTTP entry and ZeroMQ over a real socket."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from agentserve.api.errors import InvalidRequestError
from agentserve.api.identity import AgentIdentity
from agentserve.conversation import ToolCallEnd, ToolCallStart, Usage
from agentserve.telemetry.hub import Telemetry
from agentserve.telemetry.metrics import FrontendMetrics
from agentserve.telemetry.sink import JsonlSink
from agentserve.telemetry.tool_events import (
    MAX_BODY_BYTES,
    DispatchIndex,
    ToolEventError,
    ToolEventRecord,
    accepted_body,
    decode_tool_events,
    decode_zmq_message,
    parse_tool_event,
)
from agentserve.telemetry.trace import DispatchedCall

NOW = 1_754_000_000_000.0


def end_event(**tool: Any) -> dict[str, Any]:
    return {
        "event_type": "tool_end",
        "event_time_unix_ms": NOW + 500,
        "agent_context": {"session_id": "s-1"},
        "tool": {
            "tool_call_id": "call_1",
            "tool_name": "mcp__github__create_issue",
            "started_at_unix_ms": NOW,
            "ended_at_unix_ms": NOW + 500,
            **tool,
        },
    }


def test_a_full_terminal_event() -> None:
    obj = end_event(output_bytes=10, output_tokens=3, tool_class="mcp")
    obj["schema"] = "agentserve.trace.v1"
    obj["event_source"] = "harness"
    obj["agent_context"].update(parent_session_id="p-1", trajectory_id="t-1")
    e = parse_tool_event(obj, received_unix_ms=0.0)
    assert (e.event_type, e.status, e.session_id, e.tool_call_id) == (
        "tool_end",
        "succeeded",
        "s-1",
        "call_1",
    )
    assert (e.started_at_unix_ms, e.ended_at_unix_ms, e.duration_ms) == (NOW, NOW + 500, 500.0)
    assert (e.parent_session_id, e.trajectory_id, e.tool_class) == ("p-1", "t-1", "mcp")
    assert (e.output_bytes, e.output_tokens, e.terminal) == (10, 3, True)


def test_times_default_from_the_event_time_or_the_receive_time() -> None:
    start = {"event_type": "tool_start", "agent_context": {"session_id": "s"}, "tool": {"tool_call_id": "c"}}
    e = parse_tool_event(start, received_unix_ms=NOW)
    assert (e.status, e.event_time_unix_ms, e.started_at_unix_ms, e.ended_at_unix_ms) == (
        "running",
        NOW,
        NOW,
        None,
    )

    # A terminal event whose tool_start was lost still carries its timing (duration back from the end).
    lone = {
        "event_type": "tool_error",
        "event_time_unix_ms": NOW,
        "agent_context": {"session_id": "s"},
        "tool": {"tool_call_id": "c", "duration_ms": 250, "error_type": "timeout", "status": "failed"},
    }
    e = parse_tool_event(lone, received_unix_ms=0.0)
    assert (e.status, e.started_at_unix_ms, e.ended_at_unix_ms, e.error_type) == (
        "error",
        NOW - 250,
        NOW,
        "timeout",
    )


@pytest.mark.parametrize(
    ("event_type", "sent", "status"),
    [
        ("tool_start", "started", "running"),
        ("tool_end", "Success", "succeeded"),
        ("tool_end", "completed", "succeeded"),
        ("tool_end", "canceled", "cancelled"),
        ("tool_error", "failure", "error"),
        ("tool_error", "cancelled", "cancelled"),
    ],
)
def test_status_synonyms(event_type: str, sent: str, status: str) -> None:
    obj = end_event(status=sent)
    obj["event_type"] = event_type
    if event_type == "tool_start":
        del obj["tool"]["ended_at_unix_ms"]
    assert parse_tool_event(obj, received_unix_ms=NOW).status == status


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = obj
        for key in parents:
            target = target[key]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value

    return apply


_DELETE = object()


@pytest.mark.parametrize(
    ("mutate", "param"),
    [
        (_set("extra", 1), "extra"),
        (_set("schema", "other.v9"), "schema"),
        (_set("event_source", "agentserve"), "event_source"),
        (_set("event_type", _DELETE), "event_type"),
        (_set("event_type", "tool_progress"), "event_type"),
        (_set("event_time_unix_ms", "now"), "event_time_unix_ms"),
        (_set("event_time_unix_ms", -1), "event_time_unix_ms"),
        (_set("agent_context", _DELETE), "agent_context"),
        (_set("agent_context", []), "agent_context"),
        (_set("agent_context.session_id", _DELETE), "agent_context.session_id"),
        (_set("agent_context.session_id", "has space"), "agent_context.session_id"),
        (_set("agent_context.session_id", "x" * 129), "agent_context.session_id"),
        (_set("agent_context.session_id", 42), "agent_context.session_id"),
        (_set("agent_context.user", "u"), "agent_context.user"),
        (_set("tool", _DELETE), "tool"),
        (_set("tool.arguments", {"cmd": "ls"}), "tool.arguments"),
        (_set("tool.tool_call_id", _DELETE), "tool.tool_call_id"),
        (_set("tool.tool_call_id", "a\nb"), "tool.tool_call_id"),
        (_set("tool.tool_name", "rm -rf /"), "tool.tool_name"),
        (_set("tool.tool_name", "n" * 129), "tool.tool_name"),
        (_set("tool.status", "running"), "tool.status"),
        (_set("tool.status", "exploded"), "tool.status"),
        (_set("tool.started_at_unix_ms", True), "tool.started_at_unix_ms"),
        (_set("tool.started_at_unix_ms", "1"), "tool.started_at_unix_ms"),
        (_set("tool.ended_at_unix_ms", NOW - 1), "tool.ended_at_unix_ms"),
        (_set("tool.duration_ms", -5), "tool.duration_ms"),
        (_set("tool.output_bytes", 1.5), "tool.output_bytes"),
        (_set("tool.output_tokens", -1), "tool.output_tokens"),
        (_set("tool.error_type", "timeout"), "tool.error_type"),  # on a success
    ],
)
def test_validation_errors_name_the_field(mutate: Callable[[dict[str, Any]], None], param: str) -> None:
    obj = copy.deepcopy(end_event())
    mutate(obj)
    with pytest.raises(ToolEventError) as info:
        parse_tool_event(obj, received_unix_ms=NOW)
    assert info.value.param == param
    assert isinstance(info.value, InvalidRequestError) and info.value.status == 400
    assert info.value.openai_body()["error"]["type"] == "invalid_request_error"


def test_timing_rules_by_event_type() -> None:
    start = end_event()
    start["event_type"] = "tool_start"
    with pytest.raises(ToolEventError, match="no end time"):
        parse_tool_event(start, received_unix_ms=NOW)
    lone = end_event()
    del lone["tool"]["started_at_unix_ms"]
    with pytest.raises(ToolEventError, match="started_at_unix_ms or duration_ms"):
        parse_tool_event(lone, received_unix_ms=NOW)
    week = end_event(started_at_unix_ms=0, ended_at_unix_ms=8 * 24 * 3600 * 1000)
    with pytest.raises(ToolEventError, match="more than a week"):
        parse_tool_event(week, received_unix_ms=NOW)


def test_bodies_single_array_and_bounds() -> None:
    one = json.dumps(end_event())
    assert len(decode_tool_events(one, received_unix_ms=NOW)) == 1
    assert len(decode_tool_events(f"[{one},{one}]".encode(), received_unix_ms=NOW)) == 2
    cases: list[tuple[bytes | str, str, str]] = [
        (b"{not json", "body", "valid JSON"),
        (b"\xff\xfe", "body", "valid JSON"),
        ("[]", "body", "at least one"),
        ("[" + ",".join([one] * 101) + "]", "body", "at most 100"),
        (b" " * (MAX_BODY_BYTES + 1), "body", "larger than"),
        ("7", "body", "object"),
        (f'[{one}, {{"event_type": "tool_end"}}]', "[1].agent_context", "required"),
    ]
    for body, param, message in cases:
        with pytest.raises(ToolEventError, match=message) as info:
            decode_tool_events(body, received_unix_ms=NOW)
        assert info.value.param == param


def test_zmq_messages_take_the_last_frame_and_bound_the_frame_count() -> None:
    payload = json.dumps(end_event()).encode()
    assert len(decode_zmq_message([payload], received_unix_ms=NOW)) == 1
    seq = (7).to_bytes(8, "big")
    assert len(decode_zmq_message([b"agent-trace", seq, payload], received_unix_ms=NOW)) == 1
    for frames in ([], [b"a", b"b", b"c", payload]):
        with pytest.raises(ToolEventError, match="frames"):
            decode_zmq_message(frames, received_unix_ms=NOW)


def dispatched(session: str | None = "s-1", call: str = "call_1", name: str = "Bash") -> DispatchedCall:
    return DispatchedCall("req-9", session, call, name, NOW - 40)


def test_join_names_the_dispatching_request_and_the_dispatch_to_start_gap() -> None:
    index = DispatchIndex()
    index.add(dispatched())
    obj = end_event()
    del obj["tool"]["tool_name"]
    record = index.join(parse_tool_event(obj, received_unix_ms=NOW))
    assert record.dispatch is not None and record.dispatch_to_start_ms == 40.0
    line = record.to_json()
    assert line["join"] == {"request_id": "req-9", "dispatch_unix_ms": NOW - 40, "dispatch_to_start_ms": 40.0}
    assert line["tool"]["tool_name"] == "Bash"  # filled in from the model's call
    assert line["event_source"] == "harness"
    back = ToolEventRecord.from_json(json.loads(json.dumps(line)))
    assert back.event.tool_call_id == "call_1" and back.dispatch is not None
    assert back.dispatch.request_id == "req-9"

    other = parse_tool_event(end_event(tool_call_id="call_2"), received_unix_ms=NOW)
    unjoined = index.join(other)
    assert unjoined.dispatch is None and unjoined.to_json()["join"] is None


def test_dispatch_index_is_lru_bounded_and_skips_calls_without_a_session() -> None:
    index = DispatchIndex(capacity=2)
    index.add(dispatched(session=None))
    assert len(index) == 0
    for n in range(3):
        index.add(dispatched(call=f"c{n}"))
    assert index.get("s-1", "c0") is None and index.get("s-1", "c2") is not None
    with pytest.raises(ValueError):
        DispatchIndex(capacity=0)


# ----------------------------------------------------------------------------- through the hub


def metric_value(hub: Telemetry, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    text = hub.metrics.exposition()[0].decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def make_hub(tmp_path: Path) -> Telemetry:
    return Telemetry(metrics=FrontendMetrics(["qwen3"]), sink=JsonlSink(tmp_path / "trace.jsonl"))


def dispatch_a_call(hub: Telemetry) -> None:
    req = hub.request("req-1", "anthropic", "qwen3", identity=AgentIdentity("s-1"), t=0.0)
    req.on_event(ToolCallStart(0, "call_1", "Bash"), 0.1)
    req.on_event(ToolCallEnd(0, "{}"), 0.2)
    req.finished(Usage(10, 2), "tool_calls", t=0.3)


def test_http_entry_validates_joins_counts_and_records(tmp_path: Path) -> None:
    hub = make_hub(tmp_path)
    dispatch_a_call(hub)
    unknown = end_event(tool_call_id="call_unknown")
    records = hub.submit_tool_events(json.dumps([end_event(), unknown]))
    assert records[0].dispatch is not None and records[0].dispatch.request_id == "req-1"
    assert accepted_body(records) == {"accepted": 2, "joined": 1}
    with pytest.raises(ToolEventError):
        hub.submit_tool_events(b"{}")
    assert metric_value(hub, "agentserve_frontend_tool_events_total", event_type="tool_end") == 2
    assert metric_value(hub, "agentserve_frontend_tool_events_joined_total") == 1
    assert metric_value(hub, "agentserve_frontend_tool_events_rejected_total", source="http") == 1
    hub.close()
    lines = [json.loads(x) for x in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [x["event_type"] for x in lines] == ["request_end", "tool_end", "tool_end"]
    assert lines[1]["join"]["request_id"] == "req-1" and lines[2]["join"] is None


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_zmq_pull_socket_over_a_real_connection(tmp_path: Path, transport: str) -> None:
    hub = make_hub(tmp_path)
    endpoint = "tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{tmp_path}/tool-events.sock"
    bound = hub.start(endpoint)
    assert bound is not None and bound.startswith(transport + "://")
    if transport == "tcp":
        assert bound.startswith("tcp://127.0.0.1:") and not bound.endswith(":*")
    assert hub.start() == bound  # already listening: the same endpoint

    dispatch_a_call(hub)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 100)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(bound)
    try:
        start = end_event()
        start["event_type"] = "tool_start"
        del start["tool"]["ended_at_unix_ms"]
        push.send(json.dumps(start).encode())
        push.send(b"not json at all")
        push.send_multipart([b"agent-trace", (1).to_bytes(8, "big"), json.dumps(end_event()).encode()])
        assert wait_for(
            lambda: (
                metric_value(hub, "agentserve_frontend_tool_events_total") >= 2
                and metric_value(hub, "agentserve_frontend_tool_events_rejected_total", source="zmq") >= 1
            )
        )
    finally:
        push.close()
        ctx.term()
    assert metric_value(hub, "agentserve_frontend_tool_events_total", event_type="tool_start") == 1
    assert metric_value(hub, "agentserve_frontend_tool_events_joined_total") == 2
    hub.close()
    lines = [json.loads(x) for x in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [x["event_type"] for x in lines] == ["request_end", "tool_start", "tool_end"]
    assert all(x["join"]["request_id"] == "req-1" for x in lines[1:])


def test_an_oversized_zmq_frame_never_reaches_the_handler(tmp_path: Path) -> None:
    hub = make_hub(tmp_path)
    bound = hub.start("tcp://127.0.0.1:*")
    assert bound is not None
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(bound)
    try:
        push.send(b"x" * (MAX_BODY_BYTES + 10))  # libzmq drops the peer (ZMQ_MAXMSGSIZE)
        time.sleep(0.3)
        push.close()
        # A fresh connection still works: the listener survived the oversized frame.
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(bound)
        push.send(json.dumps(end_event()).encode())
        assert wait_for(lambda: metric_value(hub, "agentserve_frontend_tool_events_total") == 1)
    finally:
        push.close()
        ctx.term()
    assert metric_value(hub, "agentserve_frontend_tool_events_rejected_total", source="zmq") == 0
    hub.close()


def test_binding_a_bad_endpoint_raises_in_the_caller(tmp_path: Path) -> None:
    hub = make_hub(tmp_path)
    with pytest.raises(zmq.ZMQError):
        hub.start("tcp://127.0.0.1:not-a-port")
    assert hub.start(None) is None  # nothing configured: no socket
    hub.close()
