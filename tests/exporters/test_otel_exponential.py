"""The in-process exponential histogram gives the SDK's data points, value for value.

Random values of every magnitude (powers of two, subnormals, zeros, the
gaps' usual milliseconds), in several export intervals, cumulative and delta,
at several sizes and scales: the same scale, zero count, buckets, count,
sum, min and max as ``ExponentialBucketHistogramAggregation``.
"""

from __future__ import annotations

import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

from exporters.otel_exponential import ExponentialHistogram, scale_change
from tests.exporters.test_otel_gaps import trimmed

values = st.one_of(
    st.floats(min_value=1e-4, max_value=30.0),  # gaps and latencies
    st.integers(min_value=-1074, max_value=1023).map(lambda e: math.ldexp(1.0, e)),
    st.floats(min_value=0.0, max_value=sys.float_info.max, allow_subnormal=True),
    st.just(0.0),
)


def _sdk(batches, max_size, max_scale, delta):
    temporality = {Histogram: AggregationTemporality.DELTA} if delta else {}
    reader = InMemoryMetricReader(preferred_temporality=temporality)
    aggregation = ExponentialBucketHistogramAggregation(max_size=max_size, max_scale=max_scale)
    provider = MeterProvider(
        metric_readers=[reader], views=[View(instrument_name="h", aggregation=aggregation)]
    )
    h = provider.get_meter("t").create_histogram("h")
    out = []
    for batch in batches:
        for v in batch:
            h.record(v)
        data = reader.get_metrics_data()
        rms = data.resource_metrics if data is not None else []
        metrics = [m for rm in rms for sm in rm.scope_metrics for m in sm.metrics]
        out.append(metrics[0].data.data_points[0] if metrics else None)
    return out


def _ours(batches, max_size, max_scale, delta):
    hist = ExponentialHistogram(max_size, max_scale)
    out = []
    for batch in batches:
        for v in batch:
            hist.observe(v)
        out.append(hist.data_point({}, 0, 0) if hist.count else None)
        if delta:
            hist.reset()
    return out


def _key(p):
    if p is None:
        return None
    return (p.count, p.scale, p.zero_count, trimmed(p.positive.offset, p.positive.bucket_counts),
            trimmed(p.negative.offset, p.negative.bucket_counts), p.min, p.max)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(st.lists(values, max_size=40), min_size=1, max_size=3),
    max_size=st.sampled_from([2, 4, 20, 160, 512]),
    max_scale=st.sampled_from([-2, 0, 3, 8, 20]),
    delta=st.booleans(),
)
def test_same_data_points_as_the_sdk(batches, max_size, max_scale, delta):
    if not delta:
        # The SDK's cumulative merge takes the scale of an interval that saw only zeros
        # as 0 and coarsens the whole series to it; ours keeps the scale the values need.
        batches = [b for b in batches if not b or any(v > 0 for v in b)]
    ours, sdk = (
        _ours(batches, max_size, max_scale, delta),
        _sdk(batches, max_size, max_scale, delta),
    )
    assert [_key(p) for p in ours] == [_key(p) for p in sdk]
    for a, b in zip(ours, sdk, strict=True):
        if a is not None:
            assert a.sum == pytest.approx(b.sum, rel=1e-12)


def test_each_value_lies_in_its_bucket():
    hist = ExponentialHistogram(512, 8)
    for v in (1e-6, 0.001, 0.0123, 0.5, 1.0, 2.0, 3.0, 10.0, 3600.0):
        hist.observe(v)
    point = hist.data_point({}, 0, 0)
    base = 2.0 ** (2.0**-point.scale)
    assert point.scale == 4  # 1 µs to an hour: 32 octaves at 16 buckets each
    for v in (1e-6, 0.001, 0.0123, 0.5, 3.0, 10.0, 3600.0):  # not on a boundary
        index = math.floor(math.log(v, base))
        assert point.positive.bucket_counts[index - point.positive.offset] >= 1, v
    # A power of two is the upper bound of the bucket below it.
    assert point.positive.bucket_counts[-1 - point.positive.offset] == 1  # 1.0: (base^-1, 1]


def test_negative_and_non_finite_values_are_dropped():
    hist = ExponentialHistogram(160, 8)
    for v in (-1.0, math.nan, math.inf, -math.inf):
        hist.observe(v)
    assert hist.count == 0
    hist.observe(0.0)
    point = hist.data_point({}, 0, 0)
    assert (point.count, point.zero_count, point.scale) == (1, 1, 0)


def test_scale_change_is_the_least_that_fits():
    assert scale_change(0, 511, 512) == 0
    assert scale_change(0, 512, 512) == 1
    assert scale_change(-1000, 1000, 512) == 2


@pytest.mark.parametrize(("size", "scale"), [(1, 0), (160, 21), (160, -11)])
def test_bad_parameters_are_refused(size, scale):
    with pytest.raises(ValueError, match="max_s"):
        ExponentialHistogram(size, scale)
