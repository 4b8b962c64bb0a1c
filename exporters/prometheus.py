"""Prometheus exporter: turns timer records into the METRICS.md instruments.

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
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from exporters import names
from exporters.fast_histogram import FastHistogram, HistogramChild
from proxy.core.backend_fit import BackendFitRecord
from proxy.core.records import (
    Backend,
    GapRecorder,
    PrefillRecord,
    RequestLabels,
    RequestRecord,
    StallRecord,
)


def _doc(inst: names.Instrument) -> str:
    return f"{inst.description} ({inst.name}, unit {inst.unit})"


def histogram(inst: names.Instrument, registry: CollectorRegistry) -> Histogram:
    """The Prometheus histogram of a METRICS.md instrument."""
    assert inst.kind is names.Kind.HISTOGRAM, inst.name
    return Histogram(
        inst.prom_name, _doc(inst), inst.prom_labels, registry=registry, buckets=inst.buckets
    )


def counter(inst: names.Instrument, registry: CollectorRegistry) -> Counter:
    """The Prometheus counter of a METRICS.md instrument."""
    assert inst.kind is names.Kind.COUNTER, inst.name
    return Counter(inst.prom_name, _doc(inst), inst.prom_labels, registry=registry)


def gauge(inst: names.Instrument, registry: CollectorRegistry) -> Gauge:
    """The Prometheus gauge of a METRICS.md up-down counter."""
    assert inst.kind is names.Kind.UPDOWN, inst.name
    return Gauge(inst.prom_name, _doc(inst), inst.prom_labels, registry=registry)


def status_class(code: int) -> str:
    """``2xx``-style class of an HTTP status; ``none`` when nothing was sent."""
    return f"{code // 100}xx" if 100 <= code <= 599 else "none"


@dataclass(slots=True)
class _Children:
    """Label children of one request label set."""

    gap: HistogramChild
    active: Gauge


class PrometheusSink:
    """A ``proxy.core.records.Sink`` writing Prometheus metrics into ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        """The registry the admin server exposes."""
        self._ttft = histogram(names.TTFT, registry)
        self._cache_ttft = histogram(names.PREFIX_CACHE_TTFT, registry)
        self._tpot = histogram(names.TPOT, registry)
        # Every inter-token gap lands here: the lock-free histogram (same exposition).
        self._gap = FastHistogram(
            names.GAP.prom_name, _doc(names.GAP), names.GAP.prom_labels, names.GAP.buckets,
            registry,
        )  # fmt: skip
        self._duration = histogram(names.DURATION, registry)
        self._tokens = histogram(names.TOKEN_USAGE, registry)
        self._max_gap = histogram(names.MAX_GAP, registry)
        self._queue_time = histogram(names.QUEUE_TIME, registry)
        self._tokens_per_event = histogram(names.TOKENS_PER_EVENT, registry)
        self._acceptance = histogram(names.ACCEPTANCE_LENGTH, registry)
        self._requests = counter(names.REQUESTS, registry)
        self._slo = counter(names.SLO_REQUESTS, registry)
        self._decoder_errors = counter(names.DECODER_ERRORS, registry)
        self._unobserved = counter(names.UNOBSERVED, registry)
        self._active = gauge(names.STREAMS_ACTIVE, registry)
        self._stall_duration = histogram(names.STALL_DURATION, registry)
        self._stalled_streams = histogram(names.STALLED_STREAMS, registry)
        self._stalls = counter(names.STALLS, registry)
        self._stutter_cost = counter(names.STUTTER_COST, registry)
        self._children: dict[RequestLabels, _Children] = {}
        # TTFT children apart: made at a first token, so no stream-less series appear.
        self._ttft_children: dict[RequestLabels, Histogram] = {}
        self.slo_ttft_s = float("inf")
        """TTFT target for ``tokenstamp_requests_slo_total``."""
        self.slo_tpot_s = float("inf")
        """TPOT target for ``tokenstamp_requests_slo_total``."""

    @staticmethod
    def request_label_values(labels: RequestLabels) -> tuple[str, str, str, str]:
        """Values of ``names.REQUEST_ATTRS`` in order."""
        b = labels.backend
        return (labels.operation, b.provider, labels.model, b.address)

    def _for(self, labels: RequestLabels) -> _Children:
        ch = self._children.get(labels)
        if ch is None:
            values = self.request_label_values(labels)
            ch = _Children(gap=self._gap.labels(*values), active=self._active.labels(*values))
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
        child = self._ttft_children.get(labels)
        if child is None:
            child = self._ttft.labels(*self.request_label_values(labels))
            self._ttft_children[labels] = child
        child.observe(ttft_s, {"trace_id": trace_id} if trace_id else None)

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
        labels = record.labels
        self._for(labels).active.dec()
        values = self.request_label_values(labels)
        err = record.error_type
        self._duration.labels(*values, err).observe(record.duration_s)
        self._requests.labels(
            *values, record.outcome.value, status_class(record.status_code), err
        ).inc()
        if record.prompt_tokens is not None:
            self._tokens.labels(*values, "input").observe(record.prompt_tokens)
        if record.completion_tokens is not None:
            self._tokens.labels(*values, "output").observe(record.completion_tokens)
        if not record.streamed:
            return
        exemplar = {"trace_id": record.trace_id} if record.trace_id else None
        ttft = record.ttft_s
        if ttft is not None:
            self._cache_ttft.labels(*values, record.prefix_cache).observe(ttft)
        queue = record.queue_time_s
        if queue is not None:
            self._queue_time.labels(*values).observe(queue)
        per_event = record.tokens_per_event
        if per_event is not None:
            self._tokens_per_event.labels(*values).observe(per_event)
        timings = record.backend_timings
        if timings is not None and timings.acceptance_length is not None:
            self._acceptance.labels(*values).observe(timings.acceptance_length)
        tpot = record.tpot_s
        if tpot is not None:
            self._tpot.labels(*values).observe(tpot)
        if record.gap_count:
            self._max_gap.labels(*values).observe(record.max_gap_s, exemplar)
        met = record.slo_met(self.slo_ttft_s, self.slo_tpot_s)
        self._slo.labels(*values, "met" if met else "missed").inc()

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
        self._stalls.labels(b.provider, b.address, cause).inc()
        self._stall_duration.labels(b.provider, b.address, cause).observe(record.duration_s)

    def prefill_done(self, record: PrefillRecord) -> None:
        """One finished prefill: streams it stalled (0 too) and its stutter cost."""
        values = self.request_label_values(record.labels)
        self._stalled_streams.labels(*values).observe(record.stalled_streams)
        self._stutter_cost.labels(*values).inc(record.stutter_cost_s)


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
            (self._chunk, chunk),
        ):
            if value is None:
                with contextlib.suppress(KeyError):  # not shown yet
                    gauge.remove(b.provider, b.address)
            else:
                gauge.labels(b.provider, b.address).set(value)
