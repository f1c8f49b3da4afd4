"""The planner's decision function: deterministic over a metric history, the retained-session floor,
hysteresis, the queue and the correction from observed latency."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentserve.planner.decide import (
    Decision,
    PlannerConfig,
    Sample,
    WorkerState,
    choose_removals,
    decide,
    kv_floor,
)
from agentserve.planner.predict import Demand
from agentserve.worker.profiles import load_profile

TIMING = load_profile("h200-qwen3-30b-a3b-pytorch").timing
CONFIG = PlannerConfig(
    min_workers=1,
    max_workers=16,
    ttft_target_s=0.5,
    itl_target_s=0.06,
    kv_blocks_per_worker=32_768,
    scale_down_delay_s=60,
)
QUIET = Demand(
    request_rate=0.2, uncached_tokens=800, cached_tokens=20_000, output_tokens=150, context_tokens=21_000
)
BUSY = Demand(
    request_rate=12.0, uncached_tokens=2500, cached_tokens=20_000, output_tokens=250, context_tokens=23_000
)


def sample(at: float, demand: Demand = QUIET, ready: int = 1, **kw: object) -> Sample:
    return Sample(at=at, ready_workers=ready, demand=demand, kv_active_blocks=kw.pop("active", 1000),  # type: ignore[arg-type]
                  kv_retained_blocks=kw.pop("retained", 0), **kw)  # type: ignore[arg-type]  # fmt: skip


def run(samples: list[Sample], current: int | None = None) -> list[Decision]:
    out = []
    for i in range(len(samples)):
        d = decide(samples[: i + 1], CONFIG, TIMING, current, previous=out)
        current = d.desired
        out.append(d)
    return out


def test_a_quiet_fleet_runs_at_the_minimum() -> None:
    d = decide([sample(0)], CONFIG, TIMING)
    assert d.desired == 1 and d.reason.startswith("min")


def test_a_burst_scales_up_at_once_and_the_prediction_meets_the_targets() -> None:
    d = decide([sample(0), sample(5, BUSY)], CONFIG, TIMING, current=1)
    assert d.desired > 2 and d.reason.startswith("targets")
    assert d.predicted.ttft_s <= CONFIG.ttft_target_s and d.predicted.itl_s <= CONFIG.itl_target_s
    smaller = decide(
        [sample(0), sample(5, BUSY)], replace(CONFIG, max_workers=d.desired - 1), TIMING, current=1
    )
    assert smaller.reason.startswith("max")


def test_the_same_history_gives_the_same_decision() -> None:
    history = [
        sample(t, BUSY if 20 <= t < 40 else QUIET, ready=4, observed_ttft_s=0.3) for t in range(0, 120, 5)
    ]
    assert run(history, 4) == run(history, 4)


def test_scale_down_waits_out_the_delay_then_goes_to_what_the_window_needed() -> None:
    busy = [sample(t, BUSY, ready=8) for t in range(0, 30, 5)]
    quiet = [sample(t, QUIET, ready=8) for t in range(30, 200, 5)]
    decisions = run(busy + quiet, 8)
    during = [d for d in decisions if 30 <= d.at < 30 + CONFIG.scale_down_delay_s]
    assert all(d.desired == decisions[len(busy) - 1].desired for d in during)
    assert all(d.reason.startswith("hold") for d in during)
    assert decisions[-1].desired == 1
    # It goes down once the busy samples leave the window, not a sample earlier.
    first_down = next(d for d in decisions if d.reason.startswith("down"))
    assert first_down.at >= 25 + CONFIG.scale_down_delay_s


def test_a_burst_inside_the_delay_keeps_the_workers() -> None:
    history = [sample(t, BUSY if t in (0, 90) else QUIET, ready=8) for t in range(0, 150, 5)]
    decisions = run(history, 8)
    after_second_burst = [d for d in decisions if 90 <= d.at < 90 + CONFIG.scale_down_delay_s]
    assert all(d.desired >= decisions[0].desired for d in after_second_burst)


def test_retained_session_blocks_set_a_floor_the_load_alone_would_not() -> None:
    # Sessions in a tool gap hold 3.5 workers' worth of KV while almost nothing runs.
    held = int(3.5 * CONFIG.kv_blocks_per_worker * CONFIG.kv_fill)
    s = sample(0, QUIET, ready=6, active=100, retained=held)
    assert kv_floor(s, CONFIG) == 4
    d = decide([s], CONFIG, TIMING, current=6)
    assert d.needed == 4 and d.kv_floor == 4
    quiet = [sample(t, QUIET, ready=6, active=100, retained=held) for t in range(0, 300, 5)]
    assert run(quiet, 6)[-1].desired == 4  # never below what the retained sessions hold
    assert run([replace(x, kv_retained_blocks=0) for x in quiet], 6)[-1].desired == 1


def test_the_pinned_prefix_takes_room_on_every_worker_not_once() -> None:
    # 2 workers' worth of sessions; each worker also pins a shared prefix of a quarter of its room.
    room = CONFIG.kv_blocks_per_worker * CONFIG.kv_fill
    s = sample(0, QUIET, ready=4, active=0, retained=int(2 * room))
    assert kv_floor(s, CONFIG) == 2
    assert kv_floor(replace(s, kv_pinned_blocks=int(room / 4)), CONFIG) == 3  # 2 / 0.75 → 3
    # A prefix as large as the cache cannot make the floor infinite.
    assert kv_floor(replace(s, kv_pinned_blocks=CONFIG.kv_blocks_per_worker), CONFIG) >= 1


def test_requests_waiting_while_the_model_says_enough_add_a_worker() -> None:
    d = decide([sample(0, QUIET, ready=2, waiting=30)], CONFIG, TIMING, current=2)
    assert d.desired == 3 and d.reason.startswith("queue")


def test_observed_latency_above_the_prediction_corrects_the_model() -> None:
    base = [sample(t, BUSY, ready=8) for t in range(0, 30, 5)]
    plain = decide(base, CONFIG, TIMING, current=8)
    at_8 = (
        plain.predicted
        if plain.desired == 8
        else decide(base, replace(CONFIG, min_workers=8), TIMING).predicted
    )
    slow = [replace(s, observed_ttft_s=3 * at_8.ttft_s, observed_itl_s=3 * at_8.itl_s) for s in base]
    corrected = decide(slow, CONFIG, TIMING, current=8)
    assert corrected.desired > plain.desired


def test_the_cheapest_workers_to_lose_go_first() -> None:
    workers = [
        WorkerState("a", retained_blocks=900, active_requests=1),
        WorkerState("b", retained_blocks=10, active_requests=5),
        WorkerState("c", retained_blocks=10, active_requests=2),
        WorkerState("d", retained_blocks=5000, active_requests=0, ready=False),
    ]
    assert choose_removals(workers, 2) == ["d", "c"]
    assert choose_removals(workers, 0) == []


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ValueError):
        replace(CONFIG, min_workers=5, max_workers=4)
    with pytest.raises(ValueError):
        replace(CONFIG, headroom=0)
    with pytest.raises(ValueError):
        decide([], CONFIG, TIMING)


def test_the_delay_remembers_what_each_decision_needed_when_it_was_made() -> None:
    # A burst whose decisions needed 6; afterwards the same samples judged with a milder correction
    # would need fewer — the recorded needs still hold the workers through the delay.
    history = [sample(t, BUSY, ready=6) for t in range(0, 20, 5)] + [sample(20, QUIET, ready=6)]
    burst = Decision(15, 6, "targets: …", 6, 1, decide(history[:1], CONFIG, TIMING).predicted, None, None)
    held = decide(history, replace(CONFIG, max_workers=16), TIMING, current=6, previous=[burst])
    assert held.desired == 6 and held.reason.startswith("hold")
