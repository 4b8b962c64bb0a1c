"""Ordinary least squares for the advisor's fit: a few parameters, pure Python.

Pure. The columns are scaled to unit norm before the normal equations are
solved (prompt tokens, ~1e3, beside ones), and a (nearly) singular system
answers ``None``: the observations cannot tell the parameters apart.
"""

from __future__ import annotations

import math

INVERSE_MIN_PIVOT = 1e-9
"""Below this pivot (columns scaled to unit norm) the system is taken as singular."""


def least_squares(xs: list[list[float]], ys: list[float]) -> tuple[list[float], float] | None:
    """(coefficients, standard error of the first) of ``ys ~ xs``; ``None`` if singular."""
    n, m = len(ys), len(xs[0]) if xs else 0
    if n <= m:
        return None  # no residual left to tell the error by
    # Columns scaled to unit norm first: tokens (~1e3) and ones (1) stay comparable.
    scale = [math.sqrt(sum(x[j] ** 2 for x in xs)) or 1.0 for j in range(m)]
    a = [[sum(x[i] * x[j] for x in xs) / (scale[i] * scale[j]) for j in range(m)] for i in range(m)]
    b = [sum(x[i] * y for x, y in zip(xs, ys, strict=True)) / scale[i] for i in range(m)]
    inv = _inverse(a)
    if inv is None:
        return None
    beta = [sum(inv[i][j] * b[j] for j in range(m)) / scale[i] for i in range(m)]
    sse = sum(
        (y - sum(c * xi for c, xi in zip(beta, x, strict=True))) ** 2
        for x, y in zip(xs, ys, strict=True)
    )
    se = math.sqrt(sse / (n - m) * inv[0][0]) / scale[0]
    return beta, se


def _inverse(a: list[list[float]]) -> list[list[float]] | None:
    """Gauss-Jordan inverse of a small symmetric matrix; ``None`` when (nearly) singular."""
    m = len(a)
    work = [row[:] + [float(i == j) for j in range(m)] for i, row in enumerate(a)]
    for col in range(m):
        pivot = max(range(col, m), key=lambda r: abs(work[r][col]))
        if abs(work[pivot][col]) < INVERSE_MIN_PIVOT:
            return None
        work[col], work[pivot] = work[pivot], work[col]
        head = work[col][col]
        work[col] = [v / head for v in work[col]]
        for r in range(m):
            if r != col and work[r][col]:
                factor = work[r][col]
                work[r] = [v - factor * p for v, p in zip(work[r], work[col], strict=True)]
    return [row[m:] for row in work]
