from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentserve.worker.profiles import default_timing, load_profile
from agentserve.worker.timing import StepWork, TimingModel

ctx = st.integers(0, 200_000)
chunk = st.tuples(ctx, st.integers(1, 8192))
MODELS = {
    "default": default_timing(),
    # The measured profile: saturating MoE term and a launch floor on prefill iterations.
    "h200": load_profile("h200-qwen3-30b-a3b-pytorch").timing,
    # Measured by bench/gpu_step_times.py: a mixed-step term, no launch floor.
    "h200-graphs": load_profile("h200-qwen3-30b-a3b-torch-graphs").timing,
}
model_names = st.sampled_from(sorted(MODELS))


def t(prefill: list[tuple[int, int]] = [], decode: list[int] = [], model: str = "default") -> float:  # noqa: B006
    return MODELS[model].step_seconds(StepWork(prefill, decode))


def test_an_empty_iteration_takes_no_time() -> None:
    assert t() == 0.0 and t(model="h200") == 0.0


@given(st.lists(ctx, max_size=64), ctx, model_names)
def test_decode_grows_with_batch(decode: list[int], extra: int, model: str) -> None:
    assert t(decode=[*decode, extra], model=model) > t(decode=decode, model=model)


@given(st.lists(ctx, min_size=1, max_size=64), st.integers(0, 63), st.integers(1, 50_000), model_names)
def test_decode_grows_with_context(decode: list[int], i: int, more: int, model: str) -> None:
    i %= len(decode)
    longer = list(decode)
    longer[i] += more
    assert t(decode=longer, model=model) > t(decode=decode, model=model)


@given(chunk, st.integers(1, 8192), model_names)
def test_prefill_never_shrinks_with_uncached_tokens(c: tuple[int, int], more: int, model: str) -> None:
    start, n = c
    assert t(prefill=[(start, n + more)], model=model) >= t(prefill=[(start, n)], model=model)


@given(chunk, st.integers(1, 8192))
def test_prefill_grows_with_uncached_tokens_without_a_floor(c: tuple[int, int], more: int) -> None:
    start, n = c
    assert t(prefill=[(start, n + more)]) > t(prefill=[(start, n)])


@given(chunk, st.integers(1, 100_000), model_names)
def test_prefill_of_the_same_tokens_costs_no_less_deeper_in_the_context(
    c: tuple[int, int], more: int, model: str
) -> None:
    start, n = c
    assert t(prefill=[(start + more, n)], model=model) >= t(prefill=[(start, n)], model=model)


@given(st.lists(chunk, min_size=1, max_size=4), st.lists(ctx, max_size=64), model_names)
def test_a_prefilling_iteration_never_takes_less_than_the_launch_floor(
    prefill: list[tuple[int, int]], decode: list[int], model: str
) -> None:
    assert t(prefill=prefill, decode=decode, model=model) >= MODELS[model].prefill_floor_s


def test_cached_prefix_makes_prefill_cheaper_than_full_prefill() -> None:
    for model in MODELS:
        full = t(prefill=[(0, 32_768)], model=model)
        tail = t(prefill=[(32_000, 768)], model=model)
        assert tail < full / 10, model


def test_default_coefficients_are_plausible_for_the_named_model() -> None:
    # Single-stream decode near 250 tokens/s; 256 streams at 8k context within 10–60 ms per step.
    assert 150 < 1 / t(decode=[1000]) < 400
    assert 0.010 < t(decode=[8192] * 256) < 0.060
    # A 32k-token prompt from scratch takes about a second.
    assert 0.5 < t(prefill=[(0, 32_768)]) < 2.0


def test_host_tier_copies_cost_their_bytes_over_the_link() -> None:
    model = MODELS["h200"]
    copy = model.step_seconds(StepWork(decode=[100], onboard_tokens=32_000)) - model.step_seconds(
        StepWork(decode=[100])
    )
    # 32,000 tokens × 96 KiB over 55.2 GB/s pinned: ~57 ms (the note).
    assert copy == pytest.approx(0.057, rel=0.02)


def test_a_model_with_a_negative_or_inconsistent_coefficient_is_refused() -> None:
    base = MODELS["h200"]
    with pytest.raises(ValueError, match="must not be negative"):
        TimingModel(**{**_fields(base), "base_s": -1.0})
    with pytest.raises(ValueError, match="moe_active_experts"):
        TimingModel(**{**_fields(base), "moe_active_experts": 200})


def _fields(model: TimingModel) -> dict[str, object]:
    return {name: getattr(model, name) for name in model.__dataclass_fields__}
