"""A base-2 exponential histogram, aggregated in-process exactly as the OpenTelemetry SDK does.

OTLP's exponential histogram: at scale ``s`` the bucket of index ``i`` holds
``(base**i, base**(i+1)]`` with ``base = 2 ** (2 ** -s)``; exact zeros are
counted apart (the zero bucket, threshold 0). Like the SDK's histogram
instrument, it takes no negative values (so its negative buckets stay empty). A series starts at
``max_scale`` and, when a value would make its populated index range wider
than ``max_size`` buckets, drops to the highest scale at which everything fits
(each step down merges neighbouring pairs). Its relative error is therefore
bounded by the data's own spread: ``base - 1`` at the scale the series ends at.

The index of a value is computed with the SDK's own float operations
(``LogarithmMapping`` above scale 0, the IEEE 754 exponent at or below it), so
every value lands in the bucket the SDK's ``ExponentialBucketHistogramAggregation``
puts it in, and a collection gives the SDK's data point (``tests/exporters``
compares them on random data). What differs is the cost: a dict increment
and a logarithm, about a microsecond, for the one instrument observed per token
(``exporters.otel_gaps``).
"""

from __future__ import annotations

import math
import sys
from math import floor, frexp, ldexp, log

from opentelemetry.sdk.metrics.export import Buckets, ExponentialHistogramDataPoint

_MIN_NORMAL = sys.float_info.min
_MIN_NORMAL_EXPONENT = -1022
_MAX_NORMAL_EXPONENT = 1023
_HUGE = 2.0**1000
"""Far below the largest float: the index needs no clamp (the inlined path of ``observe``)."""


class BucketMapping:
    """Value to bucket index at one scale (the SDK's ``LogarithmMapping`` / ``ExponentMapping``)."""

    __slots__ = ("_max_index", "_min_index", "factor", "scale")

    def __init__(self, scale: int) -> None:
        self.scale = scale
        if scale > 0:
            self.factor = ldexp(1 / log(2), scale)
            """``2**scale / ln 2``: the index is ``floor(ln(value) * factor)`` (0 at or below
            scale 0, where the IEEE 754 exponent is used)."""
            self._min_index = (_MIN_NORMAL_EXPONENT << scale) - 1  # values <= the least normal
            self._max_index = ((_MAX_NORMAL_EXPONENT + 1) << scale) - 1
        else:
            self.factor = 0.0
            index = _MIN_NORMAL_EXPONENT >> -scale
            self._min_index = index - 1 if -scale < 2 else index
            self._max_index = _MAX_NORMAL_EXPONENT >> -scale

    def index(self, value: float) -> int:
        """The bucket of ``value`` (finite, > 0)."""
        scale = self.scale
        mantissa, exponent = frexp(value)  # value = mantissa * 2**exponent, mantissa in [0.5, 1)
        if scale > 0:
            if value <= _MIN_NORMAL:
                return self._min_index
            if mantissa == 0.5:  # an exact power of two: the upper bound of its bucket
                return ((exponent - 1) << scale) - 1
            return min(floor(log(value) * self.factor), self._max_index)
        if value < _MIN_NORMAL:
            return self._min_index
        return (exponent - 1 - (mantissa == 0.5)) >> -scale


class _Buckets:
    """The populated buckets: index to count, and the index range in use."""

    __slots__ = ("counts", "high", "low")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.low = 0
        self.high = -1  # empty

    def downscale(self, change: int) -> None:
        if not self.counts or not change:
            return
        merged: dict[int, int] = {}
        for index, count in self.counts.items():
            key = index >> change
            merged[key] = merged.get(key, 0) + count
        self.counts = merged
        self.low >>= change
        self.high >>= change

    def point(self) -> Buckets:
        if not self.counts:
            return Buckets(offset=0, bucket_counts=[0])  # as the SDK writes an empty side
        get = self.counts.get
        return Buckets(self.low, [get(i, 0) for i in range(self.low, self.high + 1)])


def scale_change(low: int, high: int, max_size: int) -> int:
    """How many scales down the index range ``[low, high]`` must go to fit ``max_size`` buckets."""
    change = 0
    while high - low >= max_size:
        high >>= 1
        low >>= 1
        change += 1
    return change


