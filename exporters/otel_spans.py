"""Spans of proxied requests: GenAI attributes, timing, first token, stalls and their culprits.

One span per observed request, kind SERVER, named ``{gen_ai.operation.name}
{gen_ai.request.model}``, started at arrival (so its context can go upstream)
with the attributes a sampler may use; the rest is set at the end, from the
``RequestRecord``. Nothing is done per token.

Stalls are decided after the fact (``proxy.core.backend_view``: a stall ``tol`` after its
end, a culprit's count up to ``max_delay`` after its first token), and span
links and events can only be added before ``end()``. So a finished stream's
span *lingers* for ``linger_ns`` (its end time is already fixed) before it is
ended and exported: stalls decided meanwhile still become events and links
(``Span.add_link``). A stall decided later than that is dropped from the span
(the metrics still count it). Culprit spans are found by request id among the
open and lingering spans, then in a bounded map of recently ended ones.

Work on unsampled spans stops at ``is_recording()``. Span-only attribute keys
live here; the shared ones come from ``exporters.names``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any, ClassVar

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext, SpanKind, StatusCode, TracerProvider

from exporters import names
from exporters.otel_content import input_messages
from proxy import __version__
from proxy.core.records import (
    BackendTimings,
    Outcome,
    PrefillRecord,
    RequestLabels,
    RequestRecord,
    StallRecord,
)

TRACER_NAME = "tokenstamp"
"""Instrumentation scope of the spans."""

# GenAI semantic-convention keys used on spans only.
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
"""The GenAI conventions' reasoning share of the output tokens (the usage count when the
backend reported one, else reasoning events)."""
CHOICES = "tokenstamp.stream.choices"
"""Choices streamed apart (n > 1), when there were several."""
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
#: Request body field -> ``gen_ai.request.*`` attribute.
REQUEST_PARAMS: Mapping[str, str] = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
    "n": "gen_ai.request.choice.count",
    "stop": "gen_ai.request.stop_sequences",
}
# tokenstamp keys (seconds unless noted).
REQUEST_ID = "tokenstamp.request.id"
TTFT = "tokenstamp.time_to_first_token"
UPSTREAM_TTFT = "tokenstamp.upstream.time_to_first_token"
TPOT = "tokenstamp.time_per_output_token"
ANSWER_TTFT = "tokenstamp.time_to_first_answer_token"
REASONING_DURATION = "tokenstamp.reasoning.duration"
REASONING_EVENTS = "tokenstamp.reasoning.events"
TOOL_CALL_TTFT = "tokenstamp.time_to_first_tool_call"
MAX_GAP = "tokenstamp.stream.max_gap"
GAPS = "tokenstamp.stream.gaps"
"""Inter-token gaps of the stream (count)."""
STALLS = "tokenstamp.stream.stalls"
"""Stalls of the stream known when its span ended (count)."""
OUTPUT_EVENTS = "tokenstamp.stream.output_events"
TOKENS_PER_EVENT = "tokenstamp.stream.tokens_per_event"
"""Completion tokens / output events (tokens)."""
QUEUE_TIME = "tokenstamp.request.queue_time"
"""Observed TTFT minus the backend's reported prefill."""
# The backend's own timings of the request (``BackendTimings``), seconds on its clock.
BACKEND_PREFILL = "tokenstamp.backend.prefill_time"
BACKEND_DECODE = "tokenstamp.backend.decode_time"
BACKEND_PER_TOKEN = "tokenstamp.backend.time_per_output_token"
BACKEND_LOAD = "tokenstamp.backend.load_time"
BACKEND_TOTAL = "tokenstamp.backend.request_duration"
BACKEND_QUEUE = "tokenstamp.backend.queue_time"
ACCEPTANCE_LENGTH = "tokenstamp.spec_decode.acceptance_length"
"""Mean tokens per speculative verification step the backend reported (tokens)."""
STALL_DURATION = "tokenstamp.stall.duration"
STALL_BASELINE = "tokenstamp.stall.baseline"
STALL_CULPRITS = "tokenstamp.stall.culprits"
"""Request ids of a stall's culprits."""
STALLED_STREAMS = "tokenstamp.prefill.stalled_streams"
PREFILL_STALLS = "tokenstamp.prefill.stalls"
STUTTER_COST = "tokenstamp.prefill.stutter_cost"
LINK_KIND = "tokenstamp.link"
"""On a link: ``stall_culprit``."""
# Event names.
FIRST_TOKEN_EVENT = "tokenstamp.first_token"
FIRST_ANSWER_EVENT = "tokenstamp.first_answer_token"
FIRST_TOOL_CALL_EVENT = "tokenstamp.first_tool_call"
STALL_EVENT = "tokenstamp.stall"
STUTTER_EVENT = "tokenstamp.prefill.stutter"

