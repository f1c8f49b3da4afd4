"""Non-negative least squares for a handful of unknowns (pure Python; no numpy in the package).

Lawson and Hanson's active-set method ("Solving Least Squares Problems", 1974, ch. 23): grow the
set of free variables by the one whose gradient pulls hardest, solve the unconstrained problem on
that set, and step back toward the previous solution whenever a free variable would turn negative.
Columns are scaled to unit norm first, so coefficients of a nanosecond and of a millisecond are
solved with the same precision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

_TOL = 1e-12


def nnls(rows: Sequence[Sequence[float]], targets: Sequence[float]) -> list[float]:
    """x ≥ 0 minimising ‖A x − b‖₂, for A given as rows."""
    if not rows:
        raise ValueError("no rows to fit")
    n = len(rows[0])
    norms = [math.sqrt(sum(r[j] * r[j] for r in rows)) or 1.0 for j in range(n)]
    a = [[r[j] / norms[j] for j in range(n)] for r in rows]
    b = list(targets)
    x = [0.0] * n
    free: list[int] = []
    for _ in range(3 * n + 10):  # the method ends in at most a few passes per variable
        w = _gradient(a, b, x)
        candidates = [j for j in range(n) if j not in free and w[j] > _TOL]
        if not candidates:
            break
        free.append(max(candidates, key=lambda j: w[j]))
        while True:
            z = _least_squares(a, b, free, n)
            if all(z[j] > _TOL for j in free):
                x = z
                break
            steps = [x[j] / (x[j] - z[j]) for j in free if z[j] <= _TOL and x[j] - z[j] > 0]
            alpha = min(steps, default=0.0)
            x = [x[j] + alpha * (z[j] - x[j]) for j in range(n)]
            free = [j for j in free if x[j] > _TOL]
            if not free:
                x = [0.0] * n
                break
    return [max(x[j], 0.0) / norms[j] for j in range(n)]


def _gradient(a: list[list[float]], b: list[float], x: list[float]) -> list[float]:
    residual = [bi - sum(r[j] * x[j] for j in range(len(x))) for r, bi in zip(a, b, strict=True)]
    return [sum(r[j] * e for r, e in zip(a, residual, strict=True)) for j in range(len(x))]


def _least_squares(a: list[list[float]], b: list[float], cols: list[int], n: int) -> list[float]:
    """Unconstrained least squares on `cols` (the others held at 0), by the normal equations."""
    k = len(cols)
    m = [[sum(r[cols[i]] * r[cols[j]] for r in a) for j in range(k)] for i in range(k)]
    v = [sum(r[cols[i]] * bi for r, bi in zip(a, b, strict=True)) for i in range(k)]
    sol = _solve(m, v)
    out = [0.0] * n
    for i, j in enumerate(cols):
        out[j] = sol[i]
    return out


def _solve(m: list[list[float]], v: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting; a singular direction gets 0."""
    k = len(v)
    aug = [[*row, v[i]] for i, row in enumerate(m)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(aug[r][col]))
        if abs(aug[pivot][col]) < 1e-14:
            continue
        aug[col], aug[pivot] = aug[pivot], aug[col]
        for r in range(k):
            if r != col:
                f = aug[r][col] / aug[col][col]
                if f:
                    aug[r] = [x - f * y for x, y in zip(aug[r], aug[col], strict=True)]
    return [aug[i][k] / aug[i][i] if abs(aug[i][i]) >= 1e-14 else 0.0 for i in range(k)]
