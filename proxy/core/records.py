"""Record types of the timing core and the sink interface exporters implement.

Pure: no framework imports. Times are ``*_ns`` on the monotonic clock unless
named ``*_unix_ns`` (wall clock, only for span start and end).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import NamedTuple, Protocol


class Outcome(StrEnum):
    """How a proxied request ended."""

    OK = "ok"
    CLIENT_DISCONNECT = "client_disconnect"
    UPSTREAM_ERROR = "upstream_error"
    TIMEOUT = "timeout"
    REJECTED = "rejected"


class Operation(StrEnum):
    """``gen_ai.operation.name`` values the proxy observes."""

    CHAT = "chat"
    TEXT_COMPLETION = "text_completion"


class Backend(NamedTuple):
    """One upstream, as named in metrics (a named tuple: cheap to hash as a dict key)."""

    provider: str
    """``gen_ai.provider.name`` (configured)."""
    address: str
    """``server.address``: the backend's configured name."""


class RequestLabels(NamedTuple):
    """The bounded label set of one observed request; computed once, at arrival.

    A named tuple: exporters key their per-label-set state on it for every
    token, and a tuple hashes far faster than a frozen dataclass.
    """

    operation: str
    """``gen_ai.operation.name``."""
    model: str
    """``gen_ai.request.model`` after the cardinality bound (may be ``other``)."""
    backend: Backend
    """The upstream it went to."""
    tenant: str = ""
    """``tokenstamp.tenant`` after the cardinality bound; empty when tenants are not
    labelled (no ``--tenant-header``)."""


class Phase(StrEnum):
    """Which phase of a request a live observation closes (``Sink.phase``)."""

    ANSWER = "answer"
    """The first answer event arrived: seconds since arrival (``t_answer - t0``)."""
    REASONING = "reasoning"
    """Reasoning ended: seconds from the first reasoning event to the first answer event
    (or to the end of a request that only reasoned)."""
    TOOL_CALL = "tool_call"
    """The first tool-call event arrived: seconds since arrival."""


class EventKind(IntEnum):
    """What one output event is (``docs/formats.md``): both kinds are output events."""

    ANSWER = 0
    """Content, text, a tool-call delta: what the user or the calling program reads."""
    REASONING = 1
    """``reasoning_content``, ``reasoning``, thinking: decoded but not the answer."""
    TOOL_CALL = 2
    """A tool-call delta (an answer event that is also the first act of an agent)."""


CHOICE_SEP = " choice "
"""Between a request id and a choice index in the stream id of a further choice (request ids
hold no space, so the split is unambiguous)."""


def choice_stream_id(request_id: str, choice: int) -> str:
    """The stream id, for the stall view, of choice ``choice`` > 0 of a request (``n > 1``):
    each choice is a stream of its own. Choice 0 is the request id itself."""
    return f"{request_id}{CHOICE_SEP}{choice}"


def split_stream_id(stream_id: str) -> tuple[str, int]:
    """``(request id, choice)`` of a stream id (``choice_stream_id``); choice 0 for a plain id."""
    request_id, sep, choice = stream_id.partition(CHOICE_SEP)
    if sep and choice.isdigit():
        return request_id, int(choice)
    return stream_id, 0


class ChoiceStats(NamedTuple):
    """One choice of a request with several (``n > 1``): its own stream of output events."""

    choice: int
    """The choice's ``index``."""
    first_ns: int
    """Its first output event."""
    last_ns: int
    """Its last output event."""
    events: int
    """Its output events."""
    gap_count: int
    """Its gaps (``events - 1``)."""
    max_gap_ns: int
    """Its worst gap (0 without gaps)."""

    @property
    def tpot_s(self) -> float | None:
        """``(last - first) / (events - 1)``; ``None`` below two events (per-choice token
        counts are not reported, so events stand for tokens)."""
        if self.events < 2:
            return None
        return (self.last_ns - self.first_ns) / 1e9 / (self.events - 1)


class SloSource(StrEnum):
    """``tokenstamp.slo.source``: whose targets a request was judged against."""

    REQUEST = "request"
    """Its own (``x-slo-ttft-ms``, ``x-slo-tpot-ms``: a gateway's promise)."""
    DEFAULT = "default"
    """The proxy's (``--slo-ttft``, ``--slo-tpot``)."""