MAX_STALL_EVENTS = 32
"""Stall events (and culprit links) kept per span; the count attribute has them all."""
MAX_RECENT = 4096
"""Ended spans whose context is kept for culprit links."""
MAX_OPEN = 65536
"""Open spans indexed by request id (beyond: the oldest lose their stall events)."""
MAX_NAME_CHARS = 128
"""Longest model name put into a span name."""


class RequestSpan:
    """One request's span and what the stall view adds to it before it ends."""

    __slots__ = ("arrival_ns", "culprits", "deadline_ns", "end_unix_ns", "request_id", "span",
                 "stalls", "start_unix_ns")  # fmt: skip

    def __init__(self, request_id: str, span: Span, arrival_ns: int, start_unix_ns: int) -> None:
        self.request_id = request_id
        """The proxy's request id (the key stall records use)."""
        self.span = span
        """The OpenTelemetry span (non-recording when not sampled)."""
        self.arrival_ns = arrival_ns
        """``t0`` (monotonic), to place later stamps on the wall clock."""
        self.start_unix_ns = start_unix_ns
        """Wall-clock arrival: the span's start."""
        self.end_unix_ns: int | None = None
        """Wall-clock end, fixed when the request finished."""
        self.deadline_ns = 0
        """Monotonic time after which a lingering span is ended."""
        self.stalls = 0
        """Stalls of this stream reported so far."""
        self.culprits: set[str] = set()
        """Culprits already linked."""

    def wall_ns(self, stamp_ns: int) -> int:
        """A monotonic stamp of this request on the wall clock."""
        return self.start_unix_ns + (stamp_ns - self.arrival_ns)

    @property
    def trace_id(self) -> str:
        """32 hex digits when the span is sampled, else empty (no exemplar for it)."""
        ctx = self.span.get_span_context()
        return format(ctx.trace_id, "032x") if ctx.trace_flags.sampled else ""


def request_attributes(body: Mapping[str, object]) -> dict[str, Any]:
    """``gen_ai.request.*`` parameters present in a request body."""
    out: dict[str, Any] = {}
    for key, attr in REQUEST_PARAMS.items():
        value = body.get(key)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int | float):
            out[attr] = value
        elif key == "stop" and isinstance(value, str):
            out[attr] = (value,)
        elif key == "stop" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            out[attr] = tuple(value)
    return out


def finish_attributes(record: RequestRecord) -> dict[str, Any]:
    """Attributes known at the end of a request: response, usage, timing, outcome."""
    out: dict[str, Any] = {
        names.OUTCOME: record.outcome.value,
        OUTPUT_EVENTS: record.output_events,
    }
    if record.status_code:
        out[names.STATUS_CODE] = record.status_code
    if record.error_type:
        out[names.ERROR_TYPE] = record.error_type
    if record.response_id:
        out[RESPONSE_ID] = record.response_id
    if record.response_model:
        out[RESPONSE_MODEL] = record.response_model
    if record.finish_reasons:
        out[FINISH_REASONS] = record.finish_reasons
    if record.prompt_tokens is not None:
        out[INPUT_TOKENS] = record.prompt_tokens
    if record.completion_tokens is not None:
        out[OUTPUT_TOKENS] = record.completion_tokens
    if record.cached_tokens is not None:
        out[CACHE_READ_TOKENS] = record.cached_tokens
        out[names.PREFIX_CACHE] = record.prefix_cache
    ttft = record.ttft_s
    if ttft is not None and record.streamed:
        out[TIME_TO_FIRST_CHUNK] = ttft
        out[TTFT] = ttft
        upstream = record.upstream_ttft_s
        if upstream is not None:
            out[UPSTREAM_TTFT] = upstream
    tpot = record.tpot_s
    if tpot is not None and record.streamed:
        out[TPOT] = tpot
    if record.streamed:
        out.update(phase_attributes(record))
    if record.streamed:
        out[GAPS] = record.gap_count
        out[MAX_GAP] = record.max_gap_s
    per_event = record.tokens_per_event
    if per_event is not None:
        out[TOKENS_PER_EVENT] = per_event
    timings = record.backend_timings
    if timings is not None:
        out.update(backend_attributes(timings))
        queue = record.queue_time_s
        if queue is not None:
            out[QUEUE_TIME] = queue
    return out


