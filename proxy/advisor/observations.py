"""What the advisor keeps of one backend's streams: bounded windows, O(1) per token.

Pure: nanosecond stamps in (the ``StreamWatcher`` calls, plus the ``Sink``'s request
and prefill records for prompt sizes), a frozen ``ObservationSnapshot`` out.

Two kinds of evidence, told apart as the stamps arrive:

- *Clean decode gaps*: a gap of a stream during which no prefill window
  (forwarded -> first token of any request) was open. The engine computed
  only decode steps, so the gap is one decode step at ``n`` decoding streams
  (``n`` = streams past their first token, this one included). Kept per ``n``,
  the newest ``CLEAN_PER_COUNT`` of each.
- *Busy periods*: from the first window that opens while none is, to
  ``MARGIN_NS`` after the last one closes, every gap of every stream. A period
  holding exactly one window is what one prompt did to the others: its
  *reference streams* (decoding before it opened, still decoding when it
  closed) show each step that carried a piece of it. A period with several
  windows cannot be split between them and is only counted.

Per gap the work is a few dictionary and deque operations; a period's gaps
are sorted into a ``WindowObservation`` only when a snapshot is taken (once a
second, off the token path). Memory: ``CLEAN_PER_COUNT x MAX_COUNTS`` gaps,
``MAX_PERIOD_GAPS`` gaps of the open period, ``MAX_DONE`` closed periods
awaiting compression, ``MAX_WINDOWS`` window observations, ``MAX_PROMPTS`` prompt sizes.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import ClassVar

from proxy.core.records import Backend, PrefillRecord, RequestLabels, RequestRecord, StallRecord

MARGIN_NS = 60_000_000
"""A busy period keeps collecting gaps this long after its last first token (ns):
the other streams' tokens of the step that produced it may be read a little later."""
CLEAN_PER_COUNT = 256
"""Clean decode gaps kept per number of decoding streams."""
MAX_COUNTS = 512
"""Distinct numbers of decoding streams kept."""
MAX_PERIOD_GAPS = 8192
"""Gaps one busy period collects at most (beyond: the period is not used)."""
MAX_REFERENCES = 8
"""Reference streams kept per window observation."""
REFERENCE_TOLERANCE_NS = 25_000_000
"""Most a stream's token of the culprit's last prefill step may be read *before* its first
token (ns): the engine emits them together, the proxy reads the sockets one after another."""
MAX_DONE = 16
"""Closed busy periods awaiting compression."""
MAX_WINDOWS = 128
"""Window observations kept (newest)."""
MAX_PROMPTS = 4096
"""Prompt sizes kept (newest requests)."""
MAX_STREAM_COUNTS = 4096
"""Samples of the number of decoding streams kept (one per gap, newest)."""


@dataclass(frozen=True, slots=True)
class GapSample:
    """One gap of a reference stream inside a busy period."""

    start_ns: int
    """The output event before the gap."""
    end_ns: int
    """The output event that ended it."""
    streams: int
    """Streams decoding when it ended (the reference stream included)."""


@dataclass(frozen=True, slots=True)
class WindowObservation:
    """One prefill window alone in its busy period, and what the other streams did meanwhile."""

    request_id: str
    """The request whose prompt was prefilled."""
    forwarded_ns: int
    """``tf``: sent upstream."""
    first_token_ns: int
    """``t1``: its first output event."""
    decoding_at_start: int
    """Streams decoding when it was forwarded."""
    references: tuple[tuple[GapSample, ...], ...]
    """Per reference stream, its gaps that ended after ``tf`` (up to ``MARGIN_NS`` past ``t1``)."""


@dataclass(frozen=True, slots=True)
class PromptSize:
    """What the advisor knows of one request's prompt."""

    uncached_tokens: int
    """Prompt tokens the backend had to compute (cached ones left out)."""
    from_usage: bool
    """From the backend's ``usage`` (else the proxy's estimate from the body)."""