@dataclass(frozen=True, slots=True)
class BackendTimings:
    """What the backend measured itself about one request; durations in seconds, its own clock."""

    prefill_s: float | None = None
    """Prompt processing (llama.cpp ``prompt_ms``, Ollama ``prompt_eval_duration``, vLLM
    ``metrics.time_to_first_token_ms``: scheduled to first token, SGLang
    ``prefill_finished_time - forward_entry_time``)."""
    decode_s: float | None = None
    """Token generation (llama.cpp ``predicted_ms``, Ollama ``eval_duration``, vLLM
    ``metrics.generation_time_ms``)."""
    per_token_s: float | None = None
    """Generation time per output token (llama.cpp ``predicted_per_token_ms``, vLLM
    ``metrics.mean_itl_ms``)."""
    load_s: float | None = None
    """Model loading before the prompt was processed (Ollama ``load_duration``)."""
    total_s: float | None = None
    """The backend's own end-to-end time (Ollama ``total_duration``, SGLang ``e2e_latency``)."""
    queue_s: float | None = None
    """Time the engine kept the request waiting before it was scheduled (vLLM
    ``metrics.queue_time_ms``, SGLang ``queue_time``)."""
    acceptance_length: float | None = None
    """Speculative decoding: mean tokens emitted per verification step, bonus token included
    (vLLM ``metrics.speculative_decoding.mean_acceptance_length``, SGLang
    ``completion_tokens / spec_verify_ct``); >= 1."""


def queue_time_s(ttft_s: float | None, timings: BackendTimings | None) -> float | None:
    """Observed TTFT minus the backend's prefill (and model load): queueing and transport.

    ``None`` when either is unknown. Clamped at 0: the backend's clock and ours
    differ by a little, and the proxy's window always encloses the backend's.
    """
    if ttft_s is None or timings is None or timings.prefill_s is None:
        return None
    return max(0.0, ttft_s - timings.prefill_s - (timings.load_s or 0.0))


