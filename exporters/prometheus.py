"""Prometheus exporter: turns timer records into the docs/metrics.md instruments.

Writes into an injected ``CollectorRegistry`` (never the global one). The
children of every instrument are kept per distinct request label set, in one
object: an event costs one dictionary lookup (the label set's), then attribute
reads, and a gap one histogram observation. The labels are already
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
from typing import ClassVar, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters import names
from exporters.fast_counter import CounterChild, FastCounter, FastGauge, GaugeChild
from exporters.fast_histogram import FastHistogram, HistogramChild
from proxy.core.backend_fit import BackendFitRecord
from proxy.core.labels import UNKNOWN
from proxy.core.records import (
    EVENTS,
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
) -> FastCounter:
    """The Prometheus counter of a docs/metrics.md instrument (the lock-free one; ``tenants``:
    as ``histogram``)."""
    assert inst.kind is names.Kind.COUNTER, inst.name
    return FastCounter(inst.prom_name, _doc(inst), _labels(inst, tenants), registry)


def gauge(
    inst: names.Instrument, registry: CollectorRegistry, *, tenants: bool = False
) -> FastGauge:
    """The Prometheus gauge of a docs/metrics.md up-down counter (the lock-free one;
    ``tenants``: as ``histogram``)."""
    assert inst.kind is names.Kind.UPDOWN, inst.name
    return FastGauge(inst.prom_name, _doc(inst), _labels(inst, tenants), registry)


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


_Extra = TypeVar("_Extra", HistogramChild, CounterChild)
_Child_co = TypeVar("_Child_co", covariant=True)


def _by_extra(
    children: dict[object, _Extra],
    key: object,
    family: _Family[_Extra],
    values: tuple[str, ...],
    *extra: str,
) -> _Extra:
    """The child of ``values`` + ``extra`` (found in ``children`` by ``key``), made at its
    first use."""
    child = children.get(key)
    if child is None:
        child = children[key] = family.labels(*values, *extra)
    return child


class _Family(Protocol[_Child_co]):
    """A labelled metric family: ``FastHistogram`` or ``FastCounter``."""

    def labels(self, *values: str) -> _Child_co:
        """The child of these label values."""
        ...


class _Children:
    """One request label set's child of every instrument: one lookup per event, not one per
    instrument.

    A child is made where prometheus_client's ``labels()`` would have been called, at
    its first use (so no series appears before its first observation), and then kept
    as an attribute: ``__getattr__`` runs only for a histogram's child not made yet.
    Instruments with more labels than the request's keep their children in a
    dictionary by those.
    """

    def __init__(
        self,
        values: tuple[str, ...],
        families: dict[str, tuple[FastHistogram, tuple[str, ...]]],
        active: GaugeChild,
    ) -> None:
        self.values = values
        """Values of the request labels in order (``request_label_values``)."""
        self._families = families
        self.active = active
        """The in-flight gauge (made with the label set: it moves on every request)."""
        self.stutter_cost: CounterChild | None = None
        """The stutter-cost counter, once a prefill of this label set finished."""
        self.duration: dict[object, HistogramChild] = {}
        """By error type."""
        self.cache_ttft: dict[object, HistogramChild] = {}
        """By prefix-cache state."""
        self.requests: dict[object, CounterChild] = {}
        """By (outcome, status code, error type)."""
        self.slo: dict[object, CounterChild] = {}
        """By (met, source)."""

    def __getattr__(self, name: str) -> HistogramChild:
        """The child of histogram ``name`` (a key of ``PrometheusSink._families``), made."""
        try:
            family, extra = self._families[name]
        except KeyError:
            raise AttributeError(name) from None
        child = family.labels(*self.values, *extra)
        setattr(self, name, child)
        return child


class PrometheusSink:
    """A fan-out subscriber writing Prometheus metrics into ``registry``.

    Every histogram is a ``FastHistogram`` (lock-free, same exposition, no
    ``_created`` series), every counter a ``FastCounter`` and the gauge a ``FastGauge``
    (lock-free, same exposition): the proxy observes from its one event-loop thread.
    """

    takes: ClassVar[tuple[str, ...]] = EVENTS
    """Every event of the ``Sink`` (a subscriber of the fan-out)."""

    def __init__(self, registry: CollectorRegistry, *, tenants: bool = False) -> None:
        """Metrics in ``registry``; ``tenants``: with the tenant labels (``--tenant-header``)."""
        self.registry = registry
        """The registry the admin server exposes."""
        self.tenants = tenants
        """Request metrics and the stall counter carry the tenant labels."""
        t = tenants
        tokens = histogram(names.TOKEN_USAGE, registry, tenants=t)
        self._families: dict[str, tuple[FastHistogram, tuple[str, ...]]] = {
            "ttft": (histogram(names.TTFT, registry, tenants=t), ()),
            "tpot": (histogram(names.TPOT, registry, tenants=t), ()),
            "gap": (histogram(names.GAP, registry, tenants=t), ()),
            "tokens_in": (tokens, ("input",)),
            "tokens_out": (tokens, ("output",)),
            "max_gap": (histogram(names.MAX_GAP, registry, tenants=t), ()),
            "queue_time": (histogram(names.QUEUE_TIME, registry, tenants=t), ()),
            "tokens_per_event": (histogram(names.TOKENS_PER_EVENT, registry, tenants=t), ()),
            "acceptance": (histogram(names.ACCEPTANCE_LENGTH, registry, tenants=t), ()),
            "answer_ttft": (histogram(names.ANSWER_TTFT, registry, tenants=t), ()),
            "reasoning": (histogram(names.REASONING_DURATION, registry, tenants=t), ()),
            "reasoning_tokens": (histogram(names.REASONING_TOKENS, registry, tenants=t), ()),
            "tool_call": (histogram(names.TOOL_CALL_TTF, registry, tenants=t), ()),
            "stalled_streams": (histogram(names.STALLED_STREAMS, registry, tenants=t), ()),
        }
        """The histogram of each of ``_Children``'s made attributes, and its extra label
        values."""
        self._stutter_cost = counter(names.STUTTER_COST, registry, tenants=t)
        self._cache_ttft = histogram(names.PREFIX_CACHE_TTFT, registry, tenants=t)
        self._duration = histogram(names.DURATION, registry, tenants=t)
        self._requests = counter(names.REQUESTS, registry, tenants=t)
        self._slo = counter(names.SLO_REQUESTS, registry, tenants=t)
        self._decoder_errors = counter(names.DECODER_ERRORS, registry)
        self._unobserved = counter(names.UNOBSERVED, registry)
        self._active = gauge(names.STREAMS_ACTIVE, registry, tenants=t)
        self._stall_duration = histogram(names.STALL_DURATION, registry)
        self._stalls = counter(names.STALLS, registry, tenants=t)
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
            ch = _Children(values, self._families, self._active.labels(*values))
            self._children[labels] = ch
        return ch

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
        self._for(labels).ttft.observe(ttft_s, {"trace_id": trace_id} if trace_id else None)

    def phase(
        self,
        labels: RequestLabels,
        phase: Phase,
        seconds: float,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """A phase closed live: time to first answer or tool call, or reasoning's duration."""
        child: HistogramChild = getattr(self._for(labels), _PHASE_CHILD[phase])
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
        values = ch.values
        err = record.error_type
        _by_extra(ch.duration, err, self._duration, values, err).observe(record.duration_s)
        outcome, code = record.outcome, record.status_code
        requests = ch.requests.get((outcome, code, err))
        if requests is None:
            requests = ch.requests[outcome, code, err] = self._requests.labels(
                *values, outcome.value, status_class(code), err
            )
        requests.inc()
        if record.prompt_tokens is not None:
            ch.tokens_in.observe(record.prompt_tokens)
        if record.completion_tokens is not None:
            ch.tokens_out.observe(record.completion_tokens)
        if not record.streamed:
            return
        ttft = record.ttft_s
        if ttft is not None:
            cache = record.prefix_cache
            _by_extra(ch.cache_ttft, cache, self._cache_ttft, values, cache).observe(ttft)
        queue = record.queue_time_s
        if queue is not None:
            ch.queue_time.observe(queue)
        per_event = record.tokens_per_event
        if per_event is not None:
            ch.tokens_per_event.observe(per_event)
        timings = record.backend_timings
        if timings is not None and timings.acceptance_length is not None:
            ch.acceptance.observe(timings.acceptance_length)
        reasoning = record.reasoning_tokens
        if reasoning is not None:
            ch.reasoning_tokens.observe(reasoning)
        for tpot in record.stream_tpots_s:
            ch.tpot.observe(tpot)
        worst = record.stream_max_gaps_s
        if worst:
            max_gap = ch.max_gap
            exemplar = {"trace_id": record.trace_id} if record.trace_id else None
            for gap in worst:  # the exemplar on the request's worst
                max_gap.observe(gap, exemplar if gap == record.max_gap_s else None)
        met, source = record.slo_judged(self.slo_ttft_s, self.slo_tpot_s, self.slo_answer_ttft_s)
        slo = ch.slo.get((met, source))
        if slo is None:  # the label values only then (an enum's ``value`` is a Python call)
            verdict = "met" if met else "missed"
            slo = _by_extra(ch.slo, (met, source), self._slo, values, verdict, source.value)
        slo.inc()

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
        ch.stalled_streams.observe(record.stalled_streams)
        cost = ch.stutter_cost
        if cost is None:
            cost = ch.stutter_cost = self._stutter_cost.labels(*ch.values)
        cost.inc(record.stutter_cost_s)


_PHASE_CHILD = {
    Phase.ANSWER: "answer_ttft",
    Phase.REASONING: "reasoning",
    Phase.TOOL_CALL: "tool_call",
}
"""The ``_Children`` attribute of each phase's histogram."""


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
