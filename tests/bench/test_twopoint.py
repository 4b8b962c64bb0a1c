"""The two-point fit: per-request and per-token cost from CPU per token at two lengths."""

from __future__ import annotations

import math

import pytest

from bench.rows import BenchOptions, BenchReport, TargetRow
from bench.stats import EMPTY
from bench.targets import select_targets
from bench.twopoint import fit_line, markdown


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


def _report(max_tokens: int, cpu_us_per_token: dict[str, float]) -> BenchReport:
    targets = select_targets(",".join(cpu_us_per_token))
    rows = tuple(
        TargetRow(name, 1000, 0, EMPTY, EMPTY, EMPTY, math.nan, math.nan, cpu, math.nan,
                  math.nan, math.nan, "aa", True)
        for name, cpu in cpu_us_per_token.items()
    )  # fmt: skip
    return BenchReport(BenchOptions(targets=targets, max_tokens=max_tokens), rows, (), 1.0)


def test_every_cost_cell_carries_its_ratio_to_nginx_in_the_same_run():
    # nginx: 126 µs a request, 30 a token; tokenstamp: 252 and 45 (2.00x and 1.50x).
    reports = [
        _report(n, {"direct": math.nan, "nginx": 30 + 126 / n, "tokenstamp": 45 + 252 / n})
        for n in (10, 200)
    ]
    table = markdown(reports)
    assert "In brackets: the ratio to nginx in this run." in table
    assert "| nginx | 42.6 | 30.6 | 126 | 30.0 |" in table
    ratio_10 = (45 + 25.2) / (30 + 12.6)
    assert f"| tokenstamp | 70.2 ({ratio_10:.2f}x) | 46.3 (" in table
    assert "| 252 (2.00x) | 45.0 (1.50x) |" in table
    assert "| direct | - | - | - | - |" in table


def test_without_nginx_in_the_run_the_cells_are_plain_numbers():
    table = markdown([_report(n, {"tokenstamp": 45 + 252 / n}) for n in (10, 200)])
    assert "ratio" not in table
    assert "| tokenstamp | 70.2 | 46.3 | 252 | 45.0 |" in table
