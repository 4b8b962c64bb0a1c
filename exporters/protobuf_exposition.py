"""Prometheus's protobuf exposition: the registry as delimited ``MetricFamily`` messages.

A scraper that asks for ``application/vnd.google.protobuf;
proto=io.prometheus.client.MetricFamily; encoding=delimited`` (Prometheus with
native histograms on) gets every family of the registry as a sequence of
``io.prometheus.client.MetricFamily`` messages, each preceded by its length as
a varint. Histograms carry their classic buckets (with exemplars) and, for the
proxy's own ``FastHistogram``, the native buckets: schema, zero threshold and
count, positive spans and deltas. Counters carry their ``_created`` time as
``created_timestamp``.

The messages are written here by hand: a handful of small messages whose
fields are varints, doubles and nested length-prefixed messages (the
protobuf encoding guide's wire format; the field numbers are those of
``io/prometheus/client/metrics.proto``). Measured on a realistic registry this
is faster than building the same messages with the ``google.protobuf``
runtime (the figures are in docs/metrics.md), and it needs no generated code.
Fields are always written, zeros included, so a proto2 reader (presence
tracked) and a proto3 reader (zero is absent) read the same values.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar, Sample, Timestamp

from exporters.fast_histogram import NATIVE_ZERO_THRESHOLD, HistogramChild, HistogramFamily

CONTENT_TYPE = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)
"""What a protobuf scrape answers with (and what a scraper's ``Accept`` must name)."""
_MEDIA_TYPE = "application/vnd.google.protobuf"
_PROTO = "io.prometheus.client.MetricFamily"

# io.prometheus.client.MetricType
COUNTER, GAUGE, SUMMARY, UNTYPED, HISTOGRAM, GAUGE_HISTOGRAM = range(6)

_double = struct.Struct("<d").pack
_SMALL = [bytes((n,)) for n in range(128)]
_U64 = (1 << 64) - 1


def _varint(n: int) -> bytes:
    """Base-128 varint; a negative ``n`` as its 64-bit two's complement (int64 fields)."""
    if 0 <= n < 128:
        return _SMALL[n]
    if 0 < n < 16384:
        return bytes((n & 127 | 128, n >> 7))
    n &= _U64
    out = bytearray()
    while n > 127:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def _zigzag(n: int) -> int:
    """The ``sint32``/``sint64`` mapping: 0, -1, 1, -2 ... to 0, 1, 2, 3 ..."""
    return n << 1 if n >= 0 else ((-n) << 1) - 1


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): tag, length, payload."""
    return tag + _varint(len(payload)) + payload


def _label_pair(name: bytes, value: str) -> bytes:
    """A ``LabelPair`` field (number 1 in ``Metric`` and ``Exemplar``); ``name`` pre-encoded."""
    return _field(b"\x0a", name + _field(b"\x12", value.encode()))


def _timestamp(seconds: float | Timestamp) -> bytes:
    """A ``google.protobuf.Timestamp`` message: whole seconds and nanoseconds."""
    if isinstance(seconds, Timestamp):
        sec, nsec = seconds.sec, seconds.nsec
    else:
        sec = math.floor(seconds)
        nsec = min(round((seconds - sec) * 1e9), 999_999_999)
    return b"\x08" + _varint(sec) + b"\x10" + _varint(nsec)


def _exemplar(ex: Exemplar) -> bytes:
    """An ``Exemplar`` message: labels, value, and its timestamp when it has one."""
    body = b"".join(_label_pair(_field(b"\x0a", k.encode()), v) for k, v in ex.labels.items())
    body += b"\x11" + _double(ex.value)
    if ex.timestamp is not None:
        body += _field(b"\x1a", _timestamp(ex.timestamp))
    return body


def _family(name: str, help_text: str, kind: int, metrics: list[bytes], unit: str = "") -> bytes:
    """One delimited ``MetricFamily``: its length, then the message."""
    body = _field(b"\x0a", name.encode()) + _field(b"\x12", help_text.encode())
    body += b"\x18" + _SMALL[kind] + b"".join(metrics)
    if unit:
        body += _field(b"\x2a", unit.encode())
    return _varint(len(body)) + body


_ZERO_THRESHOLD = b"\x31" + _double(NATIVE_ZERO_THRESHOLD)
_INF = math.inf


def _native(child: HistogramChild) -> bytes:
    """The native fields of a ``Histogram``: schema, zero bucket, positive spans and deltas."""
    schema, buckets = child.native_buckets()
    out = [b"\x28", _varint(_zigzag(schema)), _ZERO_THRESHOLD, b"\x38", _varint(child.zero_count)]
    if not buckets:
        return b"".join(out)
    indexes = [i for i, _ in buckets]
    counts = [n for _, n in buckets]
    # A span is a run of consecutive indexes; its offset is the first index for the first
    # span, else the number of empty buckets since the previous span's end.
    breaks = [k for k in range(1, len(indexes)) if indexes[k] != indexes[k - 1] + 1]
    start = 0
    for end in (*breaks, len(indexes)):
        offset = indexes[0] if start == 0 else indexes[start] - indexes[start - 1] - 1
        out.append(
            _field(b"\x62", b"\x08" + _varint(_zigzag(offset)) + b"\x10" + _varint(end - start))
        )
        start = end
    # Deltas: each count minus the one before (the first minus zero), zigzag varints, packed.
    deltas = [n - p for n, p in zip(counts, [0, *counts], strict=False)]
    zigzags = [d << 1 if d >= 0 else ((-d) << 1) - 1 for d in deltas]
    small = _SMALL
    varints = [small[z] if z < 128 else _varint(z) for z in zigzags]
    out.append(_field(b"\x6a", b"".join(varints)))
    return b"".join(out)


def _fast_histogram(family: HistogramFamily) -> bytes:
    """A ``FastHistogram``'s family, read from its children: classic and native buckets."""
    names = [_field(b"\x0a", n.encode()) for n in family.labelnames]
    # A bucket is "\x08" count "\x11" bound: 10 bytes and the count's varint.
    bounds = [b"\x11" + _double(b) for b in (*family.bounds, _INF)]
    small = _SMALL
    metrics = []
    for values, child in family.children:
        count = 0
        parts = [b"", b"\x11" + _double(child.sum)]  # [0]: the count, known at the end
        exemplars = child.exemplars
        for i, n in enumerate(child.counts):
            count += n
            v = small[count] if count < 128 else _varint(count)
            ex = exemplars.get(i) if exemplars else None
            if ex is None:
                parts.append(b"\x1a" + small[10 + len(v)] + b"\x08" + v + bounds[i])
            else:
                bucket = b"\x08" + v + bounds[i] + _field(b"\x1a", _exemplar(ex))
                parts.append(_field(b"\x1a", bucket))
        parts[0] = b"\x08" + _varint(count)
        parts.append(_native(child))
        labels = b"".join(_label_pair(n, v) for n, v in zip(names, values, strict=True))
        metrics.append(_field(b"\x22", labels + _field(b"\x3a", b"".join(parts))))
    return _family(family.name, family.documentation, HISTOGRAM, metrics, family.unit)


