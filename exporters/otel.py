"""OpenTelemetry metrics exporter: the docs/metrics.md instruments on an injected ``MeterProvider``.

The same instruments as ``exporters.prometheus``, with the same names, units,
bucket boundaries (explicit-bucket advice from ``exporters.names``) and
attributes, so an OTLP-to-Prometheus pipeline yields the series a scrape of
``/metrics`` yields. Attribute values are the Prometheus label values,
empty ones included (Prometheus treats an empty label as absent), so the two
paths agree series for series.

Only the OpenTelemetry API is used here: the provider (SDK, readers, OTLP
exporters) is built and owned by ``exporters.otel_setup``, or injected by a
test. The attribute dicts of a request label set are built once and kept in
one object, so a request's end builds none. The
inter-token gap, the one observation per token, goes to ``GapHistograms``
(about 1 µs) when the provider's reader bridges it (``exporters.otel_gaps``),
else to the SDK histogram (about 14 µs).
"""

from __future__ import annotations

from typing import ClassVar

from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider, UpDownCounter

from exporters import names
from exporters.otel_gaps import GapHistograms
from exporters.prometheus import request_label_values, stall_tenants, status_class
from proxy import __version__
from proxy.core.records import (
    EVENTS,
    Backend,
    Phase,
    PrefillRecord,
    RequestLabels,
    RequestRecord,
    StallRecord,
)

METER_NAME = "tokenstamp"
"""Instrumentation scope of every tokenstamp instrument."""

Attributes = dict[str, str]


def histogram(meter: Meter, inst: names.Instrument) -> Histogram:
    """The OpenTelemetry histogram of a docs/metrics.md instrument, with its bucket boundaries."""
    assert inst.kind is names.Kind.HISTOGRAM, inst.name
    return meter.create_histogram(
        inst.name,
        unit=inst.unit,
        description=inst.description,
        explicit_bucket_boundaries_advisory=inst.buckets,
    )


def counter(meter: Meter, inst: names.Instrument) -> Counter:
    """The OpenTelemetry counter of a docs/metrics.md instrument."""
    assert inst.kind is names.Kind.COUNTER, inst.name
    return meter.create_counter(inst.name, unit=inst.unit, description=inst.description)


def updown(meter: Meter, inst: names.Instrument) -> UpDownCounter:
    """The OpenTelemetry up-down counter of a docs/metrics.md instrument."""
    assert inst.kind is names.Kind.UPDOWN, inst.name
    return meter.create_up_down_counter(inst.name, unit=inst.unit, description=inst.description)


def attributes(inst: names.Instrument, *values: str, tenants: bool = False) -> Attributes:
    """``inst``'s attributes with ``values`` in its label order (one value per key);
    ``tenants``: its attributes with the tenant ones (``names.tenant_attrs``)."""
    keys = names.tenant_attrs(inst) if tenants else inst.attrs
    return dict(zip(keys, values, strict=True))


def _by_extra(
    cache: dict[object, Attributes],
    key: object,
    inst: names.Instrument,
    values: tuple[str, ...],
    tenants: bool,
    *extra: str,
) -> Attributes:
    """``inst``'s attributes of ``values`` + ``extra`` (kept in ``cache`` by ``key``)."""
    attrs = cache.get(key)
    if attrs is None:
        attrs = cache[key] = attributes(inst, *values, *extra, tenants=tenants)
    return attrs


class _RequestAttributes:
    """The attribute dicts of one request label set, each built once: none per request."""

    __slots__ = ("base", "cache_ttft", "duration", "requests", "slo", "tokens_in", "tokens_out",
                 "values")  # fmt: skip

    def __init__(self, values: tuple[str, ...], tenants: bool) -> None:
        self.values = values
        """Values of the request labels in order (``request_label_values``)."""
        self.base = attributes(names.STREAMS_ACTIVE, *values, tenants=tenants)
        """The request attributes alone."""
        self.tokens_in = attributes(names.TOKEN_USAGE, *values, "input", tenants=tenants)
        self.tokens_out = attributes(names.TOKEN_USAGE, *values, "output", tenants=tenants)
        self.duration: dict[object, Attributes] = {}
        """By error type."""
        self.cache_ttft: dict[object, Attributes] = {}
        """By prefix-cache state."""
        self.requests: dict[object, Attributes] = {}
        """By (outcome, status code, error type)."""
        self.slo: dict[object, Attributes] = {}
        """By (met, source)."""


