"""Summaries of latency samples: nearest-rank percentiles, and medians across rounds.

Pure: lists of integers (nanoseconds) in, floats (milliseconds) out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

QUANTILES = (0.5, 0.9, 0.99)
"""The percentiles every summary carries (besides the maximum)."""


def percentile(sorted_values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile of an ascending, non-empty sequence (``q`` in [0, 1]).

    The smallest value with at least ``q`` of the samples at or below it, so
    p100 is the maximum and p0 the minimum.
    """
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(frozen=True, slots=True)
class Summary:
    """Distribution of one kind of latency sample, in milliseconds."""

    count: int
    """Samples summarized."""
    p50_ms: float
    """Median."""
    p90_ms: float
    """90th percentile."""
    p99_ms: float
    """99th percentile."""
    max_ms: float
    """Largest sample."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Summary:
        """Inverse of ``to_dict``."""
        return cls(
            count=int(d["count"]),
            p50_ms=float(d["p50_ms"]),
            p90_ms=float(d["p90_ms"]),
            p99_ms=float(d["p99_ms"]),
            max_ms=float(d["max_ms"]),
        )


EMPTY = Summary(count=0, p50_ms=math.nan, p90_ms=math.nan, p99_ms=math.nan, max_ms=math.nan)
"""The summary of no samples (every statistic NaN)."""


def summarize_ns(values_ns: Iterable[int]) -> Summary:
    """Summarize nanosecond samples as milliseconds; ``EMPTY`` when there are none."""
    ordered = sorted(values_ns)
    if not ordered:
        return EMPTY
    p50, p90, p99 = (percentile(ordered, q) / 1e6 for q in QUANTILES)
    return Summary(count=len(ordered), p50_ms=p50, p90_ms=p90, p99_ms=p99, max_ms=ordered[-1] / 1e6)


def median(values: Iterable[float]) -> float:
    """Median of the finite values (mean of the middle two for an even count); NaN if none."""
    finite = sorted(v for v in values if not math.isnan(v))
    n = len(finite)
    if n == 0:
        return math.nan
    mid = n // 2
    return finite[mid] if n % 2 else (finite[mid - 1] + finite[mid]) / 2


def median_summary(summaries: Sequence[Summary]) -> Summary:
    """Field-wise median of per-round summaries (count is summed over the rounds)."""
    if not summaries:
        return EMPTY
    return Summary(
        count=sum(s.count for s in summaries),
        p50_ms=median(s.p50_ms for s in summaries),
        p90_ms=median(s.p90_ms for s in summaries),
        p99_ms=median(s.p99_ms for s in summaries),
        max_ms=median(s.max_ms for s in summaries),
    )
