"""Percentiles and medians of the benchmark."""

from __future__ import annotations

import math

import pytest

from bench.stats import EMPTY, Summary, median, median_summary, percentile, summarize_ns


def test_nearest_rank_percentiles_of_one_to_hundred():
    values = list(range(1, 101))
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.9) == 90
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile(values, 0.0) == 1


def test_percentile_of_few_samples_is_a_sample():
    assert percentile([7], 0.99) == 7
    assert percentile([1, 2, 3], 0.5) == 2
    assert percentile([1, 2, 3, 4], 0.5) == 2
    assert percentile([1, 2, 3, 4], 0.51) == 3


def test_percentile_refuses_empty_and_bad_quantile():
    with pytest.raises(ValueError, match="empty"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match="quantile"):
        percentile([1], 1.5)


def test_summarize_converts_ns_to_ms_and_sorts():
    s = summarize_ns([3_000_000, 1_000_000, 2_000_000])
    assert s == Summary(count=3, p50_ms=2.0, p90_ms=3.0, p99_ms=3.0, max_ms=3.0)


def test_summarize_nothing_is_nan():
    s = summarize_ns([])
    assert s.count == 0
    assert math.isnan(s.p50_ms)
    assert s is EMPTY


def test_median_ignores_nan_and_averages_even_counts():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert median([math.nan, 5.0]) == 5.0
    assert math.isnan(median([]))


def test_median_summary_sums_counts():
    a = Summary(10, 1.0, 2.0, 3.0, 4.0)
    b = Summary(20, 3.0, 4.0, 5.0, 6.0)
    c = Summary(30, 2.0, 3.0, 9.0, 5.0)
    m = median_summary([a, b, c])
    assert m == Summary(60, 2.0, 3.0, 5.0, 5.0)
    assert Summary.from_dict(m.to_dict()) == m
