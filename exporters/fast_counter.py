"""Labelled Prometheus counters and gauges for the per-request path: plain floats, no locks.

prometheus_client's ``Counter.inc`` checks that the metric is a child, takes a
lock and goes through a value object; ``Gauge.inc`` and ``dec`` the same. The
proxy counts from its one event-loop thread and renders ``/metrics`` on that
same thread (as ``exporters.fast_histogram``), so a child here is a float in a
slot: ``inc`` is one addition. Children are resolved once by the caller (the
Prometheus sink keeps them per request label set), never looked up per update.

Exposed through a custom collector as the very samples prometheus_client gives,
in the same order: per child ``_total`` then ``_created`` (the child's creation
time, unless prometheus_client's created series are disabled) for a counter,
the value for a gauge; so the text, OpenMetrics and protobuf expositions are
byte-identical. No exemplars: no counter of the proxy carries one. Not
thread-safe by design.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client import metrics as _client_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample


class CounterChild:
    """One label set's count (a float, as prometheus_client keeps it) and creation time."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        """The count so far."""
        self.created = time.time()
        """Unix time of the child's creation: the ``_created`` sample."""

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount`` (>= 0; a counter only goes up)."""
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class GaugeChild:
    """One label set's value (a float)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0
        """The value now."""

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount``."""
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        """Subtract ``amount`` (as prometheus_client: adds ``-amount``)."""
        self.value += -amount

    def set(self, value: float) -> None:
        """Set the value."""
        self.value = float(value)


_Child = TypeVar("_Child", CounterChild, GaugeChild)


class _Family(Collector, Generic[_Child]):
    """A labelled family registered in ``registry``; children per label values."""

    _type = ""
    _child: type[_Child]

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        if not labelnames:
            raise ValueError(f"{name}: a fast family has labels (use prometheus_client's)")
        if self._type == "counter" and name.endswith("_total"):
            raise ValueError(f"{name}: name a counter without its _total suffix")
        self._name = name
        self._doc = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], _Child] = {}
        registry.register(self)

    def labels(self, *values: str) -> _Child:
        """The child of these label values (created on first use, at 0)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name}: expected {len(self._labelnames)} label values")
            child = self._children[values] = self._child()
        return child

    def remove(self, *values: str) -> None:
        """Drop the child of these label values (``KeyError`` when there is none)."""
        del self._children[values]

    def describe(self) -> Iterable[Metric]:
        """The family's name, for the registry's duplicate check."""
        return [Metric(self._name, self._doc, self._type)]


class FastCounter(_Family[CounterChild]):
    """A counter family; ``labels`` gives the child, to keep and ``inc``."""

    _type = "counter"
    _child = CounterChild

    def collect(self) -> Iterable[Metric]:
        """``_total`` and ``_created`` of every child, in creation order."""
        metric = Metric(self._name, self._doc, "counter")
        samples = metric.samples
        total, created = self._name + "_total", self._name + "_created"
        # prometheus_client's switch (disable_created_metrics), read live; a release that
        # renames it falls back to its default, and the byte-identity test says so.
        with_created = getattr(_client_metrics, "_use_created", True)
        names = self._labelnames
        for values, child in self._children.items():
            samples.append(Sample(total, dict(zip(names, values, strict=True)), child.value))
            if with_created:
                labels = dict(zip(names, values, strict=True))
                samples.append(Sample(created, labels, child.created))
        return [metric]


class FastGauge(_Family[GaugeChild]):
    """A gauge family; ``labels`` gives the child, to keep and ``inc``, ``dec`` or ``set``."""

    _type = "gauge"
    _child = GaugeChild

    def collect(self) -> Iterable[Metric]:
        """The value of every child, in creation order."""
        metric = Metric(self._name, self._doc, "gauge")
        names = self._labelnames
        metric.samples = [
            Sample(self._name, dict(zip(names, values, strict=True)), child.value)
            for values, child in self._children.items()
        ]
        return [metric]