# Generic families (prometheus_client's own metrics and custom collectors), from samples.

_KINDS = {
    "counter": COUNTER,
    "gauge": GAUGE,
    "summary": SUMMARY,
    "histogram": HISTOGRAM,
    "gaugehistogram": GAUGE_HISTOGRAM,
    "unknown": UNTYPED,
    "info": GAUGE,
    "stateset": GAUGE,
}
_SUFFIX = {"counter": "_total", "info": "_info"}
"""The family name in the protobuf format is the sample name: ``_total`` included."""
_SERIES_LABELS = {"le", "quantile"}
"""Labels that name a bucket or quantile within one series, not the series."""


def _group(samples: Iterable[Sample]) -> dict[tuple[tuple[str, str], ...], list[Sample]]:
    """Samples by label set (``le`` and ``quantile`` aside), in order of first appearance."""
    groups: dict[tuple[tuple[str, str], ...], list[Sample]] = {}
    for s in samples:
        key = tuple((k, v) for k, v in s.labels.items() if k not in _SERIES_LABELS)
        groups.setdefault(key, []).append(s)
    return groups


def _sample_metric(metric: Metric, kind: int, base: str, samples: list[Sample]) -> bytes:
    """The type-specific message of one label set (``Counter``, ``Histogram``, ...) as a field."""
    values: dict[str, float] = {}
    parts: list[bytes] = []
    exemplar: Exemplar | None = None
    for s in samples:
        suffix = s.name[len(base) :]
        if kind in (HISTOGRAM, GAUGE_HISTOGRAM) and suffix == "_bucket":
            bucket = b"\x08" + _varint(int(s.value)) + b"\x11" + _double(float(s.labels["le"]))
            if s.exemplar is not None:
                bucket += _field(b"\x1a", _exemplar(s.exemplar))
            parts.append(_field(b"\x1a", bucket))
        elif kind == SUMMARY and suffix == "" and "quantile" in s.labels:
            q = b"\x09" + _double(float(s.labels["quantile"])) + b"\x11" + _double(s.value)
            parts.append(_field(b"\x1a", q))
        elif s.value is not None:  # a gauge histogram's unknown _gsum is None
            values[suffix] = s.value
            exemplar = s.exemplar or exemplar
    created = values.get("_created")
    if kind == COUNTER:
        body = b"\x09" + _double(values.get(_SUFFIX["counter"], 0.0))
        if exemplar is not None:
            body += _field(b"\x12", _exemplar(exemplar))
        if created is not None:
            body += _field(b"\x1a", _timestamp(created))
        return _field(b"\x1a", body)
    if kind in (SUMMARY, HISTOGRAM, GAUGE_HISTOGRAM):
        gauge = kind == GAUGE_HISTOGRAM
        count = values.get("_gcount" if gauge else "_count", 0.0)
        total = values.get("_gsum" if gauge else "_sum")
        body = b"\x08" + _varint(int(count))
        if total is not None:
            body += b"\x11" + _double(total)
        body += b"".join(parts)
        if created is not None:
            body += _field(b"\x22" if kind == SUMMARY else b"\x7a", _timestamp(created))
        return _field(b"\x22" if kind == SUMMARY else b"\x3a", body)
    value = b"\x09" + _double(next(iter(values.values()), 0.0))
    return _field(b"\x2a" if kind == UNTYPED else b"\x12", value)


