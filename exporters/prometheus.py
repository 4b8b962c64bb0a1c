"""Prometheus exporter: turns timer records into the docs/metrics.md instruments.

Writes into an injected ``CollectorRegistry`` (never the global one). Label
children are resolved once per distinct label set and cached, so a gap costs
one dictionary lookup and one histogram observation. The labels are already
bounded by the proxy (see ``exporters.labels``), so the cache is bounded too.

TTFT is observed live, when the first output event arrives (``first_token``);
everything else once per request, when it finishes. Exemplars: the TTFT,
inter-token gap and worst-gap histograms carry the trace id of a sampled
request (``{"trace_id": ...}``), shown in the OpenMetrics exposition of
``/metrics``. A gap carries one only when it is its stream's worst so far (the
timer decides), so the cost stays per request, not per token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters import names
from exporters.fast_histogram import FastHistogram, HistogramChild
from proxy.core.backend_fit import BackendFitRecord
from proxy.core.labels import UNKNOWN
from proxy.core.records import (
    Backend,
    GapRecorder,
    Phase,
    PrefillRecord,
    RequestLabels,
    RequestRecord,
    StallCause,
    StallRecord,
)


def _doc(inst: names.Instrument) -> str:
    return f"{inst.description} ({inst.name}, unit {inst.unit})"


def _labels(inst: names.Instrument, tenants: bool) -> tuple[str, ...]:
    attrs = names.tenant_attrs(inst) if tenants else inst.attrs
    return tuple(names.label_name(a) for a in attrs)


def histogram(
    inst: names.Instrument, registry: CollectorRegistry, *, tenants: bool = False
) -> FastHistogram:
    """The Prometheus histogram of a docs/metrics.md instrument (the lock-free one);
    ``tenants``: with the tenant labels (``names.tenant_attrs``)."""
    assert inst.kind is names.Kind.HISTOGRAM, inst.name
    labels = _labels(inst, tenants)
    return FastHistogram(inst.prom_name, _doc(inst), labels, inst.buckets, registry)


def counter(
    inst: names.Instrument, registry: CollectorRegistry, *, tenants: bool = False
) -> Counter:
    """The Prometheus counter of a docs/metrics.md instrument (``tenants``: as ``histogram``)."""
    assert inst.kind is names.Kind.COUNTER, inst.name
    return Counter(inst.prom_name, _doc(inst), _labels(inst, tenants), registry=registry)


def gauge(inst: names.Instrument, registry: CollectorRegistry, *, tenants: bool = False) -> Gauge:
    """The Prometheus gauge of a docs/metrics.md up-down counter (``tenants``: as
    ``histogram``)."""
    assert inst.kind is names.Kind.UPDOWN, inst.name
    return Gauge(inst.prom_name, _doc(inst), _labels(inst, tenants), registry=registry)


def request_label_values(labels: RequestLabels, tenants: bool = False) -> tuple[str, ...]:
    """Values of the request labels in order: ``names.REQUEST_ATTRS``, then (``tenants``)
    the tenant, ``unknown`` for a request that was not told apart."""
    b = labels.backend
    if tenants:
        return (labels.operation, b.provider, labels.model, b.address, labels.tenant or UNKNOWN)
    return (labels.operation, b.provider, labels.model, b.address)


def stall_tenants(record: StallRecord) -> tuple[str, str]:
    """The stalled stream's tenant and its culprit's (``none`` when unattributed)."""
    if record.cause is StallCause.UNATTRIBUTED:
        culprit = NO_CULPRIT
    else:
        culprit = record.culprit_tenant or UNKNOWN
    return record.tenant or UNKNOWN, culprit


NO_CULPRIT = "none"
"""``tokenstamp.culprit.tenant`` of an unattributed stall."""


def status_class(code: int) -> str:
    """``2xx``-style class of an HTTP status; ``none`` when nothing was sent."""
    return f"{code // 100}xx" if 100 <= code <= 599 else "none"


_Child = TypeVar("_Child")
_Child_co = TypeVar("_Child_co", covariant=True)


class _Family(Protocol[_Child_co]):
    """A labelled metric family: ``FastHistogram`` or a prometheus_client metric."""

    def labels(self, *values: str) -> _Child_co:
        """The child of these label values."""
        ...


def _child(
    cache: dict[tuple[object, ...], _Child],
    family: _Family[_Child],
    values: tuple[str, ...],
    extra: tuple[str, ...],
) -> _Child:
    """``family``'s child of ``values`` + ``extra``, made at its first use, then from ``cache``."""
    key = (family, *extra)
    child = cache.get(key)
    if child is None:
        child = cache[key] = family.labels(*values, *extra)
    return child


