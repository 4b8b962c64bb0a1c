"""The one place for metric names, units, buckets and attribute keys.

Every exporter, dashboard and rule takes its names from here (see docs/metrics.md).
The Prometheus name of an instrument is what the standard OpenTelemetry to
Prometheus translation gives: dots become underscores, unit ``s`` appends
``_seconds``, counters append ``_total``. Checked at import: buckets sorted
and strictly increasing, names unique.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """What an instrument is."""

    HISTOGRAM = "histogram"
    COUNTER = "counter"
    UPDOWN = "updowncounter"
    GAUGE = "gauge"


# Attribute keys (OpenTelemetry GenAI semantic conventions where they exist).
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
SERVER_ADDRESS = "server.address"
ERROR_TYPE = "error.type"
TOKEN_TYPE = "gen_ai.token.type"
PREFIX_CACHE = "tokenstamp.prefix_cache"
OUTCOME = "tokenstamp.outcome"
STATUS_CODE = "http.response.status_code"
STALL_CAUSE = "tokenstamp.stall.cause"
SLO = "tokenstamp.slo"
SLO_SOURCE = "tokenstamp.slo.source"
TENANT = "tokenstamp.tenant"
CULPRIT_TENANT = "tokenstamp.culprit.tenant"

#: Attributes on every request metric, in label order.
REQUEST_ATTRS: tuple[str, ...] = (OPERATION, PROVIDER, REQUEST_MODEL, SERVER_ADDRESS)
#: Attributes on backend-wide metrics (stalls, decoder errors).
BACKEND_ATTRS: tuple[str, ...] = (PROVIDER, SERVER_ADDRESS)

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
GAP_BUCKETS = (*TPOT_BUCKETS, 5.0, 10.0)
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
    20.48, 40.96, 81.92, 163.84,
)  # fmt: skip
TOKEN_BUCKETS = (
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
)  # fmt: skip
STALL_BUCKETS = (
    0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
TOKENS_PER_EVENT_BUCKETS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 16.0)
STALLED_STREAMS_BUCKETS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)


class HistogramAggregation(StrEnum):
    """How the OTLP histograms are bucketed (``--otlp-histograms``)."""

    EXPONENTIAL = "exponential"
    """Base-2 exponential buckets (OTLP ``ExponentialHistogram``; Prometheus native histograms)."""
    EXPLICIT = "explicit"
    """Each instrument's fixed bucket boundaries, ``Instrument.buckets`` (OTLP ``Histogram``)."""


#: Exponential histograms: most buckets per series (and sign). A percentile read from
#: a bucket is off by at most the bucket's width: scale 4 (16 buckets an octave, each
#: 4.4 % wide) keeps it within 5 %. 512 buckets hold scale 4 over 32 octaves, so a
#: series stays there even spread from 1 µs to an hour (a gap between two reads of one
#: burst, next to a long stall) or from 1 to 4e9 tokens; the usual narrower spread stays
#: finer (TTFT over 1 ms to 80 s: scale 5). The OpenTelemetry default, 160, drops to
#: scale 3 (9 %) past 10 octaves. Only the populated range is stored and sent.
EXPONENTIAL_MAX_SIZE = 512
#: Exponential histograms: the finest scale (buckets 0.27 % wide). Prometheus stores
#: native histograms up to schema 8, so nothing is lost or rescaled on the way in.
EXPONENTIAL_MAX_SCALE = 8


@dataclass(frozen=True, slots=True)
class Instrument:
    """One metric instrument of docs/metrics.md."""

    name: str
    """OpenTelemetry instrument name (dotted)."""
    kind: Kind
    """Histogram, counter or up-down counter."""
    unit: str
    """UCUM unit: ``s``, ``{token}``, ``{stream}``, ``{request}``..."""
    description: str
    """One line: what one observation is."""
    attrs: tuple[str, ...]
    """Attribute keys, in Prometheus label order."""
    buckets: tuple[float, ...] = ()
    """Explicit bucket boundaries (histograms only)."""

    @property
    def prom_name(self) -> str:
        """Prometheus family name as the OTel translation produces it (without ``_total``)."""
        base = self.name.replace(".", "_")
        if self.unit == "s":
            base += "_seconds"
        elif self.unit == "By":
            base += "_bytes"
        return base

    @property
    def prom_series(self) -> str:
        """Name of the exposed sample (``_total`` for counters)."""
        return self.prom_name + ("_total" if self.kind is Kind.COUNTER else "")

    @property
    def prom_labels(self) -> tuple[str, ...]:
        """Prometheus label names, translated from the attribute keys."""
        return tuple(label_name(a) for a in self.attrs)