@dataclass(frozen=True, slots=True)
class ObservationSnapshot:
    """Everything the fit reads, copied out at one moment."""

    backend: Backend
    """The upstream observed."""
    now_ns: int
    """The newest stamp seen."""
    clean_gaps_ns: dict[int, tuple[int, ...]]
    """Clean decode gaps by number of decoding streams."""
    windows: tuple[WindowObservation, ...]
    """Prefill windows alone in their busy period, oldest first."""
    prompts: dict[str, PromptSize]
    """Prompt sizes by request id."""
    recent_prompts: tuple[tuple[int, int], ...]
    """(finished at ns, uncached prompt tokens) of recent requests, oldest first."""
    stream_counts: tuple[int, ...]
    """Decoding streams at each recent gap (a gap-weighted sample)."""
    overlapping_periods: int
    """Busy periods not used: several windows overlapped, or a window never produced output."""
    stalls: int
    """Stalls the backend view reported."""
    response_model: str = ""
    """The ``model`` the backend's newest finished response named (empty: none yet)."""


class _Period:
    """One busy period being collected.

    Its gaps are columns, not a tuple each: a thousand streams opening at once
    keep one period open with ``MAX_PERIOD_GAPS`` gaps in it, 32 bytes a gap
    here against ~140 as tuples of int objects. Only its first window is kept
    whole: a second one spoils the period (it cannot be split between them),
    so from then on only the open windows are known, and no gaps. Under
    continuous load a period never closes, so nothing in it may grow with the
    requests it has seen.
    """

    __slots__ = (
        "first_id",
        "first_t1",
        "first_tf",
        "gap_ids",
        "gap_stamps",
        "last_first_token_ns",
        "open",
        "spoiled",
        "windows",
    )

    def __init__(self) -> None:
        self.open: dict[str, None] = {}  # windows not closed yet (at most the requests in flight)
        self.windows = 0  # windows opened in the period
        self.first_id = ""  # the first window: request, tf, t1 (-1 while open)
        self.first_tf = -1
        self.first_t1 = -1
        self.gap_ids: list[str] = []  # the stream of each gap
        self.gap_stamps = array("q")  # start_ns, end_ns, decoding streams: three per gap
        self.last_first_token_ns = -1
        self.spoiled = False

    def spoil(self) -> None:
        """The period will only be counted: its gaps are let go."""
        self.spoiled = True
        self.gap_ids = []
        self.gap_stamps = array("q")