class RequestRecord(NamedTuple):
    """Everything measured about one finished request.

    A named tuple, not a frozen dataclass (as the other records are): made once per
    request, and a frozen dataclass sets each of its 35 fields through
    ``object.__setattr__``, ten times the cost of building the tuple (about 42,000
    instructions a request; ``scripts/request_cost.py``). Immutable all the same.
    """

    request_id: str
    """The proxy's id for the request (logs and spans only, never a label)."""
    labels: RequestLabels
    """Bounded labels."""
    streamed: bool
    """The response was a token stream (SSE) that was timed."""
    outcome: Outcome
    """How it ended."""
    status_code: int
    """HTTP status sent to the client (0 when none was sent)."""
    error_type: str
    """Low-cardinality failure class, empty on success."""
    arrival_ns: int
    """``t0``: request head and body read."""
    forwarded_ns: int | None
    """``tf``: request sent upstream."""
    first_token_ns: int | None
    """``t1``: first output event received."""
    last_token_ns: int | None
    """Last output event received."""
    end_ns: int
    """End of the response (or of the attempt)."""
    start_unix_ns: int
    """Wall-clock time of arrival (for spans)."""
    output_events: int
    """Output events seen."""
    gap_count: int
    """Inter-token gaps observed (``output_events - 1`` when > 0)."""
    max_gap_ns: int
    """Worst gap, 0 without gaps."""
    prompt_tokens: int | None
    """``usage.prompt_tokens`` when reported."""
    completion_tokens: int | None
    """``usage.completion_tokens`` when reported."""
    cached_tokens: int | None
    """``usage.prompt_tokens_details.cached_tokens`` when reported."""
    finish_reasons: tuple[str, ...]
    """Finish reasons in order of arrival."""
    response_model: str
    """``model`` of the response."""
    response_id: str
    """``id`` of the response."""
    request_model: str
    """The model the client asked for, unbounded (spans only)."""
    trace_id: str = ""
    """Trace id (32 hex digits) of the request's span when it is sampled, else empty.

    Travels as an exemplar on the TTFT and worst-gap histograms, never as a label."""
    backend_timings: BackendTimings | None = None
    """Timings the backend reported about itself (llama.cpp, Ollama), when it did."""
    response_status: str = ""
    """Terminal status the format reported (Responses ``completed``, ``incomplete``, ``failed``)."""
    terminal_seen: bool = False
    """The stream's terminal event arrived (``[DONE]``, ``message_stop``, ``done: true``, ...)."""
    slo_ttft_s: float | None = None
    """The request's own TTFT target (``x-slo-ttft-ms``), when it carried one."""
    slo_tpot_s: float | None = None
    """The request's own TPOT target (``x-slo-tpot-ms``), when it carried one."""
    first_answer_ns: int | None = None
    """``t_answer``: first answer event (content, text, tool call; not reasoning)."""
    first_reasoning_ns: int | None = None
    """First reasoning event."""
    first_tool_call_ns: int | None = None
    """First tool-call event."""
    reasoning_events: int = 0
    """Reasoning events seen (part of ``output_events``)."""
    reported_reasoning_tokens: int | None = None
    """``usage.completion_tokens_details.reasoning_tokens`` (or the format's own) when reported."""
    choices: tuple[ChoiceStats, ...] = ()
    """Per choice, when the stream carried more than one (``n > 1``); empty otherwise, and
    then the request's own gaps, worst gap and TPOT are its one choice's."""

    @property
    def ttft_s(self) -> float | None:
        """``t1 - t0`` in seconds."""
        if self.first_token_ns is None:
            return None
        return (self.first_token_ns - self.arrival_ns) / 1e9

    @property
    def answer_ttft_s(self) -> float | None:
        """``t_answer - t0`` in seconds: the time to first answer token."""
        if self.first_answer_ns is None:
            return None
        return (self.first_answer_ns - self.arrival_ns) / 1e9

    @property
    def tool_call_ttft_s(self) -> float | None:
        """First tool-call event minus ``t0`` in seconds."""
        if self.first_tool_call_ns is None:
            return None
        return (self.first_tool_call_ns - self.arrival_ns) / 1e9

    @property
    def reasoning_s(self) -> float | None:
        """First reasoning event to the first answer event after it (to the end when no
        answer followed); ``None`` without reasoning, or when the answer came first."""
        start = self.first_reasoning_ns
        if start is None:
            return None
        answer = self.first_answer_ns
        if answer is None:
            return (self.end_ns - start) / 1e9
        return (answer - start) / 1e9 if answer >= start else None

    @property
    def reasoning_tokens(self) -> int | None:
        """Reasoning tokens: the backend's count when reported and not 0, else reasoning
        events; ``None`` for a request without reasoning."""
        if self.reported_reasoning_tokens:  # 0 is what OpenAI reports for no reasoning
            return self.reported_reasoning_tokens
        return self.reasoning_events or None

    @property
    def upstream_ttft_s(self) -> float | None:
        """``t1 - tf`` in seconds."""
        if self.first_token_ns is None or self.forwarded_ns is None:
            return None
        return (self.first_token_ns - self.forwarded_ns) / 1e9

    @property
    def queue_time_s(self) -> float | None:
        """Observed TTFT minus the backend's reported prefill: ``tokenstamp.request.queue_time``."""
        return queue_time_s(self.ttft_s, self.backend_timings)

    @property
    def tokens_per_event(self) -> float | None:
        """Completion tokens per output event of a stream; ``None`` when either is unknown.

        1.0 when every chunk carries one token; more with speculative decoding or a
        server-side stream interval."""
        if not self.streamed or self.completion_tokens is None or self.output_events == 0:
            return None
        return self.completion_tokens / self.output_events

    @property
    def output_tokens(self) -> int:
        """``n_out``: the backend's count when known, else output events."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return self.output_events

    @property
    def tpot_s(self) -> float | None:
        """``(t_last - t1) / (n_out - 1)``; ``None`` below two output tokens.

        With several choices, the mean over the choices of each one's own TPOT (each
        choice decodes one token per step, side by side): never the request's span
        over all its tokens, which would count choices as if one followed the other.
        """
        if self.choices:
            each = [t for c in self.choices if (t := c.tpot_s) is not None]
            return sum(each) / len(each) if each else None
        n = self.output_tokens
        if self.first_token_ns is None or self.last_token_ns is None or n < 2:
            return None
        if self.output_events < 2:
            return None
        return (self.last_token_ns - self.first_token_ns) / 1e9 / (n - 1)

    @property
    def stream_tpots_s(self) -> tuple[float, ...]:
        """One TPOT per stream: per choice with several choices, else the request's."""
        if self.choices:
            return tuple(t for c in self.choices if (t := c.tpot_s) is not None)
        tpot = self.tpot_s
        return () if tpot is None else (tpot,)

    @property
    def stream_max_gaps_s(self) -> tuple[float, ...]:
        """One worst gap per stream with at least one gap: per choice with several, else the
        request's (``tokenstamp.stream.max_gap``)."""
        if self.choices:
            return tuple(c.max_gap_ns / 1e9 for c in self.choices if c.gap_count)
        return (self.max_gap_ns / 1e9,) if self.gap_count else ()

    @property
    def duration_s(self) -> float:
        """E2E: end minus ``t0``."""
        return (self.end_ns - self.arrival_ns) / 1e9

    @property
    def max_gap_s(self) -> float:
        """Worst gap in seconds."""
        return self.max_gap_ns / 1e9

    @property
    def prefix_cache(self) -> str:
        """``hit`` / ``miss`` / ``unknown`` from the cached prompt tokens."""
        if self.cached_tokens is None:
            return "unknown"
        return "hit" if self.cached_tokens > 0 else "miss"

    def slo_judged(
        self,
        default_ttft_s: float,
        default_tpot_s: float,
        answer_ttft_s: float | None = None,
    ) -> tuple[bool, SloSource]:
        """Whether both SLOs were met, against the request's own targets where it carried
        them (the defaults for the rest), and whose targets those were.

        ``answer_ttft_s`` (``--slo-answer-ttft``): also a target for the time to the
        first answer token, when given.
        """
        own_ttft, own_tpot = self.slo_ttft_s, self.slo_tpot_s
        source = SloSource.DEFAULT if own_ttft is None and own_tpot is None else SloSource.REQUEST
        met = self.slo_met(
            default_ttft_s if own_ttft is None else own_ttft,
            default_tpot_s if own_tpot is None else own_tpot,
            answer_ttft_s,
        )
        return met, source

    def slo_met(
        self, ttft_target_s: float, tpot_target_s: float, answer_ttft_s: float | None = None
    ) -> bool:
        """Both SLOs met: ended ``ok``, produced output within ``ttft_target_s``, and
        decoded within ``tpot_target_s`` per token (or had fewer than two tokens).

        With ``answer_ttft_s``, the first answer event must also have come within it: a
        request that only reasoned never showed its user an answer, and missed.
        """
        ttft = self.ttft_s
        tpot = self.tpot_s
        if answer_ttft_s is not None:
            answer = self.answer_ttft_s
            if answer is None or answer > answer_ttft_s:
                return False
        return (
            self.outcome is Outcome.OK
            and ttft is not None
            and ttft <= ttft_target_s
            and (tpot is None or tpot <= tpot_target_s)
        )