def label_name(attr: str) -> str:
    """Prometheus label name of an attribute key (dots to underscores)."""
    return attr.replace(".", "_")


TTFT = Instrument(
    "gen_ai.server.time_to_first_token",
    Kind.HISTOGRAM,
    "s",
    "Time from the request's arrival at the proxy to its first output event (prefill); "
    "observed live, at that event.",
    REQUEST_ATTRS,
    TTFT_BUCKETS,
)
PREFIX_CACHE_TTFT = Instrument(
    "tokenstamp.prefix_cache.time_to_first_token",
    Kind.HISTOGRAM,
    "s",
    "The same time to first token by prefix-cache hit, observed when the request finishes "
    "(the hit is known only from the final usage).",
    (*REQUEST_ATTRS, PREFIX_CACHE),
    TTFT_BUCKETS,
)
TPOT = Instrument(
    "gen_ai.server.time_per_output_token",
    Kind.HISTOGRAM,
    "s",
    "Per finished request with >= 2 output tokens: (last - first token) / (tokens - 1) (decode).",
    REQUEST_ATTRS,
    TPOT_BUCKETS,
)
GAP = Instrument(
    "gen_ai.client.operation.time_per_output_chunk",
    Kind.HISTOGRAM,
    "s",
    "Every gap between two consecutive output events of a stream (inter-token latency).",
    REQUEST_ATTRS,
    GAP_BUCKETS,
)
DURATION = Instrument(
    "gen_ai.server.request.duration",
    Kind.HISTOGRAM,
    "s",
    "Per finished request, any outcome: end of response minus arrival.",
    (*REQUEST_ATTRS, ERROR_TYPE),
    DURATION_BUCKETS,
)
TOKEN_USAGE = Instrument(
    "gen_ai.client.token.usage",
    Kind.HISTOGRAM,
    "{token}",
    "Per finished request and token type: input or output tokens, where counts are known.",
    (*REQUEST_ATTRS, TOKEN_TYPE),
    TOKEN_BUCKETS,
)
MAX_GAP = Instrument(
    "tokenstamp.stream.max_gap",
    Kind.HISTOGRAM,
    "s",
    "Per finished stream with at least one gap: its worst inter-token gap.",
    REQUEST_ATTRS,
    GAP_BUCKETS,
)
QUEUE_TIME = Instrument(
    "tokenstamp.request.queue_time",
    Kind.HISTOGRAM,
    "s",
    "Observed TTFT minus the prefill time the backend reported (queueing and transport).",
    REQUEST_ATTRS,
    TTFT_BUCKETS,
)
TOKENS_PER_EVENT = Instrument(
    "tokenstamp.stream.tokens_per_event",
    Kind.HISTOGRAM,
    "{token}",
    "Per finished stream with a known completion-token count: completion tokens / output events.",
    REQUEST_ATTRS,
    TOKENS_PER_EVENT_BUCKETS,
)
ACCEPTANCE_LENGTH = Instrument(
    "tokenstamp.spec_decode.acceptance_length",
    Kind.HISTOGRAM,
    "{token}",
    "Per finished request whose backend reported speculative decoding: its mean tokens "
    "per verification step (bonus token included).",
    REQUEST_ATTRS,
    TOKENS_PER_EVENT_BUCKETS,
)
ANSWER_TTFT = Instrument(
    "tokenstamp.time_to_first_answer_token",
    Kind.HISTOGRAM,
    "s",
    "Time from the request's arrival to its first answer event (content, text or a tool call, "
    "not reasoning): the wait a user of a reasoning model feels; observed live, at that event.",
    REQUEST_ATTRS,
    TTFT_BUCKETS,
)
REASONING_DURATION = Instrument(
    "tokenstamp.reasoning.duration",
    Kind.HISTOGRAM,
    "s",
    "Per request with a reasoning event: first reasoning event to the first answer event (to "
    "the end when no answer came); observed at that answer event, or at the end.",
    REQUEST_ATTRS,
    TTFT_BUCKETS,
)
REASONING_TOKENS = Instrument(
    "tokenstamp.reasoning.tokens",
    Kind.HISTOGRAM,
    "{token}",
    "Per finished request with reasoning: reasoning tokens from usage "
    "(completion_tokens_details.reasoning_tokens) when reported, else reasoning events.",
    REQUEST_ATTRS,
    TOKEN_BUCKETS,
)
TOOL_CALL_TTF = Instrument(
    "tokenstamp.time_to_first_tool_call",
    Kind.HISTOGRAM,
    "s",
    "Time from the request's arrival to its first tool-call event (what a calling program "
    "waits for); observed live, at that event.",
    REQUEST_ATTRS,
    TTFT_BUCKETS,
)
STALL_DURATION = Instrument(
    "tokenstamp.stall.duration",
    Kind.HISTOGRAM,
    "s",
    "Per stall (a gap far above the stream's baseline), by cause.",
    (*BACKEND_ATTRS, STALL_CAUSE),
    STALL_BUCKETS,
)
STALLED_STREAMS = Instrument(
    "tokenstamp.prefill.stalled_streams",
    Kind.HISTOGRAM,
    "{stream}",
    "Per request whose prefill finished: how many other streams it stalled (0 when none).",
    REQUEST_ATTRS,
    STALLED_STREAMS_BUCKETS,
)
REQUESTS = Instrument(
    "tokenstamp.requests",
    Kind.COUNTER,
    "{request}",
    "Finished requests by outcome and HTTP status class.",
    (*REQUEST_ATTRS, OUTCOME, STATUS_CODE, ERROR_TYPE),
)
STALLS = Instrument(
    "tokenstamp.stalls",
    Kind.COUNTER,
    "{stall}",
    "Stalls by cause: prefill (a culprit was found) or unattributed.",
    (*BACKEND_ATTRS, STALL_CAUSE),
)
STUTTER_COST = Instrument(
    "tokenstamp.prefill.stutter_cost",
    Kind.COUNTER,
    "s",
    "User-seconds of frozen output caused by prefills: sum of (stall - baseline).",
    REQUEST_ATTRS,
)
SLO_REQUESTS = Instrument(
    "tokenstamp.requests.slo",
    Kind.COUNTER,
    "{request}",
    "Finished streamed requests by whether they met both the TTFT and the TPOT target: the "
    "request's own (x-slo-ttft-ms, x-slo-tpot-ms) or the proxy's defaults.",
    (*REQUEST_ATTRS, SLO, SLO_SOURCE),
)
DECODER_ERRORS = Instrument(
    "tokenstamp.decoder.errors",
    Kind.COUNTER,
    "{event}",
    "Upstream events that could not be decoded (skipped; the bytes still flowed).",
    (*BACKEND_ATTRS, ERROR_TYPE),
)
UNOBSERVED = Instrument(
    "tokenstamp.requests.unobserved",
    Kind.COUNTER,
    "{request}",
    "Requests on an observed route passed through without timing (body not JSON, unknown "
    "format, --observe false).",
    (*BACKEND_ATTRS, "tokenstamp.reason"),
)
TENANTS_OVERFLOW = Instrument(
    "tokenstamp.tenants.overflow",
    Kind.COUNTER,
    "{request}",
    "Requests whose tenant was folded into other (past --max-tenants, or not in --tenant-allow).",
    BACKEND_ATTRS,
)
STREAMS_ACTIVE = Instrument(
    "tokenstamp.streams.active",
    Kind.UPDOWN,
    "{stream}",
    "Observed requests in flight right now.",
    REQUEST_ATTRS,
)
# The request-body budget of the proxy (proxy/edge/budget.py), read at each collection.
BODY_HELD = Instrument(
    "tokenstamp.request_body.held",
    Kind.GAUGE,
    "By",
    "Request-body bytes the proxy holds right now across all connections (read, not yet sent "
    "upstream).",
    BACKEND_ATTRS,
)
BODY_BUDGET = Instrument(
    "tokenstamp.request_body.budget",
    Kind.GAUGE,
    "By",
    "The most request-body bytes the proxy holds at once (--body-budget); a body that does not "
    "fit is refused with 503.",
    BACKEND_ATTRS,
)
BODY_REFUSED = Instrument(
    "tokenstamp.request_body.refused",
    Kind.COUNTER,
    "{request}",
    "Requests refused with 503 and Retry-After because their body did not fit in the budget.",
    BACKEND_ATTRS,
)
# The chunk-size advisor's fitted cost model of each backend (gauges, absent until fitted).
PREFILL_RATE = Instrument(
    "tokenstamp.backend.prefill_rate",
    Kind.GAUGE,
    "{token/s}",  # an annotation: the Prometheus name gets no unit suffix (docs/metrics.md)
    "The advisor's fitted prefill throughput of the backend, uncached prompt tokens per second.",
    BACKEND_ATTRS,
)
DECODE_STEP_BASE = Instrument(
    "tokenstamp.backend.decode_step.base",
    Kind.GAUGE,
    "s",
    "The advisor's fitted decode step: its fixed cost (base + per_stream x decoding streams).",
    BACKEND_ATTRS,
)
DECODE_STEP_PER_STREAM = Instrument(
    "tokenstamp.backend.decode_step.per_stream",
    Kind.GAUGE,
    "s",
    "The advisor's fitted decode step: its extra cost per decoding stream.",
    BACKEND_ATTRS,
)
PREFILL_STEP = Instrument(
    "tokenstamp.backend.prefill_step",
    Kind.GAUGE,
    "s",
    "The advisor's fitted fixed cost of a step that carries prefill, besides its tokens "
    "(0 when the fit cannot tell it from 0).",
    BACKEND_ATTRS,
)
PREFILL_CHUNK = Instrument(
    "tokenstamp.backend.prefill_chunk",
    Kind.GAUGE,
    "{token}",
    "The chunk size the advisor finds in use, prompt tokens per step (0 when unchunked).",
    BACKEND_ATTRS,
)

