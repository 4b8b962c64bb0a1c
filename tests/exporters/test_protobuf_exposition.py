"""The protobuf exposition, read back by an independent decoder (google.protobuf).

Every family the registry holds comes back with the values its text exposition
shows; the proxy's histograms also with native buckets that count what a
brute-force bucketing of the observed values counts.
"""

from __future__ import annotations

import math
import random
from collections import Counter as Tally
from typing import Any

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from exporters.fast_histogram import (
    NATIVE_MAX_BUCKETS,
    NATIVE_SCHEMA,
    NATIVE_ZERO_THRESHOLD,
    FastHistogram,
)
from exporters.protobuf_exposition import CONTENT_TYPE, accepts, encode
from tests.exporters.metrics_proto import METRIC_TYPES, native_buckets, parse_delimited
from tests.exporters.test_fast_histogram import brute_force_index

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)


class _Custom(Collector):
    """Families the way custom collectors make them (no ``_created``, no timestamps but one)."""

    def collect(self) -> list[Metric]:
        c = CounterMetricFamily("custom_refused", "refusals", labels=["backend"])
        c.add_metric(["a"], 7.0)
        g = GaugeMetricFamily("custom_held_bytes", "held", labels=["backend"])
        g.add_metric(["a"], 1024.0, timestamp=1700000000.25)
        u = UnknownMetricFamily("custom_mystery", "unknown type", value=3.5)
        gh = GaugeHistogramMetricFamily(
            "custom_queue_seconds", "a gauge histogram", [("1.0", 4.0), ("+Inf", 6.0)], 12.5
        )
        return [c, g, u, gh]


@pytest.fixture
def registry() -> tuple[CollectorRegistry, dict[tuple[str, ...], list[float]]]:
    """A registry with every kind of family; the values each FastHistogram child saw."""
    reg = CollectorRegistry()
    rng = random.Random(5)
    fast = FastHistogram("gap_seconds", "Gaps", ("model", "backend"), BUCKETS, reg)
    seen: dict[tuple[str, ...], list[float]] = {}
    # Narrow values keep schema 5; wide ones outgrow 160 buckets and halve it.
    for labels, sigma in ((("m", "b"), 0.3), (("n", "b"), 1.5), (("other", "ü-nicode"), 1.5)):
        values = [rng.lognormvariate(math.log(0.03), sigma) for _ in range(500)] + [0.0, 0.0, 50.0]
        for i, v in enumerate(values):
            fast.labels(*labels).observe(v, {"trace_id": f"t{i}"} if i % 97 == 0 else None)
        seen[labels] = values
    FastHistogram("empty_seconds", "No child yet", ("model",), BUCKETS, reg)
    counter = Counter("requests", "Requests", ("outcome",), registry=reg)
    counter.labels("ok").inc(3)
    counter.labels("timeout").inc()
    Counter("plain", "No labels", registry=reg).inc(2.5)
    Gauge("active_streams", "Open", ("model",), registry=reg).labels("m").set(-2)
    hist = Histogram("client_seconds", "prometheus_client's", buckets=(0.1, 1.0), registry=reg)
    for v in (0.05, 0.5, 5.0):
        hist.observe(v)
    hist.observe(0.07, {"trace_id": "cafe"})
    summary = Summary("sizes", "A summary", registry=reg)
    summary.observe(3.0)
    Info("build", "Build info", registry=reg).info({"version": "1.2.3"})
    Enum("state", "An enum", states=["up", "down"], registry=reg).state("down")
    reg.register(_Custom())
    return reg, seen


def _from_text_model(reg: CollectorRegistry) -> dict[str, Any]:
    """What the text exposition says, keyed by the protobuf family name."""
    out: dict[str, Any] = {}
    for m in reg.collect():
        if not m.samples:
            continue
        name = m.name + {"counter": "_total", "info": "_info"}.get(m.type, "")
        series: dict[frozenset[tuple[str, str]], dict[str, Any]] = {}
        for s in m.samples:
            key = frozenset((k, v) for k, v in s.labels.items() if k not in ("le", "quantile"))
            entry = series.setdefault(key, {"buckets": [], "quantiles": []})
            suffix = s.name[len(m.name) :]
            if suffix == "_bucket":
                ex = s.exemplar
                exemplar = (ex.labels, ex.value, ex.timestamp) if ex else None
                entry["buckets"].append((float(s.labels["le"]), int(s.value), exemplar))
            elif "quantile" in s.labels:
                entry["quantiles"].append((float(s.labels["quantile"]), s.value))
            elif suffix == "_created":
                entry["created"] = s.value
            elif suffix in ("_count", "_gcount"):
                entry["count"] = int(s.value)
            elif suffix in ("_sum", "_gsum"):
                entry["sum"] = s.value
            else:
                entry["value"] = s.value
                if s.timestamp is not None:
                    entry["timestamp_ms"] = int(s.timestamp * 1000)
        out[name] = (m.documentation, m.type, series)
    return out


def _seconds(ts: Any) -> float:
    return ts.seconds + ts.nanos / 1e9


