"""The inter-token gap histogram for OTLP, aggregated in-process: the one per-token instrument.

Why not ``Histogram.record``: the Python SDK spends about 14 µs per
measurement (attribute cleaning and hashing, a measurement object, locks),
and a stream makes one gap per token; that alone added 25 % CPU per token.
``GapHistograms`` keeps, per request label set, exactly what the SDK's
explicit-bucket aggregation keeps (bucket counts, sum, count, min, max) for
about a microsecond a gap. ``GapBridgeReader``, the periodic OTLP reader,
adds it to each collection as one more metric of the ``tokenstamp`` scope,
shaped as the SDK shapes its own (same name, unit, description, bounds,
temporality), so a collector cannot tell the difference.

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
from exporters.prometheus import request_label_values
from proxy import __version__
from proxy.core.records import RequestLabels

SCOPE = InstrumentationScope("tokenstamp", __version__)
"""The instrumentation scope of every tokenstamp instrument (``exporters.otel.METER_NAME``)."""


class _Series:
    """One label set's aggregation."""

    __slots__ = ("attributes", "count", "counts", "max", "min", "start_unix_ns", "sum")

    def __init__(self, attributes: dict[str, str], buckets: int, start_unix_ns: int) -> None:
        self.attributes = attributes
        self.counts = [0] * buckets
        self.sum = 0.0
        self.count = 0
        self.min = float("inf")
        self.max = float("-inf")
        self.start_unix_ns = start_unix_ns


class GapHistograms:
    """``gen_ai.client.operation.time_per_output_chunk`` per request label set, for OTLP."""

    def __init__(self, *, delta: bool = False, inst: names.Instrument = names.GAP) -> None:
        self.inst = inst
        """The instrument aggregated."""
        self.delta = delta
        """Export deltas (reset at each collection) instead of cumulative totals."""
        self._bounds = inst.buckets
        self.tenants = False
        """The series carry the tenant attribute (set by the sink that feeds them)."""
        self._series: dict[RequestLabels, _Series] = {}
        self._lock = threading.Lock()  # observed on the loop, collected on the reader's thread

    def observe(self, labels: RequestLabels, value_s: float) -> None:
        """One gap of a stream with ``labels`` (bucket upper bounds inclusive, as OTel's)."""
        with self._lock:
            s = self._series.get(labels)
            if s is None:
                values = request_label_values(labels, self.tenants)
                keys = names.tenant_attrs(self.inst) if self.tenants else self.inst.attrs
                attrs = dict(zip(keys, values, strict=True))
                s = self._series[labels] = _Series(attrs, len(self._bounds) + 1, time.time_ns())
            s.counts[bisect_left(self._bounds, value_s)] += 1
            s.sum += value_s
            s.count += 1
            if value_s < s.min:  # noqa: PLR1730 - a comparison is cheaper than min() per token
                s.min = value_s
            if value_s > s.max:  # noqa: PLR1730
                s.max = value_s

    def collect(self, now_unix_ns: int | None = None) -> Metric | None:
        """The metric as the SDK would export it now; ``None`` before the first gap."""
        now = time.time_ns() if now_unix_ns is None else now_unix_ns
        with self._lock:
            series = list(self._series.values())
            points = [
                HistogramDataPoint(
                    attributes=dict(s.attributes),
                    start_time_unix_nano=s.start_unix_ns,
                    time_unix_nano=now,
                    count=s.count,
                    sum=s.sum,
                    bucket_counts=tuple(s.counts),
                    explicit_bounds=self._bounds,
                    min=s.min,
                    max=s.max,
                )
                for s in series
                if s.count
            ]
            if self.delta:
                for s in series:
                    s.counts = [0] * len(s.counts)
                    s.sum, s.count, s.start_unix_ns = 0.0, 0, now
                    s.min, s.max = float("inf"), float("-inf")
        if not points:
            return None
        temporality = (
            AggregationTemporality.DELTA if self.delta else AggregationTemporality.CUMULATIVE
        )
        return Metric(
            name=self.inst.name,
            description=self.inst.description,
            unit=self.inst.unit,
            data=Histogram(data_points=points, aggregation_temporality=temporality),
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
