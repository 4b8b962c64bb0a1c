"""A labelled Prometheus histogram for the per-token path: plain lists, no locks.

prometheus_client's ``Histogram`` takes a lock for the sum and another for the
bucket on every observation, and resolves the bucket in Python. The proxy
observes every inter-token gap from its one event-loop thread, and ``/metrics``
is rendered by that same thread, so there is nothing to lock against: here an
observation is one ``bisect`` and two list additions for the classic buckets.
Exposed through a custom collector as the same families prometheus_client gives
(``_bucket`` with ``le``, ``_count``, ``_sum``, exemplars in OpenMetrics). Not
thread-safe by design.

Every child also keeps Prometheus's native (sparse exponential) buckets, which
only the protobuf exposition carries (``exporters.protobuf_exposition``): bucket
``i`` of schema ``s`` holds the values in ``(2^((i-1)/2^s), 2^(i/2^s)]``, values
at or below ``NATIVE_ZERO_THRESHOLD`` go to the zero bucket. The bucket is
``ceil(log2(v) * 2^s)``; where ``log2(v) * 2^s`` comes within 1e-9 of a whole
number (far above log2's rounding error, 1e-13 at these magnitudes), the value
is on or next to a bound and ``math.frexp`` and the bounds themselves decide. Then one
dictionary update: O(1), no lock.

Schema: a quantile read from a histogram lies in the bucket of the true value,
so its worst relative error is the bucket's growth factor minus one: 9.1% at
schema 3, 4.4% at schema 4, 2.2% at schema 5. The goal is 5%
(docs/metrics.md), so a child starts at ``NATIVE_SCHEMA`` = 5 and still meets it
after one halving. A child holds at most ``NATIVE_MAX_BUCKETS`` buckets: when a
new bucket would exceed it, neighbours merge pairwise (schema minus one), as
Prometheus's clients do. 160 buckets cover 5 octaves (a factor of 32) densely at
schema 5 and 10 octaves (a factor of 1,000) at schema 4.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from math import ceil, frexp, log2
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import Exemplar, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

NATIVE_SCHEMA: Final = 5
"""Schema a child starts at: 32 buckets per power of two, each 2.2% wider than the last."""
NATIVE_MAX_BUCKETS: Final = 160
"""Most native buckets one child holds or exposes (OpenTelemetry's default size, too)."""
NATIVE_ZERO_THRESHOLD: Final = 2.0**-128
"""Width of the zero bucket: Prometheus's default (client_golang's, 2^-128)."""
_MIN_SCHEMA: Final = -4
"""The coarsest schema Prometheus defines: 72 buckets cover every float above 2^-128."""
_INF: Final = float("inf")


def _octave_bounds(schema: int) -> tuple[float, ...]:
    """Upper bounds of one octave's buckets, as the fraction ``math.frexp`` returns.

    ``frexp(v) = (f, e)`` with ``f`` in ``[0.5, 1)``; the bucket of ``v`` at
    schema ``s >= 0`` is ``bisect_left(bounds, f) + (e - 1) * 2^s``. Python's
    ``**`` gives these bounds correctly rounded (checked against 60-digit
    decimals for every schema up to 8).
    """
    n = 1 << schema
    return tuple(2.0 ** (k / n - 1) for k in range(n))


_OCTAVES = [_octave_bounds(s) for s in range(NATIVE_SCHEMA + 1)]
"""The octave bounds of schemas 0 .. ``NATIVE_SCHEMA``, by schema."""


def coarser(index: int, steps: int) -> int:
    """The bucket of schema ``s - steps`` that holds bucket ``index`` of schema ``s``."""
    return -(-index >> steps)  # ceil(index / 2^steps), negative indexes too


class HistogramChild:
    """One label set's buckets: classic (fixed bounds) and native (exponential)."""

    __slots__ = (
        "_bounds",
        "_scale",
        "counts",
        "exemplars",
        "native",
        "schema",
        "sum",
        "zero_count",
    )

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        """Non-cumulative counts; the last is the ``+Inf`` bucket."""
        self.sum = 0.0
        """Sum of observed values."""
        self.exemplars: dict[int, Exemplar] = {}
        """Latest exemplar per bucket index."""
        self.schema = NATIVE_SCHEMA
        """Schema of ``native``: lowered by one each time the buckets outgrow the bound."""
        self.native: dict[int, int] = {}
        """Native bucket index -> count (positive values above the zero threshold)."""
        self.zero_count = 0
        """Observations at or below ``NATIVE_ZERO_THRESHOLD`` (the proxy's values are >= 0)."""
        self._scale = float(1 << NATIVE_SCHEMA)

    def observe(self, value: float, exemplar: dict[str, str] | None = None) -> None:
        """Count ``value`` (``le`` semantics: a bucket counts values <= its bound)."""
        i = bisect_left(self._bounds, value)
        self.counts[i] += 1
        self.sum += value
        if value > NATIVE_ZERO_THRESHOLD:
            x = log2(value) * self._scale
            try:
                key = ceil(x)
            except OverflowError:  # +Inf; _exact_index() places it
                key = 0
            if not 1e-9 <= key - x <= 0.999999999:  # on a bound, or within rounding of one
                key = self._exact_index(value)
            native = self.native
            n = native.get(key)
            if n is None:
                self._new_bucket(key)
            else:
                native[key] = n + 1
        else:
            self.zero_count += 1
        if exemplar:
            self.exemplars[i] = Exemplar(exemplar, value, time.time())

    def _exact_index(self, value: float) -> int:
        """The bucket of a value near a bound, by comparing with the bound itself."""
        if value == _INF:  # the last bucket, (2^(1024 - 2^-s), +Inf]
            return 1024 << self.schema
        frac, exp = frexp(value)
        return bisect_left(_OCTAVES[self.schema], frac) + (exp - 1) * (1 << self.schema)

    def _new_bucket(self, key: int) -> None:
        """A value's first native bucket: past the bound, halve the resolution."""
        native = self.native
        native[key] = 1
        if len(native) <= NATIVE_MAX_BUCKETS or self.schema == 0:
            # At schema 0 the keys are whole powers of two: at most 1,152 between the zero
            # threshold and the largest float; native_buckets() merges further as exposed.
            return
        while len(native) > NATIVE_MAX_BUCKETS and self.schema > 0:
            native = _merge(native, 1)
            self.schema -= 1
        self.native = native
        self._scale = float(1 << self.schema)

    def native_buckets(self) -> tuple[int, list[tuple[int, int]]]:
        """The schema and the (index, count) buckets to expose, by index.

        At most ``NATIVE_MAX_BUCKETS``: a child kept at schema 0 (values over more
        than 160 powers of two, which seconds and token counts never span) is
        merged further here, as exposed, down to schema -4 at most.
        """
        native = self.native
        schema = self.schema
        while len(native) > NATIVE_MAX_BUCKETS and schema > _MIN_SCHEMA:
            native = _merge(native, 1)
            schema -= 1
        return schema, sorted(native.items())

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)