class ExponentialHistogram:
    """One series' base-2 exponential histogram (not thread-safe: the caller locks)."""

    __slots__ = (
        "_buckets", "_factor", "_mapping", "count", "max", "max_scale", "max_size", "min", "sum",
        "zero_count",
    )  # fmt: skip

    def __init__(self, max_size: int, max_scale: int) -> None:
        if max_size < 2:
            raise ValueError(f"max_size must be >= 2, got {max_size}")
        if not -10 <= max_scale <= 20:
            raise ValueError(f"max_scale must be within -10..20, got {max_scale}")
        self.max_size = max_size
        """Most buckets."""
        self.max_scale = max_scale
        """The scale a series starts at (the finest it ever has)."""
        self._mapping = BucketMapping(max_scale)
        self._factor = self._mapping.factor
        self._buckets = _Buckets()
        self.count = 0
        """Observations, zeros included."""
        self.sum = 0.0
        """Their sum."""
        self.zero_count = 0
        """Observations exactly 0."""
        self.min = math.inf
        """The least observation (``inf`` before the first)."""
        self.max = -math.inf
        """The greatest observation (``-inf`` before the first)."""

    @property
    def scale(self) -> int:
        """The current scale (0 while only zeros were observed, as the SDK reports it)."""
        if not self._buckets.counts:
            return 0 if self.zero_count else self._mapping.scale
        return self._mapping.scale

    def observe(self, value: float) -> None:
        """Count ``value``; negatives, NaN and infinity are dropped (they have no bucket here)."""
        if not 0 <= value < math.inf:
            return
        self.count += 1
        self.sum += value
        if value < self.min:  # noqa: PLR1730 - cheaper than min() per token
            self.min = value
        if value > self.max:  # noqa: PLR1730
            self.max = value
        if value == 0:
            self.zero_count += 1
            return
        factor = self._factor
        if factor and _MIN_NORMAL < value < _HUGE:  # the usual case: BucketMapping.index, inlined
            mantissa, exponent = frexp(value)
            if mantissa == 0.5:
                index = ((exponent - 1) << self._mapping.scale) - 1
            else:
                index = floor(log(value) * factor)
        else:
            index = self._mapping.index(value)
        b = self._buckets
        if b.low <= index <= b.high:
            counts = b.counts
            counts[index] = counts.get(index, 0) + 1
            return
        self._widen(index, value)

    def _widen(self, index: int, value: float) -> None:
        """Count ``value`` (bucket ``index``) outside the range in use, rescaling if needed."""
        b = self._buckets
        if not b.counts:
            b.low = b.high = index
        else:
            change = scale_change(min(b.low, index), max(b.high, index), self.max_size)
            if change:
                b.downscale(change)
                self._mapping = BucketMapping(self._mapping.scale - change)
                self._factor = self._mapping.factor
                index = self._mapping.index(value)
            b.low, b.high = min(b.low, index), max(b.high, index)
        b.counts[index] = b.counts.get(index, 0) + 1

    def data_point(
        self, attributes: dict[str, str], start_unix_ns: int, now_unix_ns: int
    ) -> ExponentialHistogramDataPoint:
        """The OTLP data point of everything observed so far."""
        return ExponentialHistogramDataPoint(
            attributes=attributes,
            start_time_unix_nano=start_unix_ns,
            time_unix_nano=now_unix_ns,
            count=self.count,
            sum=self.sum,
            scale=self.scale,
            zero_count=self.zero_count,
            positive=self._buckets.point(),
            negative=Buckets(offset=0, bucket_counts=[0]),  # as the SDK writes an empty side
            flags=0,
            min=self.min,
            max=self.max,
        )

    def reset(self) -> None:
        """Forget every observation and start again at ``max_scale``: a delta export (the SDK
        gives each export interval a new aggregation)."""
        self._mapping = BucketMapping(self.max_scale)
        self._factor = self._mapping.factor
        self._buckets = _Buckets()
        self.count = self.zero_count = 0
        self.sum = 0.0
        self.min, self.max = math.inf, -math.inf
