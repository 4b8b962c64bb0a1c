"""The lock-free gap histogram exposes exactly what prometheus_client's Histogram does."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from exporters.fast_histogram import FastHistogram

BUCKETS = (0.001, 0.0025, 0.01, 0.1, 1.0, 2.5)
VALUES = [0.0, 0.001, 0.0011, 0.0025, 0.05, 0.1, 0.99, 1.0, 2.5, 3.0, 100.0]


def _samples(registry: CollectorRegistry) -> set[tuple[str, tuple, float]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for m in registry.collect()
        for s in m.samples
        if not s.name.endswith("_created")
    }


def test_same_samples_as_prometheus_client():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = FastHistogram("gap_seconds", "doc", ("a", "b"), BUCKETS, ours)
    ref = Histogram("gap_seconds", "doc", ("a", "b"), buckets=BUCKETS, registry=theirs)
    for i, v in enumerate(VALUES):
        labels = ("x", str(i % 2))
        fast.labels(*labels).observe(v)
        ref.labels(*labels).observe(v)
    assert _samples(ours) == _samples(theirs)
    text = generate_latest(ours).decode()
    assert 'gap_seconds_bucket{a="x",b="0",le="0.001"}' in text
    assert 'le="+Inf"' in text


def test_exemplar_in_openmetrics():
    reg = CollectorRegistry()
    fast = FastHistogram("gap_seconds", "doc", ("a",), BUCKETS, reg)
    fast.labels("x").observe(0.05, {"trace_id": "abc123"})
    text = generate_openmetrics(reg).decode()
    assert '# {trace_id="abc123"} 0.05' in text


def test_wrong_label_count_is_refused():
    fast = FastHistogram("g", "doc", ("a",), BUCKETS, CollectorRegistry())
    with pytest.raises(ValueError, match="expected 1 label values"):
        fast.labels("x", "y")
