"""A labelled Prometheus histogram for the per-token path: plain lists, no locks.

prometheus_client's ``Histogram`` takes a lock for the sum and another for the
bucket on every observation, and resolves the bucket in Python. The proxy
observes every inter-token gap from its one event-loop thread, and ``/metrics``
is rendered by that same thread, so there is nothing to lock against: here an
observation is one ``bisect`` and two list additions. Exposed through a custom
collector as the same families prometheus_client gives (``_bucket`` with ``le``,
``_count``, ``_sum``, exemplars in OpenMetrics). Not thread-safe by design.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import Exemplar, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class HistogramChild:
    """One label set's buckets."""

    __slots__ = ("_bounds", "counts", "exemplars", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        """Non-cumulative counts; the last is the ``+Inf`` bucket."""
        self.sum = 0.0
        """Sum of observed values."""
        self.exemplars: dict[int, Exemplar] = {}
        """Latest exemplar per bucket index."""

    def observe(self, value: float, exemplar: dict[str, str] | None = None) -> None:
        """Count ``value`` (``le`` semantics: a bucket counts values <= its bound)."""
        i = bisect_left(self._bounds, value)
        self.counts[i] += 1
        self.sum += value
        if exemplar:
            self.exemplars[i] = Exemplar(exemplar, value, time.time())


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
        """Cumulative buckets, count and sum of every child."""
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for values, child in list(self._children.items()):
            cumulative = 0
            buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
            for i, count in enumerate(child.counts):
                cumulative += count
                ex = child.exemplars.get(i)
                if ex is None:
                    buckets.append((self._les[i], cumulative))
                else:
                    buckets.append((self._les[i], cumulative, ex))
            family.add_metric(list(values), buckets, child.sum)
        return [family]
