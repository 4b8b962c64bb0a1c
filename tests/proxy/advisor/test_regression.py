"""The advisor's least squares: exact fits, standard errors, and which coefficients are kept.

A coefficient is kept when its two-sided 95% interval (Student's t at the residual's
degrees of freedom) lies above 0: the same estimate and standard error can be kept with
many points and dropped with few.
"""

from __future__ import annotations

import itertools
import math

import pytest

from proxy.advisor.regression import least_squares, t975

# Student's t, 97.5th percentile: published values (any statistics table), including
# degrees of freedom between the rows the module keeps.
T975_PUBLISHED = {
    1: 12.7062,
    2: 4.3027,
    3: 3.1824,
    5: 2.5706,
    10: 2.2281,
    30: 2.0423,
    35: 2.0301,
    50: 2.0086,
    90: 1.9867,
    200: 1.9719,
    1000: 1.9623,
}


@pytest.mark.parametrize(("dof", "want"), sorted(T975_PUBLISHED.items()))
def test_t_quantile_matches_the_published_values(dof: int, want: float) -> None:
    assert t975(dof) == pytest.approx(want, abs=0.002)


def test_t_quantile_falls_towards_the_normal_one() -> None:
    values = [t975(d) for d in range(1, 400)]
    assert all(a > b for a, b in itertools.pairwise(values))
    assert values[-1] > 1.959964


def test_t_quantile_refuses_no_degrees_of_freedom() -> None:
    with pytest.raises(ValueError, match="degrees of freedom"):
        t975(0)


def test_an_exact_line_is_given_back_with_no_error() -> None:
    xs = [[1.0, float(x)] for x in (100, 300, 700, 1200)]
    ys = [0.02 + 0.004 * x[1] for x in xs]
    got = least_squares(xs, ys)
    assert got is not None
    assert got.beta == pytest.approx([0.02, 0.004])
    assert got.stderr == pytest.approx([0.0, 0.0], abs=1e-12)
    assert got.dof == 2
    assert got.above_zero(0)


def test_as_many_points_as_coefficients_leave_nothing_to_judge_by() -> None:
    assert least_squares([[1.0, 2.0], [1.0, 3.0]], [1.0, 2.0]) is None


def test_standard_errors_of_every_coefficient() -> None:
    # y = a + b x with residuals +e, -e, -e, +e at x = 0, 1, 2, 3: the textbook formulas.
    e = 0.1
    xs = [[1.0, float(x)] for x in range(4)]
    ys = [1 + 2 * x[1] + r for x, r in zip(xs, (e, -e, -e, e), strict=True)]
    got = least_squares(xs, ys)
    assert got is not None
    assert got.beta == pytest.approx([1.0, 2.0])
    s2 = 4 * e * e / (4 - 2)  # residual variance
    sxx = sum((x - 1.5) ** 2 for x in range(4))
    assert got.stderr[1] == pytest.approx(math.sqrt(s2 / sxx))
    assert got.stderr[0] == pytest.approx(math.sqrt(s2 * (1 / 4 + 1.5**2 / sxx)))


def _noisy(points: int, intercept: float) -> list[tuple[list[float], float]]:
    """``points`` points about ``intercept + 0.01 x`` with the same +-0.05 alternating noise."""
    return [
        ([1.0, float(x)], intercept + 0.01 * x + (0.05 if i % 2 else -0.05))
        for i, x in enumerate(range(0, 100 * points, 100))
    ]


def test_the_same_estimate_is_kept_with_many_points_and_dropped_with_few() -> None:
    few = least_squares(*map(list, zip(*_noisy(4, 0.2), strict=True)))
    many = least_squares(*map(list, zip(*_noisy(40, 0.2), strict=True)))
    assert few is not None
    assert many is not None
    # Two standard errors above 0 in both, but with 2 degrees of freedom t is 4.30.
    assert few.beta[0] > 2 * few.stderr[0]
    assert not few.above_zero(0)
    assert many.above_zero(0)
    assert "(95%, 2 dof)" in few.interval(0)


def test_a_negative_coefficient_is_never_kept() -> None:
    got = least_squares(*map(list, zip(*_noisy(40, -0.5), strict=True)))
    assert got is not None
    assert got.beta[0] < 0
    assert not got.above_zero(0)


def test_each_standard_error_is_the_one_of_its_column_fitted_first() -> None:
    # The advisor's columns: ones, tokens, context; the fit of the same columns in another
    # order gives each coefficient the same value and standard error.
    pieces = [(504, 0), (504, 504), (192, 1008), (300, 0), (800, 0), (504, 504), (96, 1008)]
    xs = [[1.0, float(x), float(x * (c + x))] for x, c in pieces]
    noise = (0.004, -0.003, 0.002, -0.005, 0.001, 0.003, -0.002)
    ys = [0.03 + 0.001 * x[1] + 2e-7 * x[2] + e for x, e in zip(xs, noise, strict=True)]
    got = least_squares(xs, ys)
    assert got is not None
    for j in range(3):
        order = [j] + [k for k in range(3) if k != j]
        moved = least_squares([[x[k] for k in order] for x in xs], ys)
        assert moved is not None
        assert moved.beta[0] == pytest.approx(got.beta[j])
        assert moved.stderr[0] == pytest.approx(got.stderr[j])
    assert len(set(got.stderr)) == 3
