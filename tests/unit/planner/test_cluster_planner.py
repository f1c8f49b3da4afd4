"""The cluster planner's pure parts: what it reads from /metrics and /load, the samples it builds, the
condition and Events it writes, and the Role it is allowed (the I/O is tested on a real control plane
in tests/e2e_k8s/test_planner.py and over real processes in tests/integration/router)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from datetime import UTC, datetime

import pytest
from prometheus_client import generate_latest

from agentserve.config import PlannerServiceConfig
from agentserve.planner.access import PLANNER_ACCESS, allowed, role_rules
from agentserve.planner.decide import Decision
from agentserve.planner.fleet import FleetReader, load_of, static_discovery
from agentserve.planner.kube import (
    CONDITION_REASONS,
    condition_reason,
    planner_condition,
    same_condition,
    scale_note,
)
from agentserve.planner.local import FrontendReadings
from agentserve.planner.predict import Prediction
from agentserve.planner.readings import Reading, SampleBuilder, parse_frontend_metrics, parse_router_queue
from agentserve.planner.service import ClusterPlanner
from agentserve.telemetry.metrics import FrontendMetrics
from agentserve.worker.engine import Load
from agentserve.worker.profiles import default_timing

NOW = datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)


def _frontend_with_traffic() -> FrontendMetrics:
    metrics = FrontendMetrics(["m"])
    for api in ("anthropic", "responses"):
        for seconds in (0.2, 0.3, 0.4, 3.0):
            metrics.ttft.labels(api, "m").observe(seconds)
            metrics.itl.labels(api, "m").observe(seconds / 100)
        metrics.requests.labels(api, "m", "ok").inc(4)
        metrics.session_starts.labels(api, "m").inc(2)
    return metrics


def test_the_frontends_metrics_text_reads_as_the_in_process_registry_does() -> None:
    metrics = _frontend_with_traffic()
    over_http = parse_frontend_metrics(generate_latest(metrics.registry).decode())
    in_process = FrontendReadings(metrics).read()
    assert over_http == in_process
    assert over_http.requests == 8 and over_http.session_starts == 4


def test_several_frontends_sum_to_one_reading() -> None:
    one = parse_frontend_metrics(generate_latest(_frontend_with_traffic().registry).decode())
    both = Reading.total([one, one])
    assert both is not None and both.requests == 16
    assert dict(both.ttft)[float("inf")] == 2 * dict(one.ttft)[float("inf")]
    assert Reading.total([]) is None


def test_router_queue_and_bad_text() -> None:
    text = "# TYPE agentserve_router_queue_depth gauge\nagentserve_router_queue_depth 7\n"
    assert parse_router_queue(text) == 7
    with pytest.raises(ValueError):
        parse_frontend_metrics("this is { not prometheus")


def _load(finished: int, *, used: int = 0, retained: int = 0, waiting: int = 0) -> Load:
    return Load(
        running=1,
        waiting=waiting,
        kv_blocks_used=used,
        kv_blocks_total=1000,
        kv_blocks_retained=retained,
        prompt_tokens=1000 * finished,
        cached_prompt_tokens=600 * finished,
        generated_tokens=50 * finished,
        requests_finished=finished,
    )


def test_samples_count_the_growth_of_each_workers_counters() -> None:
    builder = SampleBuilder(interval_s=10)
    first = builder.build(0.0, {"a": _load(10), "b": _load(5)}, 2)
    assert first.demand.request_rate == pytest.approx(15 / 10)  # first window: counted from zero
    second = builder.build(
        5.0, {"a": _load(20, used=100, retained=50), "b": _load(5, waiting=2)}, 2, queued=3
    )
    assert second.demand.request_rate == pytest.approx(10 / 5)
    assert second.demand.uncached_tokens == pytest.approx(400)
    assert second.demand.cached_tokens == pytest.approx(600)
    assert (second.kv_active_blocks, second.kv_retained_blocks, second.waiting) == (100, 50, 5)
    # A restarted worker (its counters went back) counts from its new values, never negative.
    third = builder.build(10.0, {"a": _load(2), "b": _load(5)}, 2)
    assert third.demand.request_rate == pytest.approx(2 / 5)


def test_samples_observe_the_window_of_the_frontends() -> None:
    metrics = FrontendMetrics(["m"])
    readings = FrontendReadings(metrics)
    builder = SampleBuilder(interval_s=5)
    builder.prime(readings.read())
    for seconds in (0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 2.5):
        metrics.ttft.labels("chat", "m").observe(seconds)
    metrics.requests.labels("chat", "m", "ok").inc(10)
    metrics.session_starts.labels("chat", "m").inc(2)
    sample = builder.build(5.0, {"a": _load(10)}, 1, frontend=readings.read())
    assert sample.observed_ttft_s is not None and 0.1 < sample.observed_ttft_s <= 0.25
    assert sample.session_rate == pytest.approx(2 / 5) and sample.turns_per_session == pytest.approx(5)


def test_a_load_report_of_a_newer_worker_still_reads() -> None:
    body = json.dumps({**asdict(_load(3)), "a_field_from_the_future": 1}).encode()
    assert load_of(body).requests_finished == 3
    with pytest.raises(ValueError):
        load_of(b"[1, 2]")


def _decision(desired: int, reason: str) -> Decision:
    return Decision(
        0.0, desired, reason, desired, 1, Prediction(desired, 0.5, 0.04, 0.02, 4.0, 0.1), 0.6, None
    )


def test_the_condition_moves_its_transition_time_only_when_its_status_changes() -> None:
    first = planner_condition(
        None, ok=True, reason="MeetingTargets", message="2 workers: t", generation=3, now=NOW
    )
    later = datetime(2026, 11, 27, 12, 5, tzinfo=UTC)
    same = planner_condition(
        first, ok=True, reason="HoldingSessionKv", message="3 workers: k", generation=3, now=later
    )
    assert same["lastTransitionTime"] == first["lastTransitionTime"]
    flipped = planner_condition(
        same, ok=False, reason="NoWorkerReadings", message="none", generation=3, now=later
    )
    assert flipped["lastTransitionTime"] == "2026-11-27T12:05:00Z" and flipped["status"] == "False"


def test_a_condition_is_rewritten_for_a_new_count_not_for_new_predictions() -> None:
    a = planner_condition(
        None, ok=True, reason="MeetingTargets", message="2 workers: TTFT 100 ms", generation=1, now=NOW
    )
    b = planner_condition(
        a, ok=True, reason="MeetingTargets", message="2 workers: TTFT 120 ms", generation=1, now=NOW
    )
    c = planner_condition(
        a, ok=True, reason="MeetingTargets", message="3 workers: TTFT 90 ms", generation=1, now=NOW
    )
    assert same_condition(a, b) and not same_condition(a, c) and not same_condition(None, a)


def test_every_decision_reason_has_a_condition_reason_and_events_say_the_direction() -> None:
    for word in ("min", "kv", "targets", "max", "queue", "hold", "down"):
        assert condition_reason(f"{word}: detail") == CONDITION_REASONS[word]
    up = scale_note(1, _decision(3, "targets: 3 workers predict TTFT 500 ms"))
    assert (up.type, up.reason) == ("Normal", "ScaledUp") and up.message.startswith("1 -> 3 workers: targets")
    capped = scale_note(3, _decision(4, "max: the targets are not met even at max_workers"))
    assert capped.type == "Warning"
    assert scale_note(4, _decision(2, "down: ...")).reason == "ScaledDown"


def test_the_role_is_the_access_table_and_names_only_its_own_object() -> None:
    rules = role_rules("elastic")
    assert len(rules) == len(PLANNER_ACCESS)
    for rule, access in zip(rules, PLANNER_ACCESS, strict=True):
        assert rule["resources"] == [access.resource] and rule["verbs"] == list(access.verbs)
        assert rule.get("resourceNames") == (["elastic"] if access.own_object_only else None)
    for rule in rules:
        assert "*" not in rule["verbs"] and rule["verbs"] != ["delete"]
    assert allowed("agentserve.dev", "agentservingdeployments/scale", "patch")
    assert not allowed("agentserve.dev", "agentservingdeployments", "patch")  # spec only via scale
    assert not allowed("", "pods", "delete") and not allowed("", "secrets", "get")


def test_a_planner_that_reads_no_worker_decides_nothing() -> None:
    config = PlannerServiceConfig.model_validate({"workers": ["http://127.0.0.1:9"], "max_workers": 4})
    reader = FleetReader(static_discovery({"worker": config.workers}))
    planner = ClusterPlanner(config, default_timing(), reader)
    assert asyncio.run(planner.step()) is None
    assert planner.desired is None and not planner.decisions


def test_the_planner_config_refuses_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="min_workers"):
        PlannerServiceConfig.model_validate({"workers": ["http://a:1"], "min_workers": 5, "max_workers": 2})
    with pytest.raises(ValueError, match="worker_service"):
        PlannerServiceConfig.model_validate({"discovery": "kubernetes"})
    with pytest.raises(ValueError, match="needs workers"):
        PlannerServiceConfig.model_validate({})
    with pytest.raises(ValueError, match="discovery kubernetes"):
        PlannerServiceConfig.model_validate({"workers": ["http://a:1"], "deployment": "x"})
