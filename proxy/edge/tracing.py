"""The app's side of tracing: W3C context in and out, one span per observed request.

- At arrival, the client's ``traceparent``/``tracestate`` are extracted and
  the request's span is started as their child (``exporters.otel_spans``);
  the timer is a ``TracedTimer``, which carries the span and, when sampled,
  its trace id (exemplars).
- When the request goes upstream, the span's context replaces the client's
  ``traceparent``/``tracestate`` (vLLM and others join the trace).
- When the timer finishes, the span gets the record and ends (or lingers for
  late stall records).
- With ``--capture-content`` only: the upstream response body is copied (at
  most ``CAPTURE_BYTES``) while it is relayed, for ``gen_ai.output.messages``.

Headers other than the two trace-context ones are never read. Every call here
is guarded: tracing never breaks a request (failures are counted and logged,
rate-limited, by ``exporters.fanout.ErrorLog``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry.trace import set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from exporters.fanout import ErrorLog
from exporters.otel_content import output_messages
from exporters.otel_spans import RequestSpan, SpanRecorder
from proxy.core.records import Outcome, RequestLabels, RequestRecord, Sink
from proxy.core.timing import GapTargets, StreamTimer, StreamWatcher

if TYPE_CHECKING:
    pass

CAPTURE_BYTES = 1 << 20
"""Most response bytes copied for ``gen_ai.output.messages`` (``--capture-content``)."""
TRACE_HEADERS = ("traceparent", "tracestate")
"""The W3C trace-context headers the proxy reads and rewrites."""


class Captured:
    """A bounded copy of a response body (content capture only)."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = bytearray()
        """At most ``CAPTURE_BYTES`` of the body, from its start."""


class TracedTimer(StreamTimer):
    """A ``StreamTimer`` that ends its request's span when it finishes."""

    __slots__ = ("capture", "request_span", "tracing")

    def __init__(
        self,
        request_id: str,
        labels: RequestLabels,
        *,
        arrival_ns: int,
        start_unix_ns: int,
        sink: Sink,
        watcher: StreamWatcher | None,
        request_model: str,
        tracing: Tracing,
        watcher_gaps: GapTargets | None = None,
    ) -> None:
        super().__init__(
            request_id,
            labels,
            arrival_ns=arrival_ns,
            start_unix_ns=start_unix_ns,
            sink=sink,
            watcher=watcher,
            request_model=request_model,
            watcher_gaps=watcher_gaps,
        )
        self.tracing = tracing
        """The adapter that started the span."""
        self.request_span: RequestSpan | None = None
        """The request's span (``None`` if starting it failed)."""
        self.capture: Captured | None = None
        """The response copy, with ``--capture-content``."""

    def finish(
        self, end_ns: int, outcome: Outcome, status_code: int, error_type: str = ""
    ) -> RequestRecord:
        """Close the timer, report the record, then complete the span."""
        record = super().finish(end_ns, outcome, status_code, error_type)
        self.tracing.finished(self, record)
        return record


class Tracing:
    """Trace context in and out, and the spans of observed requests."""

    def __init__(self, spans: SpanRecorder, errors: ErrorLog | None = None) -> None:
        self.spans = spans
        """Where spans are started and ended (also the stall view's span sink)."""
        self.errors = errors if errors is not None else ErrorLog()
        """Where tracing failures are counted and logged."""
        self._propagator = TraceContextTextMapPropagator()

    def start_timer(
        self,
        request_id: str,
        labels: RequestLabels,
        *,
        arrival_ns: int,
        start_unix_ns: int,
        sink: Sink,
        watcher: StreamWatcher | None,
        request_model: str,
        headers: CIMultiDict[str] | CIMultiDictProxy[str],
        body: Mapping[str, object] | None,
        watcher_gaps: GapTargets | None = None,
    ) -> TracedTimer:
        """The request's timer, with its span started as a child of the client's context."""
        timer = TracedTimer(
            request_id,
            labels,
            arrival_ns=arrival_ns,
            start_unix_ns=start_unix_ns,
            sink=sink,
            watcher=watcher,
            request_model=request_model,
            tracing=self,
            watcher_gaps=watcher_gaps,
        )
        try:
            parent = self._propagator.extract(headers)
            rs = self.spans.start(
                request_id,
                labels,
                request_model=request_model,
                arrival_ns=arrival_ns,
                start_unix_ns=start_unix_ns,
                parent=parent,
                body=body,
            )
            timer.request_span = rs
            timer.trace_id = rs.trace_id
        except Exception as exc:
            self.errors.record("starting a span", exc)
        return timer

    def inject(self, timer: StreamTimer, headers: CIMultiDict[str]) -> None:
        """Put the request span's context into the upstream request's headers."""
        if not isinstance(timer, TracedTimer) or timer.request_span is None:
            return
        try:
            for key in TRACE_HEADERS:
                headers.popall(key, None)
            ctx = set_span_in_context(timer.request_span.span)
            self._propagator.inject(headers, context=ctx)
        except Exception as exc:
            self.errors.record("injecting trace context", exc)

    def _capturing(self, timer: StreamTimer) -> bool:
        return (
            self.spans.capture_content
            and isinstance(timer, TracedTimer)
            and timer.request_span is not None
            and timer.request_span.span.is_recording()
        )

    def capture_buffer(self, timer: StreamTimer) -> bytearray | None:
        """With ``--capture-content``, the buffer the relay copies the body into (at most
        ``CAPTURE_BYTES``); ``None`` when nothing is captured."""
        if not self._capturing(timer):
            return None
        assert isinstance(timer, TracedTimer)
        captured = Captured()
        timer.capture = captured
        return captured.data

    def finished(self, timer: TracedTimer, record: RequestRecord) -> None:
        """Complete the span of a finished request."""
        rs = timer.request_span
        if rs is None:
            return
        try:
            output = None
            if timer.capture is not None and timer.capture.data:
                output = output_messages(bytes(timer.capture.data), streamed=record.streamed)
            self.spans.finish(rs, record, output)
        except Exception as exc:
            self.errors.record("ending a span", exc)

    def sweep(self, now_ns: int) -> None:
        """End lingering spans whose time is up."""
        try:
            self.spans.sweep(now_ns)
        except Exception as exc:
            self.errors.record("ending lingering spans", exc)

    def close(self) -> None:
        """End every lingering span (before the tracer provider shuts down)."""
        try:
            self.spans.close()
        except Exception as exc:
            self.errors.record("ending lingering spans", exc)