class OtelMetricsSink:
    """A fan-out subscriber recording docs/metrics.md's instruments over OpenTelemetry."""

    takes: ClassVar[tuple[str, ...]] = EVENTS
    """Every event of the ``Sink`` (a subscriber of the fan-out)."""

    def __init__(
        self,
        meter_provider: MeterProvider,
        *,
        slo_ttft_s: float = float("inf"),
        slo_tpot_s: float = float("inf"),
        slo_answer_ttft_s: float | None = None,
        gaps: GapHistograms | None = None,
        tenants: bool = False,
    ) -> None:
        """Instruments on ``meter_provider``; gaps into ``gaps`` when its reader bridges them;
        ``tenants``: the tenant attributes on request metrics and stalls (``--tenant-header``)."""
        meter = meter_provider.get_meter(METER_NAME, __version__)
        self.tenants = tenants
        """Request metrics and the stall counter carry the tenant attributes."""
        self._gaps = gaps
        if gaps is not None:
            gaps.tenants = tenants
        self.slo_ttft_s = slo_ttft_s
        """TTFT target for ``tokenstamp.requests.slo``."""
        self.slo_tpot_s = slo_tpot_s
        """TPOT target for ``tokenstamp.requests.slo``."""
        self.slo_answer_ttft_s = slo_answer_ttft_s
        """Time-to-first-answer target for ``tokenstamp.requests.slo`` (``None``: off)."""
        self._ttft = histogram(meter, names.TTFT)
        self._cache_ttft = histogram(meter, names.PREFIX_CACHE_TTFT)
        self._queue_time = histogram(meter, names.QUEUE_TIME)
        self._tokens_per_event = histogram(meter, names.TOKENS_PER_EVENT)
        self._acceptance = histogram(meter, names.ACCEPTANCE_LENGTH)
        self._reasoning_tokens = histogram(meter, names.REASONING_TOKENS)
        self._phases = {
            Phase.ANSWER: histogram(meter, names.ANSWER_TTFT),
            Phase.REASONING: histogram(meter, names.REASONING_DURATION),
            Phase.TOOL_CALL: histogram(meter, names.TOOL_CALL_TTF),
        }
        self._tpot = histogram(meter, names.TPOT)
        self._gap = histogram(meter, names.GAP)
        self._duration = histogram(meter, names.DURATION)
        self._tokens = histogram(meter, names.TOKEN_USAGE)
        self._max_gap = histogram(meter, names.MAX_GAP)
        self._requests = counter(meter, names.REQUESTS)
        self._slo = counter(meter, names.SLO_REQUESTS)
        self._decoder_errors = counter(meter, names.DECODER_ERRORS)
        self._unobserved = counter(meter, names.UNOBSERVED)
        self._active = updown(meter, names.STREAMS_ACTIVE)
        self._stall_duration = histogram(meter, names.STALL_DURATION)
        self._stalled_streams = histogram(meter, names.STALLED_STREAMS)
        self._stalls = counter(meter, names.STALLS)
        self._stutter_cost = counter(meter, names.STUTTER_COST)
        self._request_attrs: dict[RequestLabels, _RequestAttributes] = {}

    def _for(self, labels: RequestLabels) -> _RequestAttributes:
        """The attributes of ``labels`` (cached; labels are bounded by the proxy)."""
        attrs = self._request_attrs.get(labels)
        if attrs is None:
            values = request_label_values(labels, self.tenants)
            attrs = self._request_attrs[labels] = _RequestAttributes(values, self.tenants)
        return attrs

    def _attrs(self, labels: RequestLabels) -> Attributes:
        """The request attributes of ``labels``."""
        return self._for(labels).base

    def request_started(self, labels: RequestLabels) -> None:
        """Active streams up."""
        self._active.add(1, self._attrs(labels))

    def first_token(
        self,
        labels: RequestLabels,
        ttft_s: float,
        upstream_ttft_s: float | None,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """The live TTFT."""
        self._ttft.record(ttft_s, self._attrs(labels))

    def phase(
        self,
        labels: RequestLabels,
        phase: Phase,
        seconds: float,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """A phase closed live: time to first answer or tool call, or reasoning's duration."""
        self._phases[phase].record(seconds, self._attrs(labels))

    def gap(self, labels: RequestLabels, gap_s: float, request_id: str, trace_id: str = "") -> None:
        """One inter-token gap."""
        gaps = self._gaps
        if gaps is not None:
            gaps.observe(labels, gap_s)
        else:
            self._gap.record(gap_s, self._attrs(labels))

    def request_finished(self, record: RequestRecord) -> None:
        """Everything observed once per request (as ``PrometheusSink.request_finished``)."""
        ra = self._for(record.labels)
        base = ra.base
        self._active.add(-1, base)
        t = self.tenants
        values = ra.values
        err = record.error_type
        duration = _by_extra(ra.duration, err, names.DURATION, values, t, err)
        self._duration.record(record.duration_s, duration)
        outcome, code = record.outcome, record.status_code
        requests = ra.requests.get((outcome, code, err))
        if requests is None:
            requests = ra.requests[outcome, code, err] = attributes(
                names.REQUESTS, *values, outcome.value, status_class(code), err, tenants=t
            )
        self._requests.add(1, requests)
        if record.prompt_tokens is not None:
            self._tokens.record(record.prompt_tokens, ra.tokens_in)
        if record.completion_tokens is not None:
            self._tokens.record(record.completion_tokens, ra.tokens_out)
        if not record.streamed:
            return
        ttft = record.ttft_s
        if ttft is not None:
            prefix = record.prefix_cache
            cache = _by_extra(ra.cache_ttft, prefix, names.PREFIX_CACHE_TTFT, values, t, prefix)
            self._cache_ttft.record(ttft, cache)
        queue = record.queue_time_s
        if queue is not None:
            self._queue_time.record(queue, base)
        per_event = record.tokens_per_event
        if per_event is not None:
            self._tokens_per_event.record(per_event, base)
        timings = record.backend_timings
        if timings is not None and timings.acceptance_length is not None:
            self._acceptance.record(timings.acceptance_length, base)
        reasoning = record.reasoning_tokens
        if reasoning is not None:
            self._reasoning_tokens.record(reasoning, base)
        for tpot in record.stream_tpots_s:
            self._tpot.record(tpot, base)
        for gap in record.stream_max_gaps_s:
            self._max_gap.record(gap, base)
        met, source = record.slo_judged(self.slo_ttft_s, self.slo_tpot_s, self.slo_answer_ttft_s)
        verdict = "met" if met else "missed"
        slo = _by_extra(ra.slo, (met, source), names.SLO_REQUESTS, values, t, verdict, source.value)
        self._slo.add(1, slo)

    def decoder_error(self, backend: Backend, kind: str) -> None:
        """One undecodable upstream event."""
        self._decoder_errors.add(
            1, attributes(names.DECODER_ERRORS, backend.provider, backend.address, kind)
        )

    def unobserved(self, backend: Backend, reason: str) -> None:
        """One request passed through without timing."""
        self._unobserved.add(
            1, attributes(names.UNOBSERVED, backend.provider, backend.address, reason)
        )

    def stall(self, record: StallRecord) -> None:
        """One stall: counted and its duration recorded, by cause."""
        b = record.backend
        attrs = attributes(names.STALLS, b.provider, b.address, record.cause.value)
        if self.tenants:
            by_tenant = attributes(names.STALLS, b.provider, b.address, record.cause.value,
                                   *stall_tenants(record), tenants=True)  # fmt: skip
            self._stalls.add(1, by_tenant)
        else:
            self._stalls.add(1, attrs)
        self._stall_duration.record(record.duration_s, attrs)

    def prefill_done(self, record: PrefillRecord) -> None:
        """One finished prefill: streams it stalled (0 too) and its stutter cost."""
        attrs = self._attrs(record.labels)
        self._stalled_streams.record(record.stalled_streams, attrs)
        self._stutter_cost.add(record.stutter_cost_s, attrs)
