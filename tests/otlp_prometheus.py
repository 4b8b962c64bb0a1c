"""OTLP metrics as Prometheus holds them, for tests: names, labels, exponential histograms.

The translation an OTLP-to-Prometheus pipeline applies (the collector's
Prometheus exporters, Prometheus's own OTLP receiver from 2.47): dots to
underscores, unit ``s`` to ``_seconds``, ``{...}`` units dropped, monotonic
sums ``_total``; an explicit-bucket histogram becomes classic
``_bucket``/``_sum``/``_count`` series, a base-2 exponential one a native
histogram named without suffix (OTLP's bucket ``i``, ``(base**i, base**(i+1)]``,
is Prometheus's bucket ``i + 1``; scales above 8 are merged down to schema 8).

Also what a test needs to judge an exponential histogram: which observations a
bound splits, and the quantile Prometheus's ``histogram_quantile`` reads from it.
And ``RawMeterProvider``: an OpenTelemetry API provider keeping every recorded
value, so an ``OtelMetricsSink`` on it yields the exact observations.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client.utils import floatToGoString

from exporters.otel_exponential import BucketMapping
from tests.remotewrite import NativeHistogram, WriteBatch

Labels = frozenset[tuple[str, str]]

#: Prometheus's finest native histogram schema.
MAX_SCHEMA = 8


def attr_value(attr: Any) -> str:
    """An OTLP ``AnyValue`` as a label value."""
    kind = attr.WhichOneof("value")
    return str(getattr(attr, kind)) if kind else ""


def labels(attributes: Any, extra: tuple[tuple[str, str], ...] = ()) -> Labels:
    """Prometheus labels of OTLP attributes (dots to underscores), plus ``extra``."""
    return frozenset(
        {(kv.key.replace(".", "_"), attr_value(kv.value)) for kv in attributes} | set(extra)
    )


def prometheus_name(metric: Any) -> str:
    """The name an OTLP-to-Prometheus translation gives ``metric`` (without sample suffixes)."""
    base = metric.name.replace(".", "_")
    unit = metric.unit
    if unit and not unit.startswith("{"):
        base += "_" + {"s": "seconds", "By": "bytes"}[unit]
    kind = metric.WhichOneof("data")
    if kind == "sum" and metric.sum.is_monotonic:
        base += "_total"
    return base


def metrics(request: Any) -> Iterator[Any]:
    """Every metric of an ``ExportMetricsServiceRequest``."""
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            yield from sm.metrics


def buckets(point: Any) -> dict[int, int]:
    """OTLP bucket index to count of an exponential data point's positive buckets."""
    offset = point.positive.offset
    return {offset + i: c for i, c in enumerate(point.positive.bucket_counts) if c}


def split(point: Any, bound: float) -> tuple[int, int]:
    """``(surely, maybe)``: observations surely ``<= bound``, and that plus those of the bucket
    ``bound`` falls in (which may lie on either side). ``bound > 0``."""
    at = BucketMapping(point.scale).index(bound)  # the same mapping put each value in its bucket
    below = point.zero_count + sum(c for i, c in buckets(point).items() if i < at)
    return below, below + buckets(point).get(at, 0)


def quantile(point: Any, q: float) -> float:
    """``histogram_quantile(q, ...)`` of Prometheus 2.42 on the native form of ``point``:
    the bucket where the rank ``q * count`` falls, linear inside it."""
    rank = q * point.count
    seen = point.zero_count
    if rank <= seen:
        return 0.0
    base = 2.0 ** (2.0**-point.scale)
    for index in sorted(buckets(point)):
        count = buckets(point)[index]
        if seen + count >= rank:
            lower, upper = base**index, base ** (index + 1)
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
    return point.max


def relative_error(point: Any) -> float:
    """How far a value read from one of ``point``'s buckets can be from the truth: ``base - 1``."""
    return 2.0 ** (2.0**-point.scale) - 1


def native(point: Any) -> NativeHistogram:
    """Prometheus's native histogram of an OTLP exponential data point (cumulative)."""
    scale = point.scale
    shift = max(0, scale - MAX_SCHEMA)
    merged: dict[int, int] = defaultdict(int)
    for index, count in buckets(point).items():
        merged[index >> shift] += count  # OTLP's (base^i, base^(i+1)] at a coarser scale
    return NativeHistogram(
        schema=scale - shift,
        count=point.count,
        sum=point.sum,
        zero_count=point.zero_count,
        zero_threshold=point.zero_threshold,
        positive={i + 1: c for i, c in merged.items()},  # Prometheus: (base^(i-1), base^i]
    )


def write_batch(
    requests: list[Any], timestamp_ms: int, extra: tuple[tuple[str, str], ...] = ()
) -> WriteBatch:
    """Remote-write series of cumulative OTLP exports taken at ``timestamp_ms``, as
    Prometheus's OTLP receiver stores them (``extra``: e.g. ``job`` and ``instance``)."""
    batch = WriteBatch()
    for request in requests:
        for metric in metrics(request):
            name = prometheus_name(metric)
            kind = metric.WhichOneof("data")
            for p in getattr(metric, kind).data_points:
                series = dict(labels(p.attributes, extra))
                if kind == "exponential_histogram":
                    batch.histogram({"__name__": name, **series}, native(p), timestamp_ms)
                elif kind == "histogram":
                    total = 0
                    for bound, count in zip([*p.explicit_bounds, math.inf], p.bucket_counts,
                                            strict=True):  # fmt: skip
                        total += count
                        le = floatToGoString(bound)
                        batch.sample({"__name__": name + "_bucket", **series, "le": le}, total,
                                     timestamp_ms)  # fmt: skip
                    batch.sample({"__name__": name + "_sum", **series}, p.sum, timestamp_ms)
                    batch.sample({"__name__": name + "_count", **series}, p.count, timestamp_ms)
                else:
                    v = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                    batch.sample({"__name__": name, **series}, float(v), timestamp_ms)
    return batch


class _RawInstrument:
    def __init__(self, store: dict[tuple[str, Labels], list[float]], name: str) -> None:
        self._store = store
        self._name = name

    def record(self, value: float, attributes: dict[str, str] | None = None, **_: Any) -> None:
        key = frozenset((k.replace(".", "_"), v) for k, v in (attributes or {}).items())
        self._store[(self._name, key)].append(value)

    add = record


class _RawMeter:
    def __init__(self, store: dict[tuple[str, Labels], list[float]]) -> None:
        self._store = store

    def create_histogram(self, name: str, **_: Any) -> _RawInstrument:
        return _RawInstrument(self._store, name)

    create_counter = create_up_down_counter = create_histogram


class RawMeterProvider:
    """Keeps every value recorded on it: ``values[(instrument name, labels)]``."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, Labels], list[float]] = defaultdict(list)

    def get_meter(self, name: str, version: str = "", *args: Any, **kwargs: Any) -> _RawMeter:
        return _RawMeter(self.values)
