"""One sink in front of several: every observation reaches each exporter, none breaks traffic.

``FanoutSink`` implements ``proxy.core.records.Sink`` by calling each sink in
order. An exception from one sink is swallowed (the others still get the
observation, and the caller, the token path, never sees it), counted, and
logged through ``ErrorLog``: at most one line per interval, carrying how many
failures happened since the last line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

from proxy.core.ratelog import RateLimitedLog
from proxy.core.records import (
    Backend,
    GapRecorder,
    Phase,
    PhaseSink,
    PrefillRecord,
    RequestLabels,
    RequestRecord,
    Sink,
    StallRecord,
)

log = logging.getLogger("tokenstamp.telemetry")

LOG_EVERY_S = 60.0
"""Shortest time between two log lines of one ``ErrorLog``."""


class ErrorLog:
    """Counts telemetry failures and logs them rate-limited (never raises)."""

    __slots__ = ("_limit", "failures")

    def __init__(
        self,
        logger: logging.Logger = log,
        *,
        every_s: float = LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = RateLimitedLog(logger, every_s, clock)
        self.failures = 0
        """Failures counted since start."""

    def record(self, what: str, exc: BaseException | None = None) -> bool:
        """Count one failure of ``what``; log it unless a line was written recently.

        Returns whether a line was written.
        """
        self.failures += 1
        n = self._limit.allow()
        if n is None:
            return False
        self._limit.logger.warning(
            "telemetry failure: %s (%d since the last line, %d in total); traffic is unaffected",
            what,
            n,
            self.failures,
            exc_info=exc,
        )
        return True


def _via_gap(sink: Sink, labels: RequestLabels, request_id: str) -> GapRecorder:
    """A recorder for a sink without one of its own: its ``gap`` with the request's labels."""

    def record(gap_s: float) -> None:
        sink.gap(labels, gap_s, request_id)

    return record


class FanoutSink:
    """A ``Sink`` passing every observation to each of ``sinks``, in order.

    Nested fan-outs are flattened. Per gap the cost is one loop over the sinks.
    """

    __slots__ = ("_gap_sinks", "_phase_sinks", "errors", "sinks")

    def __init__(self, *sinks: Sink, errors: ErrorLog | None = None) -> None:
        flat: list[Sink] = []
        for sink in sinks:
            flat.extend(sink.sinks if isinstance(sink, FanoutSink) else (sink,))
        self.sinks: tuple[Sink, ...] = tuple(flat)
        """The sinks, called in this order."""
        # Per token only the sinks that take gaps (see ``Sink``'s ``takes_gaps``).
        self._gap_sinks = tuple(s for s in flat if getattr(s, "takes_gaps", True))
        # Only the sinks that take phases (``Sink.phase`` is optional).
        self._phase_sinks = tuple(cast(PhaseSink, s) for s in flat if hasattr(s, "phase"))
        self.errors = errors if errors is not None else ErrorLog()
        """Where failures are counted and logged."""

    def _failed(self, sink: Sink | PhaseSink, method: str, exc: Exception) -> None:
        self.errors.record(f"{type(sink).__name__}.{method} raised {type(exc).__name__}", exc)

    def request_started(self, labels: RequestLabels) -> None:
        """Fan out ``request_started``."""
        for sink in self.sinks:
            try:
                sink.request_started(labels)
            except Exception as exc:
                self._failed(sink, "request_started", exc)

    def first_token(
        self,
        labels: RequestLabels,
        ttft_s: float,
        upstream_ttft_s: float | None,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """Fan out ``first_token``."""
        for sink in self.sinks:
            try:
                sink.first_token(labels, ttft_s, upstream_ttft_s, request_id, trace_id)
            except Exception as exc:
                self._failed(sink, "first_token", exc)

    def phase(
        self,
        labels: RequestLabels,
        phase: Phase,
        seconds: float,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """Fan out ``phase`` to the sinks that take it."""
        for sink in self._phase_sinks:
            try:
                sink.phase(labels, phase, seconds, request_id, trace_id)
            except Exception as exc:
                self._failed(sink, "phase", exc)

    def gap(self, labels: RequestLabels, gap_s: float, request_id: str, trace_id: str = "") -> None:
        """Fan out ``gap`` (the trace id only when there is one, as the timer does)."""
        for sink in self._gap_sinks:
            try:
                if trace_id:
                    sink.gap(labels, gap_s, request_id, trace_id)
                else:
                    sink.gap(labels, gap_s, request_id)
            except Exception as exc:
                self._failed(sink, "gap", exc)

    def gap_recorder(self, labels: RequestLabels, request_id: str) -> GapRecorder:
        """One request's gaps to every gap-taking sink: a sink's own recorder when it has one.

        With a single gap-taking sink whose recorder exists, that recorder is
        returned as it is (it never raises: ``Sink.gap_recorder``), so a token
        costs one call. Otherwise each sink is called in turn, failures counted
        as for ``gap``.
        """
        recorders: list[tuple[Sink, GapRecorder]] = []
        own = 0  # recorders the sinks made themselves
        for sink in self._gap_sinks:
            recorder = _via_gap(sink, labels, request_id)
            make = getattr(sink, "gap_recorder", None)
            if make is not None:
                try:
                    recorder = make(labels, request_id)
                    own += 1
                except Exception as exc:
                    self._failed(sink, "gap_recorder", exc)
            recorders.append((sink, recorder))
        if len(recorders) == 1 and own == 1:
            return recorders[0][1]

        def record(gap_s: float) -> None:
            for sink, rec in recorders:
                try:
                    rec(gap_s)
                except Exception as exc:
                    self._failed(sink, "gap", exc)

        return record

    def request_finished(self, record: RequestRecord) -> None:
        """Fan out ``request_finished``."""
        for sink in self.sinks:
            try:
                sink.request_finished(record)
            except Exception as exc:
                self._failed(sink, "request_finished", exc)

    def decoder_error(self, backend: Backend, kind: str) -> None:
        """Fan out ``decoder_error``."""
        for sink in self.sinks:
            try:
                sink.decoder_error(backend, kind)
            except Exception as exc:
                self._failed(sink, "decoder_error", exc)

    def unobserved(self, backend: Backend, reason: str) -> None:
        """Fan out ``unobserved``."""
        for sink in self.sinks:
            try:
                sink.unobserved(backend, reason)
            except Exception as exc:
                self._failed(sink, "unobserved", exc)

    def stall(self, record: StallRecord) -> None:
        """Fan out ``stall``."""
        for sink in self.sinks:
            try:
                sink.stall(record)
            except Exception as exc:
                self._failed(sink, "stall", exc)

    def prefill_done(self, record: PrefillRecord) -> None:
        """Fan out ``prefill_done``."""
        for sink in self.sinks:
            try:
                sink.prefill_done(record)
            except Exception as exc:
                self._failed(sink, "prefill_done", exc)
