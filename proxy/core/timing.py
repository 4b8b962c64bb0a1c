"""Per-request stream timer: arrival, forwarded, first token, every gap, end.

Pure: takes nanosecond stamps (monotonic clock) and chunk meanings, reports to
a ``Sink`` and, when given, to a backend's stall view. One timer per request.

Output events have a kind (``EventKind``): the first of any kind is the first
token (TTFT, the prefill); the first answer event (not reasoning) is the time
to first answer token; reasoning runs from the first reasoning event to it.
With several choices (``n > 1``) each choice is a stream of its own: gaps,
worst gap and TPOT per choice, each one a stream of the stall view
(``choice_stream_id``); the timer's own gap fields are choice 0's.

Stamping convention: the proxy stamps each read from the upstream socket once,
before doing anything else with the bytes. All events decoded from one read
share that stamp, so two output events that arrived in one read are a gap of 0
(a client reading the same socket could not tell them apart either).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from proxy.core.decoders.openai import ChunkInfo
from proxy.core.records import (
    BackendTimings,
    ChoiceStats,
    EventKind,
    GapRecorder,
    Outcome,
    Phase,
    RequestLabels,
    RequestRecord,
    Sink,
    choice_stream_id,
)


class StreamWatcher(Protocol):
    """What a backend-wide view needs from each stream (see ``proxy.core.backend_view``)."""

    def forwarded(self, request_id: str, forwarded_ns: int) -> None:
        """The request was sent upstream: its prefill window opens."""

    def first_token(self, request_id: str, first_token_ns: int) -> None:
        """The request's first output event arrived: its prefill window closes."""

    def gap(self, request_id: str, start_ns: int, end_ns: int) -> None:
        """A gap between two output events of this stream ended."""

    def finished(self, request_id: str, end_ns: int) -> None:
        """The stream ended."""


log = logging.getLogger("tokenstamp.proxy")

MAX_CHOICES = 64
"""Choices timed apart in one request; events of further choices count as choice 0's
(an upstream cannot grow a stream's state without bound)."""


GapTargets = tuple[Callable[[str, int, int], None], ...]
"""The ``gap`` of each watcher, which a timer calls itself on every gap."""


def gap_targets(watcher: StreamWatcher | None) -> GapTargets:
    """Each watcher's ``gap`` (a fan-out's watchers unpacked), for a timer to call itself.

    A proxy builds this once and hands it to every timer: one shared tuple of bound
    methods instead of one a stream (memory per open stream).
    """
    if watcher is None:
        return ()
    inner: tuple[StreamWatcher, ...] = getattr(watcher, "watchers", (watcher,))
    return tuple(w.gap for w in inner)


