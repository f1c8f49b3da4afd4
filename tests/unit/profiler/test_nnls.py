from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentserve.profiler.nnls import nnls


def test_an_exact_system_is_solved_across_nine_orders_of_magnitude() -> None:
    truth = [4e-3, 25e-6, 17.6e-9, 0.87e-9]
    rng = random.Random(1)
    rows = [[1.0, rng.randint(1, 256), rng.randint(1, 10**6), rng.randint(1, 10**9)] for _ in range(20)]
    targets = [sum(a * x for a, x in zip(r, truth, strict=True)) for r in rows]
    solved = nnls(rows, targets)
    for got, want in zip(solved, truth, strict=True):
        assert got == pytest.approx(want, rel=1e-6)


def test_a_coefficient_the_data_wants_negative_is_held_at_zero() -> None:
    # y = 2·a − 1·b fits exactly with b < 0; the non-negative answer drops b.
    rows = [[1.0, 1.0], [2.0, 1.0], [3.0, 1.0], [4.0, 1.0]]
    targets = [2 * r[0] - 1.0 for r in rows]
    a, b = nnls(rows, targets)
    assert b == 0.0 and a > 0


def test_a_column_of_zeros_gets_zero() -> None:
    assert nnls([[1.0, 0.0], [2.0, 0.0]], [3.0, 6.0]) == pytest.approx([3.0, 0.0])


@given(
    st.lists(st.lists(st.floats(0, 100), min_size=3, max_size=3), min_size=3, max_size=12),
    st.lists(st.floats(-50, 200), min_size=12, max_size=12),
)
def test_the_answer_is_never_negative_and_no_worse_than_zero(rows: list[list[float]], y: list[float]) -> None:
    targets = y[: len(rows)]
    x = nnls(rows, targets)
    assert all(v >= 0 for v in x)

    def residual(v: list[float]) -> float:
        return sum(
            (sum(a * b for a, b in zip(r, v, strict=True)) - t) ** 2
            for r, t in zip(rows, targets, strict=True)
        )

    assert residual(x) <= residual([0.0, 0.0, 0.0]) + 1e-6 * (1 + residual([0.0, 0.0, 0.0]))


def test_no_rows_is_an_error() -> None:
    with pytest.raises(ValueError):
        nnls([], [])