class AdvisorObservations:
    """A ``StreamWatcher`` and ``Sink`` of one backend keeping the advisor's evidence."""

    def __init__(self, backend: Backend) -> None:
        """Nothing observed yet."""
        self.backend = backend
        """The upstream observed."""
        self._now_ns = 0
        self._active: dict[str, None] = {}
        self._last_close_ns = -1
        self._period: _Period | None = None
        self._done: deque[_Period] = deque(maxlen=MAX_DONE)
        self._clean: dict[int, deque[int]] = {}
        self._windows: deque[WindowObservation] = deque(maxlen=MAX_WINDOWS)
        self._prompts: OrderedDict[str, PromptSize] = OrderedDict()
        self._recent: deque[tuple[int, int]] = deque(maxlen=MAX_PROMPTS)
        self._counts: deque[int] = deque(maxlen=MAX_STREAM_COUNTS)
        self._overlapping = 0
        self._stalls = 0
        self._response_model = ""

    # -- StreamWatcher -------------------------------------------------------------

    def forwarded(self, request_id: str, forwarded_ns: int) -> None:
        """A window opens; a busy period starts unless one is being collected."""
        self.flush(forwarded_ns)  # a period past its margin is closed first
        period = self._period
        if period is None:
            period = self._period = _Period()
        if request_id == period.first_id:  # a retry: the window restarts
            period.first_tf = forwarded_ns
            return
        if request_id in period.open:
            return
        period.open[request_id] = None
        period.windows += 1
        if period.windows == 1:
            period.first_id = request_id
            period.first_tf = forwarded_ns
        elif not period.spoiled:
            period.spoil()

    def first_token(self, request_id: str, first_token_ns: int) -> None:
        """A window closes and its stream starts decoding."""
        self._tick(first_token_ns)
        self._active[request_id] = None
        self._close(request_id, first_token_ns, produced=True)

    def gap(self, request_id: str, start_ns: int, end_ns: int) -> None:
        """One gap: into the busy period, or a clean decode sample."""
        if end_ns > self._now_ns:  # noqa: PLR1730 - ``_tick`` inlined: a comparison per token, no call
            self._now_ns = end_ns
        n = len(self._active)
        self._counts.append(n)
        period = self._period
        if period is not None:
            if period.open or end_ns <= period.last_first_token_ns + MARGIN_NS:
                if period.spoiled:
                    return
                if len(period.gap_ids) < MAX_PERIOD_GAPS:
                    period.gap_ids.append(request_id)
                    period.gap_stamps.extend((start_ns, end_ns, n))
                else:
                    period.spoil()
                return
            self._done.append(period)
            self._period = None
        if start_ns >= self._last_close_ns and end_ns > start_ns:
            samples = self._clean.get(n)
            if samples is None:
                if len(self._clean) >= MAX_COUNTS:
                    return
                samples = self._clean[n] = deque(maxlen=CLEAN_PER_COUNT)
            samples.append(end_ns - start_ns)

    def finished(self, request_id: str, end_ns: int) -> None:
        """A stream ended (a window that never produced output spoils its period)."""
        self._tick(end_ns)
        self._active.pop(request_id, None)
        self._close(request_id, end_ns, produced=False)

    # -- records (through ``ObservationSink``) ------------------------------------------

    def request_finished(self, record: RequestRecord) -> None:
        """The backend's prompt count (minus cached tokens) of a streamed request, and the
        model its response named (the engine's own name for what it serves)."""
        if record.response_model:
            self._response_model = record.response_model
        if record.prompt_tokens is None or record.first_token_ns is None:
            return
        uncached = max(0, record.prompt_tokens - (record.cached_tokens or 0))
        self._remember(record.request_id, PromptSize(uncached, from_usage=True))
        self._recent.append((record.end_ns, uncached))

    def prefill_done(self, record: PrefillRecord) -> None:
        """The proxy's estimate of the prompt, until the backend's count comes."""
        hint = record.prompt_tokens_hint
        if hint is not None and record.request_id not in self._prompts:
            self._remember(record.request_id, PromptSize(hint, from_usage=False))

    def stall(self, record: StallRecord) -> None:
        """Counted (reported with the fit)."""
        self._stalls += 1

    # -- off the token path -----------------------------------------------------------

    def flush(self, now_ns: int) -> None:
        """Move "now" on: a busy period whose margin passed with no gap is closed."""
        self._tick(now_ns)
        period = self._period
        if (
            period is not None
            and not period.open
            and now_ns > period.last_first_token_ns + MARGIN_NS
        ):
            self._done.append(period)
            self._period = None

    def snapshot(self, now_ns: int | None = None) -> ObservationSnapshot:
        """Compress closed periods and copy out what the fit needs (O(kept evidence))."""
        if now_ns is not None:
            self.flush(now_ns)
        while self._done:
            self._compress(self._done.popleft())
        return ObservationSnapshot(
            backend=self.backend,
            now_ns=self._now_ns,
            clean_gaps_ns={n: tuple(g) for n, g in self._clean.items()},
            windows=tuple(self._windows),
            prompts=dict(self._prompts),
            recent_prompts=tuple(self._recent),
            stream_counts=tuple(self._counts),
            overlapping_periods=self._overlapping,
            stalls=self._stalls,
            response_model=self._response_model,
        )

    @property
    def tracked(self) -> dict[str, int]:
        """Sizes of every internal collection (to check that memory stays bounded)."""
        period = self._period
        return {
            "active_streams": len(self._active),
            "period_gaps": 0 if period is None else len(period.gap_ids),
            "period_open_windows": 0 if period is None else len(period.open),
            "done_periods": len(self._done),
            "clean_gaps": sum(len(g) for g in self._clean.values()),
            "windows": len(self._windows),
            "prompts": len(self._prompts),
            "stream_counts": len(self._counts),
        }

    # -- internals --------------------------------------------------------------------

    def _tick(self, stamp_ns: int) -> None:
        self._now_ns = max(self._now_ns, stamp_ns)

    def _close(self, request_id: str, stamp_ns: int, *, produced: bool) -> None:
        period = self._period
        if period is None:
            return
        if request_id not in period.open:
            return
        del period.open[request_id]
        if request_id == period.first_id:
            period.first_t1 = stamp_ns
        if not produced and not period.spoiled:
            period.spoil()
        period.last_first_token_ns = max(period.last_first_token_ns, stamp_ns)
        self._last_close_ns = max(self._last_close_ns, stamp_ns)

    def _remember(self, request_id: str, size: PromptSize) -> None:
        self._prompts[request_id] = size
        self._prompts.move_to_end(request_id)
        if len(self._prompts) > MAX_PROMPTS:
            self._prompts.popitem(last=False)

    def _compress(self, period: _Period) -> None:
        if period.spoiled or period.windows != 1 or period.first_t1 < 0:
            self._overlapping += 1
            return
        request_id, tf, t1 = period.first_id, period.first_tf, period.first_t1
        by_stream: dict[str, list[tuple[int, int, int]]] = {}
        stamps = period.gap_stamps
        for k, rid in enumerate(period.gap_ids):
            if rid != request_id:
                i = 3 * k
                by_stream.setdefault(rid, []).append((stamps[i], stamps[i + 1], stamps[i + 2]))
        references: list[tuple[GapSample, ...]] = []
        decoding_at_start = 0
        for gaps in by_stream.values():
            if gaps[0][0] > tf:
                continue  # started decoding inside the window: not a reference
            decoding_at_start += 1
            # Its token of the last prefill step may be read just before the first token
            # (and its next step come after the margin): within half its shortest gap.
            tol_ns = min(REFERENCE_TOLERANCE_NS, min(e - s for s, e, _ in gaps) // 2)
            if gaps[-1][1] < t1 - tol_ns or len(references) >= MAX_REFERENCES:
                continue  # stopped before the first token: cannot show every step
            references.append(tuple(GapSample(s, e, n) for s, e, n in gaps if e > tf))
        self._windows.append(
            WindowObservation(request_id, tf, t1, decoding_at_start, tuple(references))
        )


class ObservationSink:
    """The ``Sink`` side of ``AdvisorObservations``: prompt sizes and stalls, nothing per token."""

    __slots__ = ("observations",)
    takes_gaps: ClassVar[bool] = False
    """Gaps come through the watcher face: fan-outs skip this sink per token."""

    def __init__(self, observations: AdvisorObservations) -> None:
        self.observations = observations
        """Where the records go."""

    def request_started(self, labels: RequestLabels) -> None:
        """Not used."""

    def first_token(
        self,
        labels: RequestLabels,
        ttft_s: float,
        upstream_ttft_s: float | None,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """Not used (the watcher's ``first_token`` carries the stamp)."""

    def gap(self, labels: RequestLabels, gap_s: float, request_id: str, trace_id: str = "") -> None:
        """Not used (the watcher's ``gap`` carries the stamps)."""

    def request_finished(self, record: RequestRecord) -> None:
        """Its prompt size."""
        self.observations.request_finished(record)

    def decoder_error(self, backend: Backend, kind: str) -> None:
        """Not used."""

    def unobserved(self, backend: Backend, reason: str) -> None:
        """Not used."""

    def stall(self, record: StallRecord) -> None:
        """Counted."""
        self.observations.stall(record)

    def prefill_done(self, record: PrefillRecord) -> None:
        """The prompt size estimate."""
        self.observations.prefill_done(record)