def _from_protobuf(data: bytes) -> dict[str, Any]:
    """The decoded families in the shape of ``_from_text_model``."""
    types = {
        "COUNTER": "counter",
        "GAUGE": "gauge",
        "SUMMARY": "summary",
        "HISTOGRAM": "histogram",
        "GAUGE_HISTOGRAM": "gaugehistogram",
        "UNTYPED": "unknown",
    }
    out: dict[str, Any] = {}
    for f in parse_delimited(data):
        series = {}
        for m in f.metric:
            key = frozenset((lp.name, lp.value) for lp in m.label)
            entry: dict[str, Any] = {"buckets": [], "quantiles": []}
            kind = METRIC_TYPES[f.type]
            if kind == "COUNTER":
                entry["value"] = m.counter.value
                if m.counter.HasField("created_timestamp"):
                    entry["created"] = _seconds(m.counter.created_timestamp)
            elif kind in ("GAUGE", "UNTYPED"):
                entry["value"] = (m.gauge if kind == "GAUGE" else m.untyped).value
            elif kind == "SUMMARY":
                entry["count"], entry["sum"] = m.summary.sample_count, m.summary.sample_sum
                entry["quantiles"] = [(q.quantile, q.value) for q in m.summary.quantile]
                if m.summary.HasField("created_timestamp"):
                    entry["created"] = _seconds(m.summary.created_timestamp)
            else:
                h = m.histogram
                entry["count"], entry["sum"] = h.sample_count, h.sample_sum
                for b in h.bucket:
                    ex = None
                    if b.HasField("exemplar"):
                        labels = {lp.name: lp.value for lp in b.exemplar.label}
                        ex = (labels, b.exemplar.value, _seconds(b.exemplar.timestamp))
                    entry["buckets"].append((b.upper_bound, b.cumulative_count, ex))
                if h.HasField("created_timestamp"):
                    entry["created"] = _seconds(h.created_timestamp)
            if m.timestamp_ms:
                entry["timestamp_ms"] = m.timestamp_ms
            series[key] = entry
        out[f.name] = (f.help, types[METRIC_TYPES[f.type]], series)
    return out


def _close(a: Any, b: Any) -> bool:
    """Equal, floats within the nanosecond rounding of timestamps."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=0, abs_tol=1e-6) or a == b
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return bool(a == b)


def test_every_family_round_trips(registry):
    reg, _ = registry
    text = _from_text_model(reg)
    decoded = _from_protobuf(encode(reg))
    assert sorted(decoded) == sorted(text)
    for name, (doc, kind, series) in text.items():
        got_doc, got_kind, got_series = decoded[name]
        info_like = kind in ("info", "stateset")
        assert (got_doc, got_kind) == (doc, "gauge" if info_like else kind), name
        assert got_series.keys() == series.keys(), name
        for key, want in series.items():
            assert _close(got_series[key], want), (name, key, got_series[key], want)


def test_native_buckets_are_what_brute_force_counts(registry):
    reg, seen = registry
    (family,) = [f for f in parse_delimited(encode(reg)) if f.name == "gap_seconds"]
    assert len(family.metric) == len(seen)
    assert sorted(m.histogram.schema for m in family.metric) == [4, 4, NATIVE_SCHEMA]
    for m in family.metric:
        values = seen[tuple(lp.value for lp in m.label)]
        h = m.histogram
        assert h.zero_threshold == NATIVE_ZERO_THRESHOLD
        assert h.zero_count == 2
        assert not h.negative_span
        assert not h.negative_delta
        positive = [v for v in values if v > NATIVE_ZERO_THRESHOLD]
        assert native_buckets(h) == Tally(brute_force_index(v, h.schema) for v in positive)
        assert len(h.positive_span) > 1  # the spread leaves gaps: several spans
        assert sum(span.length for span in h.positive_span) <= NATIVE_MAX_BUCKETS
        assert h.sample_count == len(values)


def test_label_order_and_utf8_survive(registry):
    reg, _ = registry
    (family,) = [f for f in parse_delimited(encode(reg)) if f.name == "gap_seconds"]
    labels = [[(lp.name, lp.value) for lp in m.label] for m in family.metric]
    assert [("model", "other"), ("backend", "ü-nicode")] in labels


def test_an_empty_registry_is_an_empty_body():
    assert encode(CollectorRegistry()) == b""


def test_a_family_without_children_is_left_out(registry):
    reg, _ = registry
    assert "empty_seconds" not in {f.name for f in parse_delimited(encode(reg))}
    assert "empty_seconds_" not in generate_latest(reg).decode()  # there: HELP and TYPE only


def test_exemplar_without_timestamp():
    reg = CollectorRegistry()
    fast = FastHistogram("g_seconds", "doc", (), BUCKETS, reg)
    fast.labels().observe(0.5, {"trace_id": "x"})
    fast.labels().exemplars[3] = Exemplar({"trace_id": "y"}, 0.5)
    (family,) = parse_delimited(encode(reg))
    (bucket,) = [b for b in family.metric[0].histogram.bucket if b.HasField("exemplar")]
    assert (bucket.exemplar.value, bucket.exemplar.HasField("timestamp")) == (0.5, False)


PROMETHEUS_2_42 = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
    "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_DEFAULT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
    "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


@pytest.mark.parametrize(
    ("accept", "protobuf"),
    [
        (PROMETHEUS_2_42, True),
        (PROMETHEUS_DEFAULT, False),
        ("", False),
        ("*/*", False),
        ("text/plain", False),
        ("application/openmetrics-text; version=1.0.0", False),
        (CONTENT_TYPE, True),
        (CONTENT_TYPE + "; q=0", False),
        (CONTENT_TYPE + "; q=0.5, text/plain", False),
        ("text/plain; q=0.5, " + CONTENT_TYPE + "; q=0.6", True),
        ('application/vnd.google.protobuf; proto="io.prometheus.client.MetricFamily"; '
         'encoding="delimited"', True),
        ("APPLICATION/VND.GOOGLE.PROTOBUF;proto=io.prometheus.client.MetricFamily;"
         "encoding=delimited", True),
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
         "encoding=text", False),
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily", False),
        ("application/vnd.google.protobuf;encoding=delimited", False),
        (CONTENT_TYPE + "; q=bogus", False),
    ],
)  # fmt: skip
def test_accept_negotiation(accept, protobuf):
    assert accepts(accept) is protobuf