def _generic(metric: Metric) -> bytes:
    """Any prometheus_client family, from its samples."""
    kind = _KINDS[metric.type]
    base = metric.name
    metrics = []
    for key, samples in _group(metric.samples).items():
        labels = b"".join(_label_pair(_field(b"\x0a", k.encode()), v) for k, v in key)
        body = labels + _sample_metric(metric, kind, base, samples)
        stamped = [s.timestamp for s in samples if s.timestamp is not None]
        if stamped:
            ts = stamped[0]
            ms = ts.sec * 1000 + ts.nsec // 1_000_000 if isinstance(ts, Timestamp) else ts * 1000
            body += b"\x30" + _varint(int(ms))
        metrics.append(_field(b"\x22", body))
    name = base + _SUFFIX.get(metric.type, "")
    return _family(name, metric.documentation, kind, metrics, metric.unit)


def encode(registry: CollectorRegistry) -> bytes:
    """Every family of ``registry``, delimited ``MetricFamily`` messages back to back."""
    out = []
    for metric in registry.collect():
        if isinstance(metric, HistogramFamily):
            if metric.children:  # as in the text format: no child, no series
                out.append(_fast_histogram(metric))
        elif metric.samples:
            out.append(_generic(metric))
    return b"".join(out)


def accepts(accept: str) -> bool:
    """Whether an ``Accept`` header prefers the protobuf exposition to any text one.

    True when it names the delimited ``MetricFamily`` encoding with a quality
    above zero and at least that of every other media range it names (Prometheus
    with native histograms lists it first, with no quality, i.e. 1). Otherwise
    the text and OpenMetrics choice is prometheus_client's, as without this.
    """
    protobuf = other = 0.0
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        options = {}
        for param in params:
            key, _, value = param.partition("=")
            key, value = key.strip().lower(), value.strip().strip('"')
            if key == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
            else:
                options[key] = value
        if media.lower() == _MEDIA_TYPE:
            if options.get("proto") == _PROTO and options.get("encoding") == "delimited":
                protobuf = max(protobuf, q)
        elif media:
            other = max(other, q)
    return protobuf > 0 and protobuf >= other