class _Children:
    """Label children of one request label set, each made at its first use.

    A child is made where prometheus_client's ``labels()`` would have been
    called (so no series appears before its first observation), then kept:
    per request the sink does dictionary lookups, not ``labels()`` calls.
    """

    __slots__ = ("active", "counters", "gap", "hists", "values")

    def __init__(self, values: tuple[str, ...], gap: HistogramChild, active: Gauge) -> None:
        self.values = values
        """Values of the request labels in order (``request_label_values``)."""
        self.gap = gap
        self.active = active
        self.hists: dict[tuple[object, ...], HistogramChild] = {}
        """By (family, extra label values)."""
        self.counters: dict[tuple[object, ...], Counter] = {}
        """By (family, extra label values)."""


class PrometheusSink:
    """A ``proxy.core.records.Sink`` writing Prometheus metrics into ``registry``.

    Every histogram is a ``FastHistogram`` (lock-free, same exposition, no
    ``_created`` series): the proxy observes from its one event-loop thread.
    """

    def __init__(self, registry: CollectorRegistry, *, tenants: bool = False) -> None:
        """Metrics in ``registry``; ``tenants``: with the tenant labels (``--tenant-header``)."""
        self.registry = registry
        """The registry the admin server exposes."""
        self.tenants = tenants
        """Request metrics and the stall counter carry the tenant labels."""
        t = tenants
        self._ttft = histogram(names.TTFT, registry, tenants=t)
        self._cache_ttft = histogram(names.PREFIX_CACHE_TTFT, registry, tenants=t)
        self._tpot = histogram(names.TPOT, registry, tenants=t)
        self._gap = histogram(names.GAP, registry, tenants=t)
        self._duration = histogram(names.DURATION, registry, tenants=t)
        self._tokens = histogram(names.TOKEN_USAGE, registry, tenants=t)
        self._max_gap = histogram(names.MAX_GAP, registry, tenants=t)
        self._queue_time = histogram(names.QUEUE_TIME, registry, tenants=t)
        self._tokens_per_event = histogram(names.TOKENS_PER_EVENT, registry, tenants=t)
        self._acceptance = histogram(names.ACCEPTANCE_LENGTH, registry, tenants=t)
        self._answer_ttft = histogram(names.ANSWER_TTFT, registry, tenants=t)
        self._reasoning = histogram(names.REASONING_DURATION, registry, tenants=t)
        self._reasoning_tokens = histogram(names.REASONING_TOKENS, registry, tenants=t)
        self._tool_call = histogram(names.TOOL_CALL_TTF, registry, tenants=t)
        self._phases = {
            Phase.ANSWER: self._answer_ttft,
            Phase.REASONING: self._reasoning,
            Phase.TOOL_CALL: self._tool_call,
        }
        self._requests = counter(names.REQUESTS, registry, tenants=t)
        self._slo = counter(names.SLO_REQUESTS, registry, tenants=t)
        self._decoder_errors = counter(names.DECODER_ERRORS, registry)
        self._unobserved = counter(names.UNOBSERVED, registry)
        self._active = gauge(names.STREAMS_ACTIVE, registry, tenants=t)
        self._stall_duration = histogram(names.STALL_DURATION, registry)
        self._stalled_streams = histogram(names.STALLED_STREAMS, registry, tenants=t)
        self._stalls = counter(names.STALLS, registry, tenants=t)
        self._stutter_cost = counter(names.STUTTER_COST, registry, tenants=t)
        self._children: dict[RequestLabels, _Children] = {}
        self.slo_ttft_s = float("inf")
        """TTFT target for ``tokenstamp_requests_slo_total``."""
        self.slo_tpot_s = float("inf")
        """TPOT target for ``tokenstamp_requests_slo_total``."""
        self.slo_answer_ttft_s: float | None = None
        """Time-to-first-answer target for ``tokenstamp_requests_slo_total`` (``None``: off)."""

    def _for(self, labels: RequestLabels) -> _Children:
        ch = self._children.get(labels)
        if ch is None:
            values = request_label_values(labels, self.tenants)
            ch = _Children(values, self._gap.labels(*values), self._active.labels(*values))
            self._children[labels] = ch
        return ch

    @staticmethod
    def _hist(ch: _Children, family: FastHistogram, *extra: str) -> HistogramChild:
        return _child(ch.hists, family, ch.values, extra)

    @staticmethod
    def _count(ch: _Children, family: Counter, *extra: str) -> Counter:
        return _child(ch.counters, family, ch.values, extra)

    def request_started(self, labels: RequestLabels) -> None:
        """In-flight gauge up."""
        self._for(labels).active.inc()

    def first_token(
        self,
        labels: RequestLabels,
        ttft_s: float,
        upstream_ttft_s: float | None,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """The live TTFT (with an exemplar when ``trace_id`` is given)."""
        child = self._hist(self._for(labels), self._ttft)
        child.observe(ttft_s, {"trace_id": trace_id} if trace_id else None)

    def phase(
        self,
        labels: RequestLabels,
        phase: Phase,
        seconds: float,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """A phase closed live: time to first answer or tool call, or reasoning's duration."""
        child = self._hist(self._for(labels), self._phases[phase])
        child.observe(seconds, {"trace_id": trace_id} if trace_id else None)

    def gap(self, labels: RequestLabels, gap_s: float, request_id: str, trace_id: str = "") -> None:
        """One inter-token gap (with an exemplar when ``trace_id`` is given)."""
        if trace_id:
            self._for(labels).gap.observe(gap_s, {"trace_id": trace_id})
        else:
            self._for(labels).gap.observe(gap_s)

    def gap_recorder(self, labels: RequestLabels, request_id: str) -> GapRecorder:
        """The label set's gap histogram child, found once per request (``Sink.gap_recorder``)."""
        return self._for(labels).gap.observe

    def request_finished(self, record: RequestRecord) -> None:
        """Everything observed once per request, at its end (TTFT came live; here by cache)."""
        ch = self._for(record.labels)
        ch.active.dec()
        hist = self._hist
        err = record.error_type
        hist(ch, self._duration, err).observe(record.duration_s)
        self._count(
            ch, self._requests, record.outcome.value, status_class(record.status_code), err
        ).inc()
        if record.prompt_tokens is not None:
            hist(ch, self._tokens, "input").observe(record.prompt_tokens)
        if record.completion_tokens is not None:
            hist(ch, self._tokens, "output").observe(record.completion_tokens)
        if not record.streamed:
            return
        ttft = record.ttft_s
        if ttft is not None:
            hist(ch, self._cache_ttft, record.prefix_cache).observe(ttft)
        queue = record.queue_time_s
        if queue is not None:
            hist(ch, self._queue_time).observe(queue)
        per_event = record.tokens_per_event
        if per_event is not None:
            hist(ch, self._tokens_per_event).observe(per_event)
        timings = record.backend_timings
        if timings is not None and timings.acceptance_length is not None:
            hist(ch, self._acceptance).observe(timings.acceptance_length)
        reasoning = record.reasoning_tokens
        if reasoning is not None:
            hist(ch, self._reasoning_tokens).observe(reasoning)
        for tpot in record.stream_tpots_s:
            hist(ch, self._tpot).observe(tpot)
        worst = record.stream_max_gaps_s
        if worst:
            max_gap = hist(ch, self._max_gap)
            exemplar = {"trace_id": record.trace_id} if record.trace_id else None
            for gap in worst:  # the exemplar on the request's worst
                max_gap.observe(gap, exemplar if gap == record.max_gap_s else None)
        met, source = record.slo_judged(self.slo_ttft_s, self.slo_tpot_s, self.slo_answer_ttft_s)
        self._count(ch, self._slo, "met" if met else "missed", source.value).inc()

    def decoder_error(self, backend: Backend, kind: str) -> None:
        """One undecodable upstream event."""
        self._decoder_errors.labels(backend.provider, backend.address, kind).inc()

    def unobserved(self, backend: Backend, reason: str) -> None:
        """One request passed through without timing."""
        self._unobserved.labels(backend.provider, backend.address, reason).inc()

    def stall(self, record: StallRecord) -> None:
        """One stall: counted and its duration observed, by cause."""
        b = record.backend
        cause = record.cause.value
        if self.tenants:
            self._stalls.labels(b.provider, b.address, cause, *stall_tenants(record)).inc()
        else:
            self._stalls.labels(b.provider, b.address, cause).inc()
        self._stall_duration.labels(b.provider, b.address, cause).observe(record.duration_s)

    def prefill_done(self, record: PrefillRecord) -> None:
        """One finished prefill: streams it stalled (0 too) and its stutter cost."""
        ch = self._for(record.labels)
        self._hist(ch, self._stalled_streams).observe(record.stalled_streams)
        self._count(ch, self._stutter_cost).inc(record.stutter_cost_s)


class BackendFitGauges:
    """The advisor's fitted cost model of each backend as gauges in ``registry``.

    ``publish`` sets the gauges of the parameters that are known and removes
    those that are not (absent until fitted, never a made-up number).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        def make(inst: names.Instrument) -> Gauge:
            assert inst.kind is names.Kind.GAUGE, inst.name
            return Gauge(inst.prom_name, _doc(inst), inst.prom_labels, registry=registry)

        self._rate = make(names.PREFILL_RATE)
        self._base = make(names.DECODE_STEP_BASE)
        self._per_stream = make(names.DECODE_STEP_PER_STREAM)
        self._step = make(names.PREFILL_STEP)
        self._chunk = make(names.PREFILL_CHUNK)

    def publish(self, record: BackendFitRecord) -> None:
        """Show ``record``'s known parameters; hide the unknown ones."""
        b = record.backend
        chunk: float | None = None
        if record.chunked is True and record.chunk_size is not None:
            chunk = float(record.chunk_size)
        elif record.chunked is False:
            chunk = 0.0  # as exporters.otel_fit.chunk_gauge_value
        for gauge, value in (
            (self._rate, record.prefill_tokens_per_s),
            (self._base, record.decode_base_s),
            (self._per_stream, record.decode_per_stream_s),
            (self._step, record.prefill_step_s),
            (self._chunk, chunk),
        ):
            if value is None:
                with contextlib.suppress(KeyError):  # not shown yet
                    gauge.remove(b.provider, b.address)
            else:
                gauge.labels(b.provider, b.address).set(value)


BudgetReading = Callable[[], tuple[int, int, int]]
"""Reads the request-body budget now: bytes held, the budget's size, bodies refused so far."""


class BodyBudgetMetrics(Collector):
    """The request-body budget's gauges and refusal counter, read at each scrape."""

    def __init__(self, registry: CollectorRegistry, backend: Backend, read: BudgetReading) -> None:
        self._values = [backend.provider, backend.address]
        self._read = read
        registry.register(self)

    def collect(self) -> Iterable[Metric]:
        """One sample each: bytes held, the budget, refusals."""
        held, limit, refused = self._read()
        labels = list(names.BACKEND_ATTRS)
        for inst, value in ((names.BODY_HELD, held), (names.BODY_BUDGET, limit)):
            g = GaugeMetricFamily(
                inst.prom_name, _doc(inst), labels=[names.label_name(a) for a in labels]
            )
            g.add_metric(self._values, float(value))
            yield g
        inst = names.BODY_REFUSED
        c = CounterMetricFamily(
            inst.prom_name, _doc(inst), labels=[names.label_name(a) for a in labels]
        )
        c.add_metric(self._values, float(refused))
        yield c


class TenantOverflowMetrics(Collector):
    """``tokenstamp_tenants_overflow_total``, read at each scrape (only with tenants)."""

    def __init__(
        self, registry: CollectorRegistry, backend: Backend, read: Callable[[], int]
    ) -> None:
        self._values = [backend.provider, backend.address]
        self._read = read
        registry.register(self)

    def collect(self) -> Iterable[Metric]:
        """The requests folded into ``other`` so far."""
        inst = names.TENANTS_OVERFLOW
        c = CounterMetricFamily(inst.prom_name, _doc(inst), labels=inst.prom_labels)
        c.add_metric(self._values, float(self._read()))
        yield c
