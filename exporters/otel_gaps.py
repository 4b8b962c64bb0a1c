"""The inter-token gap histogram for OTLP, aggregated in-process: the one per-token instrument.

Why not ``Histogram.record``: the Python SDK spends about 14 µs per
measurement (attribute cleaning and hashing, a measurement object, locks),
and a stream makes one gap per token; that alone added 25 % CPU per token.
``GapHistograms`` keeps, per request label set, exactly what the SDK's
aggregation of the instrument keeps, for about a microsecond a gap: the
base-2 exponential one by default (``exporters.otel_exponential``: scale,
zero count, bucket counts, sum, count, min, max), or with ``--otlp-histograms
explicit`` the explicit-bucket one (bucket counts, sum, count, min, max).
``GapBridgeReader``, the periodic OTLP reader, adds it to each collection as
one more metric of the ``tokenstamp`` scope, shaped as the SDK shapes its own
(same name, unit, description, buckets or scales, temporality), so a
collector cannot tell the difference.

Only the provider ``exporters.otel_setup`` builds uses the bridge; an injected
``MeterProvider`` gets the gaps through the SDK instrument as usual.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from exporters import names
from exporters.otel_exponential import ExponentialHistogram as ExponentialBuckets
from exporters.prometheus import request_label_values
from proxy import __version__
from proxy.core.records import RequestLabels

SCOPE = InstrumentationScope("tokenstamp", __version__)
"""The instrumentation scope of every tokenstamp instrument (``exporters.otel.METER_NAME``)."""


class _Explicit:
    """One label set's explicit-bucket aggregation (bucket upper bounds inclusive, as OTel's)."""

    __slots__ = ("bounds", "count", "counts", "max", "min", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0
        self.min = float("inf")
        self.max = float("-inf")

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1
        if value < self.min:  # noqa: PLR1730 - a comparison is cheaper than min() per token
            self.min = value
        if value > self.max:  # noqa: PLR1730
            self.max = value

    def data_point(
        self, attributes: dict[str, str], start_unix_ns: int, now_unix_ns: int
    ) -> HistogramDataPoint:
        return HistogramDataPoint(
            attributes=attributes,
            start_time_unix_nano=start_unix_ns,
            time_unix_nano=now_unix_ns,
            count=self.count,
            sum=self.sum,
            bucket_counts=tuple(self.counts),
            explicit_bounds=self.bounds,
            min=self.min,
            max=self.max,
        )

    def reset(self) -> None:
        self.counts = [0] * len(self.counts)
        self.sum, self.count = 0.0, 0
        self.min, self.max = float("inf"), float("-inf")


class _Series:
    """One label set: its attributes, its aggregation, and when that began."""

    __slots__ = ("attributes", "buckets", "start_unix_ns")

    def __init__(
        self, attributes: dict[str, str], buckets: _Explicit | ExponentialBuckets, start_ns: int
    ) -> None:
        self.attributes = attributes
        self.buckets = buckets
        self.start_unix_ns = start_ns


class GapHistograms:
    """``gen_ai.client.operation.time_per_output_chunk`` per request label set, for OTLP."""

    def __init__(
        self,
        *,
        delta: bool = False,
        inst: names.Instrument = names.GAP,
        aggregation: names.HistogramAggregation = names.HistogramAggregation.EXPONENTIAL,
    ) -> None:
        self.inst = inst
        """The instrument aggregated."""
        self.delta = delta
        """Export deltas (reset at each collection) instead of cumulative totals."""
        self.aggregation = names.HistogramAggregation(aggregation)
        """Exponential buckets (``names.EXPONENTIAL_MAX_SIZE`` / ``_MAX_SCALE``, as the views
        of ``exporters.otel_setup``), or the instrument's explicit ones."""
        self.tenants = False
        """The series carry the tenant attribute (set by the sink that feeds them)."""
        self._series: dict[RequestLabels, _Series] = {}
        self._lock = threading.Lock()  # observed on the loop, collected on the reader's thread

    def _new(self) -> _Explicit | ExponentialBuckets:
        if self.aggregation is names.HistogramAggregation.EXPLICIT:
            return _Explicit(self.inst.buckets)
        return ExponentialBuckets(names.EXPONENTIAL_MAX_SIZE, names.EXPONENTIAL_MAX_SCALE)

    def observe(self, labels: RequestLabels, value_s: float) -> None:
        """One gap of a stream with ``labels``."""
        with self._lock:
            s = self._series.get(labels)
            if s is None:
                values = request_label_values(labels, self.tenants)
                keys = names.tenant_attrs(self.inst) if self.tenants else self.inst.attrs
                attrs = dict(zip(keys, values, strict=True))
                s = self._series[labels] = _Series(attrs, self._new(), time.time_ns())
            s.buckets.observe(value_s)

    def collect(self, now_unix_ns: int | None = None) -> Metric | None:
        """The metric as the SDK would export it now; ``None`` before the first gap."""
        now = time.time_ns() if now_unix_ns is None else now_unix_ns
        with self._lock:
            series = list(self._series.values())
            points = [
                s.buckets.data_point(dict(s.attributes), s.start_unix_ns, now)
                for s in series
                if s.buckets.count
            ]
            if self.delta:
                for s in series:
                    s.buckets.reset()
                    s.start_unix_ns = now
        if not points:
            return None
        temporality = (
            AggregationTemporality.DELTA if self.delta else AggregationTemporality.CUMULATIVE
        )
        data: Histogram | ExponentialHistogram
        if self.aggregation is names.HistogramAggregation.EXPLICIT:
            explicit = [p for p in points if isinstance(p, HistogramDataPoint)]
            data = Histogram(explicit, aggregation_temporality=temporality)
        else:
            exponential = [p for p in points if isinstance(p, ExponentialHistogramDataPoint)]
            data = ExponentialHistogram(exponential, aggregation_temporality=temporality)
        return Metric(
            name=self.inst.name,
            description=self.inst.description,
            unit=self.inst.unit,
            data=data,
        )


def merged(data: MetricsData, metric: Metric) -> MetricsData:
    """``data`` with ``metric`` added to the tokenstamp scope of its (first) resource."""
    if not data.resource_metrics:
        return data
    first, *rest = data.resource_metrics
    scopes = list(first.scope_metrics)
    for i, sm in enumerate(scopes):
        if sm.scope.name == SCOPE.name:
            scopes[i] = ScopeMetrics(sm.scope, [*sm.metrics, metric], sm.schema_url)
            break
    else:
        scopes.append(ScopeMetrics(SCOPE, [metric], ""))
    return MetricsData([ResourceMetrics(first.resource, scopes, first.schema_url), *rest])


class GapBridgeReader(PeriodicExportingMetricReader):
    """The periodic OTLP reader, with the in-process gap histogram added to each export."""

    def __init__(self, exporter: MetricExporter, gaps: GapHistograms, **kwargs: Any) -> None:
        super().__init__(exporter, **kwargs)
        self.gaps = gaps
        """Where the gaps are aggregated."""

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        metric = self.gaps.collect()
        if metric is not None:
            metrics_data = merged(metrics_data, metric)
        super()._receive_metrics(metrics_data, timeout_millis, **kwargs)