class StreamTimer:
    """Timing state of one request. Not thread-safe; one owner.

    Per token the timer calls the sink's gap recorder (when it has one) and each
    watcher's ``gap`` directly: both are looked up once, at the request's start.
    """

    __slots__ = (
        "_choice0_first_ns",
        "_choices",
        "_gap_targets",
        "_phase",
        "_record_gap",
        "_sink",
        "_watcher",
        "arrival_ns",
        "backend_timings",
        "cached_tokens",
        "completion_tokens",
        "finish_reasons",
        "first_answer_ns",
        "first_reasoning_ns",
        "first_token_ns",
        "first_tool_call_ns",
        "forwarded_ns",
        "gap_count",
        "labels",
        "last_token_ns",
        "max_gap_ns",
        "output_events",
        "prompt_tokens",
        "reasoning_events",
        "reasoning_tokens",
        "request_id",
        "request_model",
        "response_id",
        "response_model",
        "response_status",
        "slo_tpot_s",
        "slo_ttft_s",
        "start_unix_ns",
        "stream_error",
        "streamed",
        "terminal_seen",
        "trace_id",
    )

    def __init__(
        self,
        request_id: str,
        labels: RequestLabels,
        *,
        arrival_ns: int,
        start_unix_ns: int,
        sink: Sink,
        watcher: StreamWatcher | None = None,
        request_model: str = "",
        watcher_gaps: GapTargets | None = None,
    ) -> None:
        """``watcher_gaps``: ``gap_targets(watcher)``, when the caller built it once already."""
        self.request_id = request_id
        self.labels = labels
        self.arrival_ns = arrival_ns
        self.start_unix_ns = start_unix_ns
        self.request_model = request_model
        self._sink = sink
        self._watcher = watcher
        self._gap_targets = gap_targets(watcher) if watcher_gaps is None else watcher_gaps
        self.forwarded_ns: int | None = None
        self.first_token_ns: int | None = None
        self.last_token_ns: int | None = None
        self.output_events = 0
        self.gap_count = 0
        self.max_gap_ns = 0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.finish_reasons: list[str] = []
        self.response_model = ""
        self.response_id = ""
        self.streamed = False
        self.stream_error = ""
        self.backend_timings: BackendTimings | None = None
        self.response_status = ""
        self.terminal_seen = False
        self.trace_id = ""
        """The sampled span's trace id (set by the tracing adapter): exemplars carry it."""
        self.slo_ttft_s: float | None = None
        """The request's own TTFT target, when it carried one (set by the edge)."""
        self.slo_tpot_s: float | None = None
        """The request's own TPOT target, when it carried one (set by the edge)."""
        self.first_answer_ns: int | None = None
        self.first_reasoning_ns: int | None = None
        self.first_tool_call_ns: int | None = None
        self.reasoning_events = 0
        self.reasoning_tokens: int | None = None
        self._choice0_first_ns: int | None = None
        # choice -> [first_ns, last_ns, events, gaps, max_gap_ns], for choices other than 0
        self._choices: dict[int, list[int]] | None = None
        self._phase: Callable[..., None] | None = getattr(sink, "phase", None)
        sink.request_started(labels)
        self._record_gap: GapRecorder | None = None
        make = getattr(sink, "gap_recorder", None)
        if make is not None:
            try:
                self._record_gap = make(labels, request_id)
            except Exception:  # telemetry never breaks traffic: ``sink.gap`` it is
                log.exception("sink: gap_recorder failed")

    def forwarded(self, now_ns: int) -> None:
        """The request (its last byte) went upstream."""
        self.forwarded_ns = now_ns
        if self._watcher is not None:
            self._watcher.forwarded(self.request_id, now_ns)

    def output(self, now_ns: int) -> None:
        """One answer event of choice 0 was read at ``now_ns``."""
        self.token(now_ns)
        if self.first_answer_ns is None:
            self._answer(now_ns)

    def reasoning(self, now_ns: int) -> None:
        """One reasoning event of choice 0 was read at ``now_ns``."""
        self.token(now_ns)
        self.reasoning_events += 1
        if self.first_reasoning_ns is None:
            self.first_reasoning_ns = now_ns

    def event(self, choice: int, kind: EventKind, now_ns: int) -> None:
        """One output event of ``kind`` of choice ``choice`` was read at ``now_ns``."""
        if choice == 0:
            self.token(now_ns)
        else:
            self._event_of(choice, now_ns)
        if kind is EventKind.REASONING:
            self.reasoning_events += 1
            if self.first_reasoning_ns is None:
                self.first_reasoning_ns = now_ns
            return
        if kind is EventKind.TOOL_CALL and self.first_tool_call_ns is None:
            self.first_tool_call_ns = now_ns
            self._report(Phase.TOOL_CALL, now_ns - self.arrival_ns)
        if self.first_answer_ns is None:
            self._answer(now_ns)

    def _answer(self, now_ns: int) -> None:
        """The first answer event: the time to it, and the reasoning before it, observed live."""
        self.first_answer_ns = now_ns
        self._report(Phase.ANSWER, now_ns - self.arrival_ns)
        start = self.first_reasoning_ns
        if start is not None:
            self._report(Phase.REASONING, now_ns - start)

    def _report(self, phase: Phase, elapsed_ns: int) -> None:
        if self._phase is not None:
            try:
                self._phase(self.labels, phase, elapsed_ns / 1e9, self.request_id, self.trace_id)
            except Exception:  # telemetry never breaks traffic
                log.exception("sink: phase failed")

    def token(self, now_ns: int) -> None:
        """One output event of choice 0: the first token, or a gap of its stream.

        Called alone (not through ``output``) only for an answer event after the
        first answer: the relay's usual token, recognised by a shape that was learned
        from an answer event the timer has already seen.
        """
        last = self.last_token_ns
        self.output_events += 1
        self.last_token_ns = now_ns
        if last is None:
            self._choice0_first_ns = now_ns
            if self.first_token_ns is None:
                self._first(now_ns)
            return
        gap_ns = now_ns - last
        self.gap_count += 1
        if gap_ns > self.max_gap_ns:
            self.max_gap_ns = gap_ns
            if self.trace_id:  # a sampled stream's new worst gap carries an exemplar
                self._sink.gap(self.labels, gap_ns / 1e9, self.request_id, self.trace_id)
            else:
                self._sink.gap(self.labels, gap_ns / 1e9, self.request_id)
        elif self._record_gap is not None:
            self._record_gap(gap_ns / 1e9)
        else:
            self._sink.gap(self.labels, gap_ns / 1e9, self.request_id)
        for target in self._gap_targets:
            target(self.request_id, last, now_ns)

    def _first(self, now_ns: int) -> None:
        """The request's first output event, of any choice: TTFT, and the prefill window."""
        self.first_token_ns = now_ns
        self._first_token(now_ns)
        if self._watcher is not None:
            self._watcher.first_token(self.request_id, now_ns)

    def _event_of(self, choice: int, now_ns: int) -> None:
        """One output event of choice ``choice`` > 0: a stream of its own."""
        choices = self._choices
        if choices is None:
            choices = self._choices = {}
        state = choices.get(choice)
        if state is None:
            if len(choices) >= MAX_CHOICES:
                self.token(now_ns)
                return
            self.output_events += 1
            choices[choice] = [now_ns, now_ns, 1, 0, 0]
            if self.first_token_ns is None:
                self._first(now_ns)
            return
        self.output_events += 1
        last = state[1]
        gap_ns = now_ns - last
        state[1] = now_ns
        state[2] += 1
        state[3] += 1
        state[4] = max(state[4], gap_ns)
        if self._record_gap is not None:
            self._record_gap(gap_ns / 1e9)
        else:
            self._sink.gap(self.labels, gap_ns / 1e9, self.request_id)
        if self._gap_targets:
            stream = choice_stream_id(self.request_id, choice)
            for target in self._gap_targets:
                target(stream, last, now_ns)

    def _first_token(self, now_ns: int) -> None:
        """Report the live TTFT (once per request: only the first output event calls this)."""
        tf = self.forwarded_ns
        self._sink.first_token(
            self.labels,
            (now_ns - self.arrival_ns) / 1e9,
            None if tf is None else (now_ns - tf) / 1e9,
            self.request_id,
            self.trace_id,
        )

    def chunk(self, info: ChunkInfo, now_ns: int) -> None:
        """Take in one decoded chunk read at ``now_ns``."""
        if info.output:
            self.event(info.choice, info.kind, now_ns)
            for choice, kind in info.more:
                self.event(choice, kind, now_ns)
        if info.usage is not None:
            u = info.usage
            if u.reasoning_tokens is not None:
                self.reasoning_tokens = u.reasoning_tokens
            if u.prompt_tokens is not None:
                self.prompt_tokens = u.prompt_tokens
            if u.completion_tokens is not None:
                self.completion_tokens = u.completion_tokens
            if u.cached_tokens is not None:
                self.cached_tokens = u.cached_tokens
        if info.finish_reasons:
            self.finish_reasons.extend(info.finish_reasons)
        if info.model and not self.response_model:
            self.response_model = info.model
        if info.response_id and not self.response_id:
            self.response_id = info.response_id
        if info.error and not self.stream_error:
            self.stream_error = info.error
        if info.backend_timings is not None:
            self.backend_timings = info.backend_timings
        if info.status:
            self.response_status = info.status
        if info.done:
            self.terminal_seen = True

    def finish(
        self, end_ns: int, outcome: Outcome, status_code: int, error_type: str = ""
    ) -> RequestRecord:
        """Close the timer and report the record. Call exactly once."""
        if self._watcher is not None:
            self._watcher.finished(self.request_id, end_ns)
            for choice in self._choices or ():
                self._watcher.finished(choice_stream_id(self.request_id, choice), end_ns)
        if self.first_reasoning_ns is not None and self.first_answer_ns is None:
            self._report(Phase.REASONING, end_ns - self.first_reasoning_ns)  # it only reasoned
        last_ns, gap_count, max_gap_ns, choices = self._choice_totals()
        record = RequestRecord(
            request_id=self.request_id,
            labels=self.labels,
            streamed=self.streamed,
            outcome=outcome,
            status_code=status_code,
            error_type=error_type,
            arrival_ns=self.arrival_ns,
            forwarded_ns=self.forwarded_ns,
            first_token_ns=self.first_token_ns,
            last_token_ns=last_ns,
            end_ns=end_ns,
            start_unix_ns=self.start_unix_ns,
            output_events=self.output_events,
            gap_count=gap_count,
            max_gap_ns=max_gap_ns,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            finish_reasons=tuple(self.finish_reasons),
            response_model=self.response_model,
            response_id=self.response_id,
            request_model=self.request_model,
            trace_id=self.trace_id,
            backend_timings=self.backend_timings,
            response_status=self.response_status,
            terminal_seen=self.terminal_seen,
            slo_ttft_s=self.slo_ttft_s,
            slo_tpot_s=self.slo_tpot_s,
            first_answer_ns=self.first_answer_ns,
            first_reasoning_ns=self.first_reasoning_ns,
            first_tool_call_ns=self.first_tool_call_ns,
            reasoning_events=self.reasoning_events,
            reported_reasoning_tokens=self.reasoning_tokens,
            choices=choices,
        )
        self._sink.request_finished(record)
        return record

    def _choice_totals(self) -> tuple[int | None, int, int, tuple[ChoiceStats, ...]]:
        """The request's last event, gaps and worst gap over all choices, and each choice's."""
        if not self._choices:
            return self.last_token_ns, self.gap_count, self.max_gap_ns, ()
        stats = [
            ChoiceStats(k, first, last, events, gaps, worst)
            for k, (first, last, events, gaps, worst) in self._choices.items()
        ]
        first0, last0 = self._choice0_first_ns, self.last_token_ns
        if first0 is not None and last0 is not None:
            events0 = self.gap_count + 1
            stats.append(ChoiceStats(0, first0, last0, events0, self.gap_count, self.max_gap_ns))
        stats.sort()
        return (
            max(c.last_ns for c in stats),
            sum(c.gap_count for c in stats),
            max(c.max_gap_ns for c in stats),
            tuple(stats),
        )