def phase_attributes(record: RequestRecord) -> dict[str, Any]:
    """A streamed request's reasoning and answer figures, the ones it has."""
    out: dict[str, Any] = {}
    pairs = (
        (ANSWER_TTFT, record.answer_ttft_s),
        (REASONING_DURATION, record.reasoning_s),
        (TOOL_CALL_TTFT, record.tool_call_ttft_s),
        (REASONING_TOKENS, record.reasoning_tokens),
    )
    for key, value in pairs:
        if value is not None:
            out[key] = value
    if record.reasoning_events:
        out[REASONING_EVENTS] = record.reasoning_events
    if record.choices:
        out[CHOICES] = len(record.choices)
    return out


def backend_attributes(timings: BackendTimings) -> dict[str, Any]:
    """The backend's own timings of a request, the ones it reported."""
    pairs = (
        (BACKEND_PREFILL, timings.prefill_s),
        (BACKEND_DECODE, timings.decode_s),
        (BACKEND_PER_TOKEN, timings.per_token_s),
        (BACKEND_LOAD, timings.load_s),
        (BACKEND_TOTAL, timings.total_s),
        (BACKEND_QUEUE, timings.queue_s),
        (ACCEPTANCE_LENGTH, timings.acceptance_length),
    )
    return {key: value for key, value in pairs if value is not None}


