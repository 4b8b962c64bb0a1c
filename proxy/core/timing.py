"""Per-request stream timer: arrival, forwarded, first token, every gap, end.

Pure: takes nanosecond stamps (monotonic clock) and chunk meanings, reports to
a ``Sink`` and, when given, to a backend's stall view. One timer per request.

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
    GapRecorder,
    Outcome,
    RequestLabels,
    RequestRecord,
    Sink,
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
        "_gap_targets",
        "_record_gap",
        "_sink",
        "_watcher",
        "arrival_ns",
        "backend_timings",
        "cached_tokens",
        "completion_tokens",
        "finish_reasons",
        "first_token_ns",
        "forwarded_ns",
        "gap_count",
        "labels",
        "last_token_ns",
        "max_gap_ns",
        "output_events",
        "prompt_tokens",
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
        """One output event was read at ``now_ns``."""
        last = self.last_token_ns
        self.output_events += 1
        self.last_token_ns = now_ns
        if last is None:
            self.first_token_ns = now_ns
            self._first_token(now_ns)
            if self._watcher is not None:
                self._watcher.first_token(self.request_id, now_ns)
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
            self.output(now_ns)
        if info.usage is not None:
            u = info.usage
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
            last_token_ns=self.last_token_ns,
            end_ns=end_ns,
            start_unix_ns=self.start_unix_ns,
            output_events=self.output_events,
            gap_count=self.gap_count,
            max_gap_ns=self.max_gap_ns,
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
        )
        self._sink.request_finished(record)
        return record