def _merge(native: dict[int, int], steps: int) -> dict[int, int]:
    """``native``'s buckets at a schema ``steps`` lower: each new bucket sums 2^steps old."""
    out: dict[int, int] = {}
    for key, n in native.items():
        k = coarser(key, steps)
        out[k] = out.get(k, 0) + n
    return out


class HistogramFamily(HistogramMetricFamily):
    """The classic family prometheus_client writes, plus the children it is made from.

    The text and OpenMetrics expositions read ``samples``, made at the first
    read; the protobuf exposition reads ``children`` (classic and native
    buckets) and never pays for the samples.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        bounds: tuple[float, ...],
        les: list[str],
        children: list[tuple[tuple[str, ...], HistogramChild]],
    ) -> None:
        self._pending: list[tuple[tuple[str, ...], HistogramChild]] | None = None
        super().__init__(name, documentation, labels=labelnames)
        self.labelnames = labelnames
        """Label names, in the order of each child's values."""
        self.bounds = bounds
        """Classic bucket upper bounds (``+Inf`` not included)."""
        self.children = children
        """(label values, child) of every label set, as at the scrape."""
        self._les = les
        self._pending = children

    @property
    def samples(self) -> list[Sample]:
        """Cumulative buckets (exemplars on theirs), count and sum of every child."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            les = self._les
            for values, child in pending:
                cumulative = 0
                buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
                for i, count in enumerate(child.counts):
                    cumulative += count
                    ex = child.exemplars.get(i)
                    if ex is None:
                        buckets.append((les[i], cumulative))
                    else:
                        buckets.append((les[i], cumulative, ex))
                self.add_metric(list(values), buckets, child.sum)
        return self._samples

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        self._samples = value


class FastHistogram(Collector):
    """A histogram family registered in ``registry``; children per label values."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._doc = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = tuple(float(b) for b in buckets)
        # The exact le strings prometheus_client writes (its helper is untyped).
        self._les = [floatToGoString(b) for b in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        """The child of these label values (created on first use)."""
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name}: expected {len(self._labelnames)} label values")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = HistogramChild(self._bounds)
        return child

    def describe(self) -> Iterable[Metric]:
        """The family's name, for the registry's duplicate check."""
        return [HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)]

    def collect(self) -> Iterable[Metric]:
        """Cumulative buckets, count and sum of every child (as samples when read)."""
        children = list(self._children.items())
        return [
            HistogramFamily(
                self._name, self._doc, self._labelnames, self._bounds, self._les, children
            )
        ]
