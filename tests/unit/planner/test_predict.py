from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentserve.planner.predict import Demand, predict
from agentserve.worker.profiles import load_profile
from agentserve.worker.timing import StepWork

H200 = load_profile("h200-qwen3-30b-a3b-pytorch").timing
B200 = load_profile("b200-qwen3-30b-a3b-estimate").timing

demands = st.builds(
    Demand,
    request_rate=st.floats(0.0, 40.0),
    uncached_tokens=st.floats(1.0, 60_000.0),
    cached_tokens=st.floats(0.0, 100_000.0),
    output_tokens=st.floats(1.0, 2_000.0),
    context_tokens=st.floats(1.0, 120_000.0),
)


@given(demands, st.integers(1, 31), st.sampled_from([H200, B200]))
def test_more_workers_never_predict_worse_latency(demand: Demand, n: int, timing: object) -> None:
    fewer, more = predict(demand, n, timing), predict(demand, n + 1, timing)  # type: ignore[arg-type]
    if fewer.saturated:
        return
    assert not more.saturated
    assert more.ttft_s <= fewer.ttft_s * (1 + 1e-3)
    assert more.itl_s <= fewer.itl_s * (1 + 1e-3)


def test_an_idle_fleet_answers_at_the_engines_own_speed() -> None:
    d = Demand(
        request_rate=0.0, uncached_tokens=1000, cached_tokens=52_000, output_tokens=100, context_tokens=53_000
    )
    p = predict(d, 1, H200)
    one_step = H200.step_seconds(StepWork(decode=(53_000,)))
    prefill = H200.step_seconds(StepWork(prefill=((52_000, 1000),), decode=(53_000,)))
    assert p.itl_s == pytest.approx(one_step)
    assert p.ttft_s == pytest.approx(one_step / 2 + prefill)
    assert p.mixed_share == 0.0


def test_more_load_than_a_worker_can_prefill_saturates_it() -> None:
    # 30,000 uncached tokens at ~28 µs each are ~0.9 s of prefill: 2 such requests a second cannot fit.
    d = Demand(
        request_rate=2.0, uncached_tokens=30_000, cached_tokens=0, output_tokens=100, context_tokens=30_000
    )
    assert predict(d, 1, H200).saturated and math.isinf(predict(d, 1, H200).ttft_s)
    assert not predict(d, 4, H200).saturated


def test_prefill_interference_shows_in_the_itl_once_mixed_iterations_are_common() -> None:
    d = Demand(
        request_rate=6.0, uncached_tokens=4000, cached_tokens=20_000, output_tokens=300, context_tokens=24_000
    )
    busy, calm = predict(d, 3, H200), predict(d, 24, H200)
    assert busy.mixed_share > 0.1 > calm.mixed_share
    assert busy.itl_s > 3 * calm.itl_s  # a chunk batched with decodes inflates their step


def test_at_least_one_worker() -> None:
    with pytest.raises(ValueError):
        predict(Demand(1, 1, 0, 1, 1), 0, H200)
