"""Frontend metrics: exposition parsed back, bounded labels, never an id as a label."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from agentserve.api.identity import AgentIdentity
from agentserve.config import ALL_APIS, FrontendConfig
from agentserve.conversation import TextDelta, ToolCallEnd, ToolCallError, ToolCallStart, Usage
from agentserve.prompt.drift import DriftReport
from agentserve.telemetry.hub import Telemetry
from agentserve.telemetry.metrics import HARNESSES, SUBAGENT_LINKS, FrontendMetrics, harness_of
from agentserve.telemetry.tool_events import DispatchIndex, parse_tool_event
from agentserve.telemetry.trace import CALL_STATUSES, DRIFT_CAUSES, STATUSES, TraceBuilder, TraceRecord


def samples(metrics: FrontendMetrics) -> list[Sample]:
    text = metrics.exposition()[0].decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(metrics: FrontendMetrics, name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples(metrics)
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def a_record(
    *,
    model: str = "qwen3",
    session: str = "s-1",
    request_id: str = "r-1",
    worker: str = "w-1",
    tool: str = "Bash",
    stripped: dict[str, int] | None = None,
) -> TraceRecord:
    b = TraceBuilder(
        request_id, "chat", model, identity=AgentIdentity(session, "p-" + session, "t-" + session)
    )
    b.started(t=0.0)
    b.rendered(
        block_hashes=[1, 2, 3, 4],
        block_size=32,
        input_length=128,
        stripped=stripped if stripped is not None else {"anthropic_billing": 1},
        drift=DriftReport(40, 100, 128, "", "", ""),
        previous_prompt_tokens=80,
        t=0.001,
    )
    b.routed(worker, 2, t=0.05)
    b.first_token(t=0.25)
    b.on_event(TextDelta("x"), 0.3, output_tokens=3)
    b.on_event(ToolCallStart(0, "call_" + request_id, tool), 0.35)
    b.on_event(ToolCallEnd(0, "{}"), 0.4, output_tokens=5)
    b.on_event(ToolCallStart(1, "call2_" + request_id, tool), 0.45)
    b.on_event(ToolCallError(1, "malformed", "{"), 0.45)
    return b.finished(Usage(128, 11, 96, 2), "tool_calls", t=1.25)


def test_one_request_in_the_exposition() -> None:
    m = FrontendMetrics(["qwen3"], strip_rules=["anthropic_billing", "date"])
    m.request_started("chat", "qwen3")
    assert value(m, "agentserve_frontend_inflight_requests", api="chat", model="qwen3") == 1
    m.request_finished(a_record())
    assert value(m, "agentserve_frontend_inflight_requests", api="chat", model="qwen3") == 0
    assert value(m, "agentserve_frontend_requests_total", api="chat", model="qwen3", status="tool_calls") == 1
    assert value(m, "agentserve_frontend_time_to_first_token_seconds_count") == 1
    assert value(m, "agentserve_frontend_time_to_first_token_seconds_sum") == pytest.approx(0.25)
    assert value(m, "agentserve_frontend_time_to_first_token_seconds_bucket", le="0.25") == 1
    assert value(m, "agentserve_frontend_time_to_first_token_seconds_bucket", le="0.1") == 0
    assert value(m, "agentserve_frontend_inter_token_latency_seconds_sum") == pytest.approx(0.2 / 10)
    assert value(m, "agentserve_frontend_request_duration_seconds_sum") == pytest.approx(1.25)
    assert value(m, "agentserve_frontend_queue_time_seconds_sum") == pytest.approx(0.05)
    assert value(m, "agentserve_frontend_input_tokens_total") == 128
    assert value(m, "agentserve_frontend_cached_tokens_total") == 96
    assert value(m, "agentserve_frontend_output_tokens_total") == 11
    assert value(m, "agentserve_frontend_reasoning_tokens_total") == 2
    assert value(m, "agentserve_frontend_cached_token_ratio_sum") == pytest.approx(0.75)
    assert value(m, "agentserve_frontend_cached_token_ratio_bucket", le="0.7") == 0
    assert value(m, "agentserve_frontend_cached_token_ratio_bucket", le="0.8") == 1
    assert value(m, "agentserve_frontend_tool_calls_total", status="dispatched") == 1
    assert value(m, "agentserve_frontend_tool_calls_total", status="malformed") == 1
    assert value(m, "agentserve_frontend_tool_dispatch_lead_time_seconds_count") == 1
    assert value(m, "agentserve_frontend_tool_dispatch_lead_time_seconds_sum") == pytest.approx(0.85)
    assert value(m, "agentserve_frontend_prefix_drift_events_total", model="qwen3", cause="history") == 1
    assert value(m, "agentserve_frontend_stripped_spans_total", rule="anthropic_billing") == 1


def test_unknown_models_and_rules_fold_into_other_and_unknown_apis_are_bugs() -> None:
    m = FrontendMetrics(["qwen3"], strip_rules=["date"])
    m.request_finished(a_record(model="gpt-9-turbo", stripped={"date": 2, "surprise": 3}), was_started=False)
    assert value(m, "agentserve_frontend_requests_total", model="other") == 1
    assert value(m, "agentserve_frontend_stripped_spans_total", rule="date") == 2
    assert value(m, "agentserve_frontend_stripped_spans_total", rule="other") == 3
    with pytest.raises(ValueError):
        m.request_started("grpc", "qwen3")


def test_each_instance_has_its_own_registry() -> None:
    first, second = FrontendMetrics(["m"]), FrontendMetrics(["m"])  # no duplicate-name error
    first.request_finished(a_record(model="m"), was_started=False)
    assert value(first, "agentserve_frontend_requests_total") == 1
    assert value(second, "agentserve_frontend_requests_total") == 0
    assert REGISTRY.get_sample_value("agentserve_frontend_requests_total") is None


def test_tool_event_metrics() -> None:
    m = FrontendMetrics(["m"])
    index = DispatchIndex()
    event = {
        "event_type": "tool_error",
        "agent_context": {"session_id": "s"},
        "tool": {"tool_call_id": "c", "duration_ms": 1500, "error_type": "timeout"},
    }
    m.tool_event(index.join(parse_tool_event(event, received_unix_ms=1e12)))
    m.tool_event_rejected("zmq")
    assert value(m, "agentserve_frontend_tool_events_total", event_type="tool_error", status="error") == 1
    assert value(m, "agentserve_frontend_tool_duration_seconds_sum", status="error") == pytest.approx(1.5)
    assert value(m, "agentserve_frontend_tool_events_joined_total") == 0
    assert value(m, "agentserve_frontend_tool_events_rejected_total", source="zmq") == 1


def test_trace_sink_counts_are_exported(tmp_path: Path) -> None:
    config = FrontendConfig(trace_sink=str(tmp_path / "t.jsonl"), trace_gzip=False, model="qwen3")
    hub = Telemetry.from_config(config)
    req = hub.request("r", "responses", "qwen3", t=0.0)
    req.finished(Usage(10, 1), "stop", t=0.1)
    req.finished(Usage(10, 1), "stop", t=0.2)  # a second end is not a second request
    hub.close()
    m = hub.metrics
    assert value(m, "agentserve_frontend_trace_records_total", result="written") == 1
    assert value(m, "agentserve_frontend_trace_records_total", result="dropped") == 0
    assert value(m, "agentserve_frontend_requests_total") == 1
    assert value(m, "agentserve_frontend_inflight_requests") == 0
    line = json.loads((tmp_path / "t.jsonl").read_text())
    assert line["request"]["api"] == "responses"


def test_from_config_labels_configured_strip_rules_and_served_aliases() -> None:
    config = FrontendConfig(model="qwen3", strip_pattern=["date=Today is .*"])
    hub = Telemetry.from_config(config, served_models=["qwen3-alias"])
    record = a_record(model="qwen3-alias", stripped={"date": 1, "anthropic_billing": 1})
    hub.metrics.request_finished(record, was_started=False)
    m = hub.metrics
    assert value(m, "agentserve_frontend_requests_total", model="qwen3-alias") == 1
    assert value(m, "agentserve_frontend_stripped_spans_total", rule="date") == 1
    assert value(m, "agentserve_frontend_stripped_spans_total", rule="anthropic_billing") == 1
    hub.close()


# ----------------------------------------------------------------------------- labels stay bounded

ALLOWED_LABELS: dict[str, set[str]] = {
    "api": set(ALL_APIS),
    "model": {"qwen3", "other"},
    "status": set(STATUSES) | set(CALL_STATUSES) | {"running", "succeeded", "error", "cancelled"},
    "cause": set(DRIFT_CAUSES),
    "rule": {"anthropic_billing", "other"},
    "event_type": {"tool_start", "tool_end", "tool_error"},
    "source": {"http", "zmq"},
    "result": {"written", "dropped", "error"},
    "harness": set(HARNESSES),
    "link": set(SUBAGENT_LINKS),
    "le": set(),  # bucket bounds: checked to be numbers
}

ids = st.text(alphabet=string.ascii_letters + string.digits + "-_.:", min_size=6, max_size=40).map(
    lambda s: "UNTRUSTED" + s
)


@given(
    st.fixed_dictionaries(
        dict.fromkeys(("session", "request_id", "worker", "tool", "model", "rule", "call"), ids)
    )
)
def test_untrusted_ids_never_become_labels(v: dict[str, str]) -> None:
    session, tool = v["session"], v["tool"]
    m = FrontendMetrics(["qwen3"], strip_rules=["anthropic_billing"])
    m.request_started("chat", v["model"])
    common = {"session": session, "request_id": v["request_id"], "worker": v["worker"], "tool": tool}
    m.request_finished(a_record(model=v["model"], stripped={v["rule"]: 1}, **common))  # type: ignore[arg-type]
    m.request_finished(a_record(**common), was_started=False)  # type: ignore[arg-type]
    event = {
        "event_type": "tool_end",
        "agent_context": {"session_id": session, "trajectory_id": session},
        "tool": {"tool_call_id": v["call"], "tool_name": tool, "duration_ms": 5},
    }
    m.tool_event(DispatchIndex().join(parse_tool_event(event, received_unix_ms=1e12)))
    text = m.exposition()[0].decode()
    assert "UNTRUSTED" not in text
    for sample in samples(m):
        for label, label_value in sample.labels.items():
            assert label in ALLOWED_LABELS, label
            if label == "le":
                float(label_value)
            else:
                assert label_value in ALLOWED_LABELS[label], (label, label_value)


def test_a_request_path_that_raises_still_ends_its_telemetry() -> None:
    hub = Telemetry(metrics=FrontendMetrics(["m"]))
    with pytest.raises(RuntimeError), hub.request("r", "chat", "m", t=0.0) as req:
        raise RuntimeError("boom")
    assert req.done and req.builder.record is not None
    assert req.builder.record.error_code == "internal_error"
    assert value(hub.metrics, "agentserve_frontend_inflight_requests") == 0
    assert value(hub.metrics, "agentserve_frontend_requests_total", status="server_error") == 1
    with hub.request("r2", "chat", "m", t=0.0) as ok:
        ok.finished(Usage(1, 1), "stop", t=0.1)
    assert value(hub.metrics, "agentserve_frontend_requests_total", status="stop") == 1


def test_the_harness_label_comes_from_where_the_session_id_came_from() -> None:
    assert harness_of("header:x-claude-code-session-id") == "claude-code"
    assert harness_of("header:x-claude-code-agent-id") == "claude-code"
    assert harness_of("metadata.user_id") == "claude-code"
    assert harness_of("header:session-id") == "codex"
    assert harness_of("prompt_cache_key") == "codex"
    assert harness_of("header:x-session-id") == "opencode"
    assert harness_of("header:x-agentserve-session-id") == "agentserve"
    assert harness_of("nvext.agent_context") == "agentserve"
    assert harness_of("conversation") == "other"
    assert harness_of(None) == "none"
    assert {harness_of(s) for s in ("metadata.user_id", "header:thread-id", None, "x")} <= set(HARNESSES)


def test_returning_turns_count_their_prompt_and_cache_hits_apart() -> None:
    metrics = FrontendMetrics(["m"])
    hub = Telemetry(metrics=metrics)
    first = hub.request("r1", "anthropic", "m", t=0.0)
    first.rendered(block_hashes=[], block_size=32, input_length=100, t=0.1)
    first.finished(Usage(input_tokens=100, cached_tokens=0, output_tokens=5), "stop", t=1.0)
    again = hub.request("r2", "anthropic", "m", t=2.0)
    report = DriftReport(105, 105, 140, "", "", "")
    again.rendered(block_hashes=[], block_size=32, input_length=140, drift=report, t=2.1)
    again.finished(Usage(input_tokens=140, cached_tokens=96, output_tokens=5), "stop", t=3.0)

    def value(name: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"api": "anthropic", "model": "m"})

    assert value("agentserve_frontend_input_tokens_total") == 240
    assert value("agentserve_frontend_returning_input_tokens_total") == 140
    assert value("agentserve_frontend_returning_cached_tokens_total") == 96
    assert value("agentserve_frontend_session_starts_total") == 1  # r1 started it; r2 returned
    assert (
        metrics.registry.get_sample_value(
            "agentserve_frontend_harness_requests_total", {"api": "anthropic", "harness": "none"}
        )
        == 2
    )
