"""The lock-free histogram: exactly prometheus_client's exposition; native buckets by definition."""

from __future__ import annotations

import math
import random
from collections import Counter
from decimal import Decimal, getcontext

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from exporters.fast_histogram import (
    NATIVE_MAX_BUCKETS,
    NATIVE_SCHEMA,
    NATIVE_ZERO_THRESHOLD,
    FastHistogram,
    HistogramChild,
    HistogramFamily,
    _octave_bounds,
)

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


# Native buckets: bucket i of schema s holds (2^((i-1)/2^s), 2^(i/2^s)].


def _bound(index: int, schema: int) -> float:
    return 2.0 ** (index / 2.0**schema)


def brute_force_index(value: float, schema: int) -> int:
    """The native bucket of ``value`` found by comparing with the bounds themselves."""
    i = math.floor(math.log2(value) * 2.0**schema)  # a guess, then the definition decides
    while _bound(i, schema) < value:
        i += 1
    while _bound(i - 1, schema) >= value:
        i -= 1
    return i


def _random_values(rng: random.Random, n: int) -> list[float]:
    """Values over 2^-40 .. 2^40, some exactly on a bound or a power of two."""
    out = [2.0 ** rng.uniform(-40, 40) for _ in range(n)]
    out += [_bound(rng.randint(-600, 600), NATIVE_SCHEMA) for _ in range(n // 10)]
    out += [2.0 ** rng.randint(-40, 40) for _ in range(n // 10)]
    bounds = [_bound(rng.randint(-600, 600), NATIVE_SCHEMA) for _ in range(n // 10)]
    out += [math.nextafter(b, math.inf) for b in bounds]  # one unit in the last place off
    out += [math.nextafter(b, 0.0) for b in bounds]
    return out


@given(st.floats(min_value=1e-30, max_value=1e30))
def test_native_index_is_the_bucket_by_definition(value):
    child = HistogramChild(BUCKETS)
    child.observe(value)
    assert child.native == {brute_force_index(value, NATIVE_SCHEMA): 1}


@given(st.integers(min_value=-3000, max_value=3000), st.sampled_from([-1, 0, 1]))
def test_values_on_and_next_to_a_bound(index, ulps):
    bound = _bound(index, NATIVE_SCHEMA)
    value = bound if ulps == 0 else math.nextafter(bound, math.inf * ulps)
    child = HistogramChild(BUCKETS)
    child.observe(value)
    assert child.native == {brute_force_index(value, NATIVE_SCHEMA): 1}
    assert child.native == {index + (ulps > 0): 1}


def test_native_buckets_count_what_brute_force_counts():
    rng = random.Random(1)
    values = _random_values(rng, 3000)
    child = HistogramChild(BUCKETS)
    for v in values:
        child.observe(v)
    schema, buckets = child.native_buckets()
    want = Counter(brute_force_index(v, schema) for v in values)
    assert dict(buckets) == want
    assert sorted(want) == [i for i, _ in buckets]
    assert sum(n for _, n in buckets) == len(values) == child.count


def test_zero_and_tiny_values_go_to_the_zero_bucket():
    child = HistogramChild(BUCKETS)
    for v in (0.0, NATIVE_ZERO_THRESHOLD, NATIVE_ZERO_THRESHOLD / 2):
        child.observe(v)
    child.observe(NATIVE_ZERO_THRESHOLD * 1.0000001)
    assert child.zero_count == 3
    assert sum(child.native.values()) == 1


def test_infinity_lands_in_the_last_bucket():
    child = HistogramChild(BUCKETS)
    child.observe(math.inf)
    child.observe(math.nextafter(math.inf, 0.0))  # the largest float: the same bucket
    assert child.native == {1024 << NATIVE_SCHEMA: 2}
    assert child.counts[-1] == 2


def test_schema_halves_when_the_buckets_outgrow_the_bound():
    child = HistogramChild(BUCKETS)
    # Every bucket of schema 5 from 1 s up: 6 powers of two take 192 buckets.
    values = [_bound(i, NATIVE_SCHEMA) * 0.999 for i in range(1, 193)]
    for v in values:
        child.observe(v)
        assert len(child.native) <= NATIVE_MAX_BUCKETS
    assert child.schema == NATIVE_SCHEMA - 1
    assert child.native == Counter(brute_force_index(v, child.schema) for v in values)
    child.observe(1e-3)  # after the change, new values land at the new schema
    assert child.native[brute_force_index(1e-3, child.schema)] == 1


def test_exposed_buckets_stay_bounded_for_any_spread():
    child = HistogramChild(BUCKETS)
    values = [2.0**e for e in range(-127, 990, 3)] + [3.0**e for e in range(-80, 620)]
    for v in values:
        child.observe(v)
    assert child.schema == 0  # halving in the child stops at schema 0 ...
    schema, buckets = child.native_buckets()  # ... the exposition merges further
    assert len(buckets) <= NATIVE_MAX_BUCKETS
    assert schema < 0
    assert dict(buckets) == Counter(brute_force_index(v, schema) for v in values)


def test_octave_bounds_are_correctly_rounded():
    getcontext().prec = 60
    for schema in range(NATIVE_SCHEMA + 1):
        n = 1 << schema
        for k, bound in enumerate(_octave_bounds(schema)):
            assert bound == float(Decimal(2) ** (Decimal(k) / n) / 2)


def test_samples_are_made_when_read_and_equal_the_text_exposition():
    reg = CollectorRegistry()
    fast = FastHistogram("gap_seconds", "doc", ("a",), BUCKETS, reg)
    fast.labels("x").observe(0.05, {"trace_id": "abc123"})
    (family,) = fast.collect()
    assert isinstance(family, HistogramFamily)
    assert family._pending is not None  # nothing built yet: the protobuf path reads children
    assert [s.name for s in family.samples][-2:] == ["gap_seconds_count", "gap_seconds_sum"]
    assert family._pending is None
    assert len(family.samples) == len(BUCKETS) + 3
