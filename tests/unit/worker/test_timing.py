from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentserve.worker.profiles import default_timing
from agentserve.worker.timing import StepWork

ctx = st.integers(0, 200_000)
chunk = st.tuples(ctx, st.integers(1, 8192))


def t(prefill: list[tuple[int, int]] = [], decode: list[int] = []) -> float:  # noqa: B006
    return default_timing().step_seconds(StepWork(prefill, decode))


def test_an_empty_iteration_takes_no_time() -> None:
    assert t() == 0.0


@given(st.lists(ctx, max_size=64), ctx)
def test_decode_grows_with_batch(decode: list[int], extra: int) -> None:
    assert t(decode=[*decode, extra]) > t(decode=decode)


@given(st.lists(ctx, min_size=1, max_size=64), st.integers(0, 63), st.integers(1, 50_000))
def test_decode_grows_with_context(decode: list[int], i: int, more: int) -> None:
    i %= len(decode)
    longer = list(decode)
    longer[i] += more
    assert t(decode=longer) > t(decode=decode)


@given(chunk, st.integers(1, 8192))
def test_prefill_grows_with_uncached_tokens(c: tuple[int, int], more: int) -> None:
    start, n = c
    assert t(prefill=[(start, n + more)]) > t(prefill=[(start, n)])


@given(chunk, st.integers(1, 100_000))
def test_prefill_of_the_same_tokens_costs_more_deeper_in_the_context(c: tuple[int, int], more: int) -> None:
    start, n = c
    assert t(prefill=[(start + more, n)]) > t(prefill=[(start, n)])


def test_cached_prefix_makes_prefill_cheaper_than_full_prefill() -> None:
    full = t(prefill=[(0, 32_768)])
    tail = t(prefill=[(32_000, 768)])
    assert tail < full / 10


def test_default_coefficients_are_plausible_for_the_named_model() -> None:
    # Single-stream decode near 250 tokens/s; 256 streams at 8k context within 10–60 ms per step.
    assert 150 < 1 / t(decode=[1000]) < 400
    assert 0.010 < t(decode=[8192] * 256) < 0.060
    # A 32k-token prompt from scratch takes about a second.
    assert 0.5 < t(prefill=[(0, 32_768)]) < 2.0
