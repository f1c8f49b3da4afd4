"""The local planner's readings of the frontend's own metrics: window quantiles from histogram bucket
growth, sessions per second and turns per session."""

from __future__ import annotations

import pytest

from agentserve.planner.local import FrontendReadings
from agentserve.planner.readings import window_quantile
from agentserve.telemetry.metrics import FrontendMetrics

INF = float("inf")


def test_the_quantile_of_what_a_window_added_interpolates_within_its_bucket() -> None:
    before = [(0.1, 10.0), (0.5, 10.0), (1.0, 10.0), (INF, 10.0)]
    # 10 new observations: 4 below 0.1, 6 in (0.5, 1.0].
    after = [(0.1, 14.0), (0.5, 14.0), (1.0, 20.0), (INF, 20.0)]
    assert window_quantile(0.9, before, after) == pytest.approx(0.5 + 0.5 * (9 - 4) / 6)
    assert window_quantile(0.3, before, after) == pytest.approx(0.1 * 3 / 4)


def test_too_few_observations_or_only_overflow() -> None:
    before = [(1.0, 0.0), (INF, 0.0)]
    assert window_quantile(0.9, before, [(1.0, 2.0), (INF, 3.0)]) is None
    assert window_quantile(0.9, before, [(1.0, 0.0), (INF, 9.0)]) == 1.0  # all above the last bound


def test_readings_sum_every_label_set_of_the_frontends_metrics() -> None:
    metrics = FrontendMetrics(["m"])
    readings = FrontendReadings(metrics)
    first = readings.read()
    for api in ("anthropic", "chat"):
        for seconds in (0.2, 0.3, 0.4):
            metrics.ttft.labels(api, "m").observe(seconds)
        metrics.requests.labels(api, "m", "ok").inc(3)
        metrics.session_starts.labels(api, "m").inc()
    second = readings.read()
    assert second.requests - first.requests == 6 and second.session_starts == 2
    p90 = window_quantile(0.9, first.ttft, second.ttft)
    assert p90 is not None and 0.25 <= p90 <= 0.5
