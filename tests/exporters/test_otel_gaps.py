"""The in-process gap histogram exports exactly what the SDK's own histogram would.

Both aggregations: the base-2 exponential one (the default, the SDK's with the
views of ``exporters.otel_setup``) and the explicit buckets.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from exporters import names
from exporters.otel import OtelMetricsSink, histogram
from exporters.otel_gaps import GapHistograms, merged
from exporters.otel_setup import histogram_views
from proxy.core.records import Backend, RequestLabels

EXPLICIT = names.HistogramAggregation.EXPLICIT
EXPONENTIAL = names.HistogramAggregation.EXPONENTIAL

A = RequestLabels("chat", "m", Backend("vllm", "b"))
B = RequestLabels("text_completion", "other", Backend("vllm", "b"))
# A value on a bound (upper bounds are inclusive), between bounds, and past the last one.
VALUES = [(A, 0.001), (A, 0.0015), (B, 0.02), (A, 7.0), (B, 12.0), (A, 0.0)]


def trimmed(offset: int, counts) -> tuple[int, tuple[int, ...]]:
    """Exponential buckets without empty ones at either end (the SDK may keep some)."""
    counts = list(counts)
    while counts and counts[-1] == 0:
        counts.pop()
    while counts and counts[0] == 0:
        counts.pop(0)
        offset += 1
    return (offset, tuple(counts)) if counts else (0, ())


def _points(metric) -> dict:
    out = {}
    for p in metric.data.data_points:
        if hasattr(p, "scale"):
            buckets = (p.scale, p.zero_count, trimmed(p.positive.offset, p.positive.bucket_counts),
                       trimmed(p.negative.offset, p.negative.bucket_counts))  # fmt: skip
        else:
            buckets = (tuple(p.bucket_counts), tuple(p.explicit_bounds))
        key = tuple(sorted(p.attributes.items()))
        out[key] = (p.count, pytest.approx(p.sum), buckets, p.min, p.max)
    return out


def _sdk_metric(aggregation: names.HistogramAggregation):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], views=histogram_views(aggregation))
    sink = OtelMetricsSink(provider)  # no bridge: SDK records
    for labels, value in VALUES:
        sink.gap(labels, value, "r")
    data = reader.get_metrics_data()
    (metric,) = [
        m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == names.GAP.name
    ]
    return metric


@pytest.mark.parametrize("aggregation", list(names.HistogramAggregation))
def test_same_points_as_the_sdk(aggregation):
    gaps = GapHistograms(aggregation=aggregation)
    sink = OtelMetricsSink(MeterProvider(metric_readers=[InMemoryMetricReader()]), gaps=gaps)
    for labels, value in VALUES:
        sink.gap(labels, value, "r")
    ours = gaps.collect()
    sdk = _sdk_metric(aggregation)
    assert ours is not None
    assert type(ours.data) is type(sdk.data)
    assert (ours.name, ours.unit, ours.description) == (sdk.name, sdk.unit, sdk.description)
    assert ours.data.aggregation_temporality is sdk.data.aggregation_temporality
    assert _points(ours) == _points(sdk)
    assert len(_points(ours)) == 2
    if aggregation is EXPONENTIAL:
        # 0.0 is in the zero bucket; 0.001 to 7.0 spans 13 octaves: scale 5 fits 512 buckets.
        point = next(p for p in ours.data.data_points if p.zero_count)
        assert (point.scale, point.zero_count) == (5, 1)


@pytest.mark.parametrize("aggregation", list(names.HistogramAggregation))
def test_cumulative_keeps_totals_and_delta_resets(aggregation):
    cumulative = GapHistograms(aggregation=aggregation)
    delta = GapHistograms(delta=True, aggregation=aggregation)
    for gaps in (cumulative, delta):
        gaps.observe(A, 0.01)
        assert gaps.collect() is not None
    assert delta.collect() is None  # nothing new since the last export
    for gaps in (cumulative, delta):
        gaps.observe(A, 0.02)
    c, d = cumulative.collect(), delta.collect()
    assert c is not None
    assert d is not None
    assert d.data.aggregation_temporality is AggregationTemporality.DELTA
    assert [p.count for p in c.data.data_points] == [2]
    assert [(p.count, p.sum, p.min, p.max) for p in d.data.data_points] == [(1, 0.02, 0.02, 0.02)]


def test_merged_joins_the_tokenstamp_scope_or_adds_it():
    gaps = GapHistograms()
    gaps.observe(A, 0.01)
    metric = gaps.collect()
    assert metric is not None
    res = Resource({"service.name": "x"})
    other = ScopeMetrics(InstrumentationScope("other"), [], "")
    ours = ScopeMetrics(InstrumentationScope("tokenstamp"), [], "")
    joined = merged(MetricsData([ResourceMetrics(res, [other, ours], "")]), metric)
    assert [list(sm.metrics) for sm in joined.resource_metrics[0].scope_metrics] == [[], [metric]]
    added = merged(MetricsData([ResourceMetrics(res, [other], "")]), metric)
    scopes = added.resource_metrics[0].scope_metrics
    assert [sm.scope.name for sm in scopes] == ["other", "tokenstamp"]
    assert merged(MetricsData([]), metric) == MetricsData([])


def test_the_sdk_histogram_helper_uses_the_names_buckets():
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    histogram(meter, names.TTFT).record(0.3, {"k": "v"})
    data = reader.get_metrics_data()
    (point,) = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert tuple(point.explicit_bounds) == names.TTFT_BUCKETS