class StallCause(StrEnum):
    """``tokenstamp.stall.cause``: why a stream stalled."""

    PREFILL = "prefill"
    """At least one culprit: another request's prefill overlapped the stall."""
    UNATTRIBUTED = "unattributed"
    """No culprit found."""


@dataclass(frozen=True, slots=True)
class StallRecord:
    """One stall: a gap of one stream far above its baseline (see ``proxy.core.backend_view``)."""

    request_id: str
    """The stalled stream's request id."""
    backend: Backend
    """The upstream it streams from."""
    start_ns: int
    """The output event before the gap (monotonic)."""
    end_ns: int
    """The output event that ended the gap (monotonic)."""
    baseline_ns: int
    """The baseline gap it was judged against (median of recent gaps)."""
    threshold_ns: int
    """``max(stall_ratio x baseline, stall_floor)``; the gap exceeded it."""
    cause: StallCause
    """``prefill`` when culprits were found, else ``unattributed``."""
    culprits: tuple[str, ...]
    """Request ids of the culprits (empty when unattributed)."""
    tenant: str = ""
    """The stalled stream's tenant (empty when tenants are not labelled)."""
    culprit_tenant: str = ""
    """The first culprit's tenant (empty when unattributed or not labelled)."""
    choice: int = 0
    """The stalled choice of the request (``n > 1``: each choice is a stream of its own)."""

    @property
    def duration_s(self) -> float:
        """The stall (the gap) in seconds."""
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def excess_s(self) -> float:
        """Stall minus baseline in seconds: the frozen output it cost this stream."""
        return max(0, self.end_ns - self.start_ns - self.baseline_ns) / 1e9


