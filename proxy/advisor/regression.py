"""Ordinary least squares for the advisor's fit: a few parameters, pure Python.

Pure. The columns are scaled to unit norm before the normal equations are
solved (prompt tokens, ~1e3, beside ones), and a (nearly) singular system
answers ``None``: the observations cannot tell the parameters apart.

A coefficient is *told from 0* when its two-sided 95% interval, ``value +-
t x stderr`` with Student's t at the residual's degrees of freedom, lies above 0:
with few points (a fit of 3 parameters on 5 steps leaves 2 degrees of freedom,
t = 4.30) it asks for more than a fixed "2 standard errors" would, with many the
same (t -> 1.96).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

INVERSE_MIN_PIVOT = 1e-9
"""Below this pivot (columns scaled to unit norm) the system is taken as singular."""

_T975 = (
    (1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365),
    (8, 2.306), (9, 2.262), (10, 2.228), (11, 2.201), (12, 2.179), (13, 2.160), (14, 2.145),
    (15, 2.131), (16, 2.120), (17, 2.110), (18, 2.101), (19, 2.093), (20, 2.086), (21, 2.080),
    (22, 2.074), (23, 2.069), (24, 2.064), (25, 2.060), (26, 2.056), (27, 2.052), (28, 2.048),
    (29, 2.045), (30, 2.042), (40, 2.021), (60, 2.000), (120, 1.980),
)  # fmt: skip
"""Student's t, 97.5th percentile, by degrees of freedom (any statistics table)."""
_Z975 = 1.959964
"""The normal distribution's 97.5th percentile (t at infinite degrees of freedom)."""


def t975(dof: int) -> float:
    """Student's t 97.5th percentile at ``dof`` degrees of freedom (the half-width of a
    two-sided 95% interval in standard errors); between table rows, linear in ``1 / dof``,
    which is how t approaches the normal (within 0.002 of the exact value)."""
    if dof < 1:
        raise ValueError(f"t975: degrees of freedom must be >= 1, got {dof}")
    dofs = [d for d, _ in _T975]
    i = bisect.bisect_left(dofs, dof)
    if i < len(dofs) and dofs[i] == dof:
        return _T975[i][1]
    lo_d, lo_t = _T975[i - 1]
    hi_inv, hi_t = (1 / _T975[i][0], _T975[i][1]) if i < len(dofs) else (0.0, _Z975)
    w = (1 / lo_d - 1 / dof) / (1 / lo_d - hi_inv)
    return lo_t + w * (hi_t - lo_t)


@dataclass(frozen=True, slots=True)
class LeastSquares:
    """A solved least-squares fit: the coefficients and what the residual says of each."""

    beta: list[float]
    """The coefficients, in the order of the columns."""
    stderr: list[float]
    """Standard error of each coefficient."""
    dof: int
    """Degrees of freedom of the residual (points minus coefficients, >= 1)."""

    def low(self, i: int) -> float:
        """Lower end of coefficient ``i``'s two-sided 95% interval."""
        return self.beta[i] - t975(self.dof) * self.stderr[i]

    def above_zero(self, i: int) -> bool:
        """Coefficient ``i``'s 95% interval lies above 0 (it is told from 0)."""
        return self.beta[i] > 0 and self.low(i) > 0

    def interval(self, i: int, scale: float = 1.0, unit: str = "") -> str:
        """``value +- half-width`` of coefficient ``i`` (times ``scale``), for a note."""
        half = t975(self.dof) * self.stderr[i] * scale
        return f"{self.beta[i] * scale:.2f} +- {half:.2f}{unit} (95%, {self.dof} dof)"


def least_squares(xs: list[list[float]], ys: list[float]) -> LeastSquares | None:
    """The fit of ``ys ~ xs``; ``None`` if singular or without a residual to judge it by."""
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
    se = [math.sqrt(max(0.0, sse / (n - m) * inv[i][i])) / scale[i] for i in range(m)]
    return LeastSquares(beta, se, n - m)


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