class SpanRecorder:
    """Starts, completes and ends request spans; a subscriber of the fan-out for stall
    and prefill records (its spans start and end through ``start`` and ``finish``)."""

    takes: ClassVar[tuple[str, ...]] = ("stall", "prefill_done")
    """The ``Sink`` events it takes: the backend view's records, nothing per token."""

    def __init__(
        self,
        tracer_provider: TracerProvider,
        *,
        linger_s: float = 0.0,
        capture_content: bool = False,
    ) -> None:
        self.tracer = tracer_provider.get_tracer(TRACER_NAME, __version__)
        """Where spans come from."""
        self.linger_ns = round(linger_s * 1e9)
        """How long a finished stream's span waits for late stall records."""
        self.capture_content = capture_content
        """Record prompt and completion text."""
        self._open: dict[str, RequestSpan] = {}  # recording spans not yet ended
        self._lingering: deque[RequestSpan] = deque()
        self._recent: OrderedDict[str, SpanContext] = OrderedDict()

    def start(
        self,
        request_id: str,
        labels: RequestLabels,
        *,
        request_model: str,
        arrival_ns: int,
        start_unix_ns: int,
        parent: Context | None = None,
        body: Mapping[str, object] | None = None,
    ) -> RequestSpan:
        """Start the span of a request that arrived at ``start_unix_ns``."""
        attrs: dict[str, Any] = {
            names.OPERATION: labels.operation,
            names.PROVIDER: labels.backend.provider,
            names.SERVER_ADDRESS: labels.backend.address,
        }
        if labels.tenant:
            attrs[names.TENANT] = labels.tenant
        name = labels.operation
        if request_model:
            attrs[names.REQUEST_MODEL] = request_model
            name = f"{name} {request_model[:MAX_NAME_CHARS]}"
        span = self.tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=attrs, start_time=start_unix_ns
        )
        rs = RequestSpan(request_id, span, arrival_ns, start_unix_ns)
        if span.is_recording():
            span.set_attribute(REQUEST_ID, request_id)
            if body is not None:
                span.set_attributes(request_attributes(body))
                if self.capture_content:
                    text = input_messages(body)
                    if text is not None:
                        span.set_attribute(INPUT_MESSAGES, text)
            self._open[request_id] = rs
            if len(self._open) > MAX_OPEN:
                del self._open[next(iter(self._open))]
        return rs

    def finish(self, rs: RequestSpan, record: RequestRecord, output: str | None = None) -> None:
        """The request ended: set what it measured; end the span now or after lingering."""
        span = rs.span
        if not span.is_recording():
            return
        span.set_attributes(finish_attributes(record))
        if record.first_token_ns is not None and record.streamed:
            ttft = record.ttft_s
            span.add_event(
                FIRST_TOKEN_EVENT, {TTFT: ttft or 0.0}, timestamp=rs.wall_ns(record.first_token_ns)
            )
            for name, key, stamp, value in (
                (FIRST_ANSWER_EVENT, ANSWER_TTFT, record.first_answer_ns, record.answer_ttft_s),
                (FIRST_TOOL_CALL_EVENT, TOOL_CALL_TTFT, record.first_tool_call_ns,
                 record.tool_call_ttft_s),
            ):  # fmt: skip
                # The first answer gets an event of its own only after reasoning (else it is
                # the first token's, at the same stamp); a tool call always does.
                later = stamp != record.first_token_ns or name == FIRST_TOOL_CALL_EVENT
                if stamp is not None and value is not None and later:
                    span.add_event(name, {key: value}, timestamp=rs.wall_ns(stamp))
        if output is not None:
            span.set_attribute(OUTPUT_MESSAGES, output)
        if record.outcome is not Outcome.OK or record.status_code >= 500:
            span.set_status(StatusCode.ERROR, record.error_type or record.outcome.value)
        rs.end_unix_ns = rs.wall_ns(record.end_ns)
        if self.linger_ns and record.streamed:
            rs.deadline_ns = record.end_ns + self.linger_ns
            self._lingering.append(rs)
        else:
            self._end(rs)
        self.sweep(record.end_ns)

    def _end(self, rs: RequestSpan) -> None:
        span = rs.span
        if rs.stalls:
            span.set_attribute(STALLS, rs.stalls)
        span.end(end_time=rs.end_unix_ns)
        request_id = rs.request_id
        if self._open.get(request_id) is rs:
            del self._open[request_id]
        self._recent[request_id] = span.get_span_context()
        if len(self._recent) > MAX_RECENT:
            self._recent.popitem(last=False)

    def sweep(self, now_ns: int) -> None:
        """End the lingering spans whose time is up (monotonic ``now_ns``)."""
        lingering = self._lingering
        while lingering and lingering[0].deadline_ns <= now_ns:
            self._end(lingering.popleft())

    def close(self) -> None:
        """End every lingering span now (before the provider shuts down)."""
        while self._lingering:
            self._end(self._lingering.popleft())

    def _context_of(self, request_id: str) -> SpanContext | None:
        rs = self._open.get(request_id)
        return rs.span.get_span_context() if rs is not None else self._recent.get(request_id)

    # -- subscriber: the backend view's records -------------------------------------------

    def stall(self, record: StallRecord) -> None:
        """A stall of an open or lingering stream: an event, and links to its culprits."""
        rs = self._open.get(record.request_id)
        if rs is None:
            return
        rs.stalls += 1
        if rs.stalls > MAX_STALL_EVENTS:
            return
        span = rs.span
        span.add_event(
            STALL_EVENT,
            {
                STALL_DURATION: record.duration_s,
                STALL_BASELINE: record.baseline_ns / 1e9,
                names.STALL_CAUSE: record.cause.value,
                STALL_CULPRITS: record.culprits,
                **({names.CULPRIT_TENANT: record.culprit_tenant} if record.culprit_tenant else {}),
            },
            timestamp=rs.wall_ns(record.end_ns),
        )
        for culprit in record.culprits:
            if culprit in rs.culprits or culprit == record.request_id:
                continue
            ctx = self._context_of(culprit)
            if ctx is not None and len(rs.culprits) < MAX_STALL_EVENTS:
                rs.culprits.add(culprit)
                span.add_link(ctx, {LINK_KIND: "stall_culprit"})

    def prefill_done(self, record: PrefillRecord) -> None:
        """A culprit's prefill is final: how many streams it stalled, on its span."""
        rs = self._open.get(record.request_id)
        if rs is None or not record.stalled_streams:
            return
        attrs = {
            STALLED_STREAMS: record.stalled_streams,
            PREFILL_STALLS: record.stalls,
            STUTTER_COST: record.stutter_cost_s,
        }
        rs.span.set_attributes(attrs)
        rs.span.add_event(STUTTER_EVENT, attrs, timestamp=rs.wall_ns(record.first_token_ns))