class PrefillRecord(NamedTuple):
    """One request's prefill window, reported once its attribution is final.

    A named tuple, as ``RequestRecord`` (one per request: a frozen dataclass's fields
    cost an ``object.__setattr__`` each).
    """

    request_id: str
    """The proxy's id for the request."""
    labels: RequestLabels
    """The request's labels (operation and model empty when it was not described)."""
    forwarded_ns: int
    """``tf``: the window opened (monotonic)."""
    first_token_ns: int
    """``t1``: the window closed (monotonic)."""
    prompt_tokens_hint: int | None
    """Prompt size estimated from the request body, when known."""
    stalls: int
    """Stalls attributed to it (a stream stalled twice counts twice)."""
    stalled_streams: int
    """Distinct other streams it stalled (0 when none)."""
    stutter_cost_s: float
    """Its share of sum(stall - baseline) over those stalls: user-seconds of frozen output."""

    @property
    def window_s(self) -> float:
        """``t1 - tf`` in seconds: upstream TTFT (queueing included)."""
        return (self.first_token_ns - self.forwarded_ns) / 1e9


GapRecorder = Callable[[float], None]
"""Records one gap of one request, in seconds (``Sink.gap_recorder``); never raises."""


class Sink(Protocol):
    """Where the core reports: one method per event (``EVENTS``), one call site each.

    The core calls a fan-out (``exporters.fanout.Fanout``), which has every
    method. Behind it, each subscriber (an exporter, the advisor, the timeline)
    names the events it takes in a class attribute ``takes`` (a tuple of
    ``EVENTS`` names) and has, for each, the method of that name with the
    signature written here; it has nothing for the others. The fan-out calls
    each subscriber for what it takes, and catches what it raises.

    A subscriber taking ``gap`` may also offer ``gap_recorder(labels, request_id)``:
    a callable taking one gap in seconds, made once per request, which the timer
    calls for every gap that carries no exemplar instead of ``gap`` (no label
    lookup, no fan-out per token). It must record exactly what ``gap`` would and
    must never raise (see ``GapRecorder``).
    """

    def request_started(self, labels: RequestLabels) -> None:
        """An observed request arrived (in-flight gauge up)."""

    def first_token(
        self,
        labels: RequestLabels,
        ttft_s: float,
        upstream_ttft_s: float | None,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """A stream's first output event arrived: its TTFT, observed live, once per request.

        ``ttft_s`` is ``t1 - t0``, ``upstream_ttft_s`` is ``t1 - tf`` (``None`` when the
        request was never marked forwarded). ``trace_id`` is given when the request's span
        is sampled (the TTFT carries it as an exemplar). The record at the end carries
        the same stamps; a sink must not count TTFT a second time from it."""

    def phase(
        self,
        labels: RequestLabels,
        phase: Phase,
        seconds: float,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """A phase of a stream closed, observed live once per request and phase (see
        ``Phase``): the time to the first answer event and to the first tool call, and
        reasoning's duration (at the first answer event, or at the end of a request that
        only reasoned). ``trace_id`` as for ``first_token``. The record at the end
        carries the same stamps: a sink must not count these a second time from it."""

    def gap(self, labels: RequestLabels, gap_s: float, request_id: str, trace_id: str = "") -> None:
        """One inter-token gap of a stream.

        ``trace_id`` is given (the stream is sampled) only when this gap should
        carry an exemplar: the stream's largest gap so far. Callers pass it only
        when non-empty, so a sink may omit the parameter while tracing is off."""

    def request_finished(self, record: RequestRecord) -> None:
        """A request ended, any outcome (in-flight gauge down): everything measured about
        it, in one record."""

    def decoder_error(self, backend: Backend, kind: str) -> None:
        """An upstream event could not be decoded."""

    def unobserved(self, backend: Backend, reason: str) -> None:
        """A request on an observed route was passed through without timing."""

    def stall(self, record: StallRecord) -> None:
        """A stall was detected and its attribution is final."""

    def prefill_done(self, record: PrefillRecord) -> None:
        """A request's prefill completed and the stalls it caused are all counted."""


EVENTS = (
    "request_started",
    "first_token",
    "phase",
    "gap",
    "request_finished",
    "decoder_error",
    "unobserved",
    "stall",
    "prefill_done",
)
"""The ``Sink``'s events: what a subscriber's ``takes`` may name."""
