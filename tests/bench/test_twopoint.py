"""The two-point fit: per-request and per-token cost from CPU per token at two lengths."""

from __future__ import annotations

import math

import pytest

from bench.twopoint import fit_line


def test_two_lengths_give_the_line_exactly():
    # 700 µs a request and 45 µs a token: 115 µs/token at 10, 48.5 at 200.
    r, t = fit_line([(10, 45 + 700 / 10), (200, 45 + 700 / 200)])
    assert r == pytest.approx(700)
    assert t == pytest.approx(45)


def test_more_lengths_are_fitted_by_least_squares():
    points = [(n, 30 + 126 / n + e) for n, e in ((10, 0.4), (50, -0.3), (200, 0.1))]
    r, t = fit_line(points)
    assert r == pytest.approx(126, abs=6)
    assert t == pytest.approx(30, abs=0.5)


@pytest.mark.parametrize("points", [[], [(10, 50.0)], [(10, 50.0), (10, 51.0)],
                                    [(10, 50.0), (200, math.nan)]])  # fmt: skip
def test_no_fit_without_two_measured_lengths(points):
    r, t = fit_line(points)
    assert math.isnan(r)
    assert math.isnan(t)