ALL: tuple[Instrument, ...] = (
    TTFT,
    PREFIX_CACHE_TTFT,
    TPOT,
    GAP,
    DURATION,
    TOKEN_USAGE,
    MAX_GAP,
    QUEUE_TIME,
    TOKENS_PER_EVENT,
    ACCEPTANCE_LENGTH,
    ANSWER_TTFT,
    REASONING_DURATION,
    REASONING_TOKENS,
    TOOL_CALL_TTF,
    STALL_DURATION,
    STALLED_STREAMS,
    REQUESTS,
    STALLS,
    STUTTER_COST,
    SLO_REQUESTS,
    DECODER_ERRORS,
    UNOBSERVED,
    TENANTS_OVERFLOW,
    STREAMS_ACTIVE,
    BODY_HELD,
    BODY_BUDGET,
    BODY_REFUSED,
    PREFILL_RATE,
    DECODE_STEP_BASE,
    DECODE_STEP_PER_STREAM,
    PREFILL_STEP,
    PREFILL_CHUNK,
)


def tenant_attrs(inst: Instrument) -> tuple[str, ...]:
    """``inst``'s attributes when tenants are labelled (``--tenant-header``): the tenant
    right after the request attributes of a request metric; on the stall counter, the
    stalled stream's tenant and its (first) culprit's. Other instruments are unchanged."""
    n = len(REQUEST_ATTRS)
    if inst.attrs[:n] == REQUEST_ATTRS:
        return (*REQUEST_ATTRS, TENANT, *inst.attrs[n:])
    if inst.name == STALLS.name:
        return (*inst.attrs, TENANT, CULPRIT_TENANT)
    return inst.attrs


def prometheus_series_names() -> frozenset[str]:
    """Every series name Prometheus can hold of the proxy (with suffixes): a histogram's
    classic ``_bucket``, ``_sum``, ``_count`` and its native series, the bare name (scraped
    with native histograms on, or written from OTLP exponential histograms)."""
    out: set[str] = set()
    for inst in ALL:
        if inst.kind is Kind.HISTOGRAM:
            out.update(inst.prom_name + s for s in ("", "_bucket", "_sum", "_count"))
        elif inst.kind is Kind.COUNTER:
            out.update((inst.prom_name + "_total", inst.prom_name + "_created"))
        else:
            out.add(inst.prom_name)
    return frozenset(out)


def _check() -> None:
    seen: set[str] = set()
    for inst in ALL:
        if inst.prom_name in seen:
            raise RuntimeError(f"duplicate metric name {inst.prom_name}")
        seen.add(inst.prom_name)
        if inst.kind is Kind.HISTOGRAM:
            b = inst.buckets
            if not b or any(x >= y for x, y in itertools.pairwise(b)):
                raise RuntimeError(f"{inst.name}: buckets must be strictly increasing")
        elif inst.buckets:
            raise RuntimeError(f"{inst.name}: only histograms have buckets")


_check()
