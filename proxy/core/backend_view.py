"""The backend view: every stream and prefill window of one upstream; stalls and culprits.

Pure: nanosecond stamps in (the ``proxy.core.timing.StreamWatcher`` calls), records
out (``Sink.stall``, ``Sink.prefill_done``) plus one INFO log line per culprit.
No clock: "now" is the newest stamp seen (``flush`` moves it on when idle).

Detection is ``proxy.core.stall_detector``. Attribution of a stall of stream S,
gap ``[gs, ge]``, against the prefill windows ``[tf, t1]`` of the other
requests, with ``tol = min(stall_tolerance, baseline / 2)``:

1. *Enders*: windows whose first token arrived during the stall or just after
   it, ``gs + tol < t1 <= ge + tol`` (and forwarded before ``ge``). Without
   chunked prefill the step that froze S is exactly the one that computed the
   culprit's prompt, so its first token comes out with S's next token (read a
   little before or after it); a request merely queued behind it gets its
   first token a whole step (or prefill) later and is not named.
2. Else the *earliest forwarded* window still open at ``ge + tol`` and
   forwarded by ``gs + tol``: with chunked prefill a long prompt stalls several
   steps before its first token; engines schedule prefill first come, first
   served, so the oldest open window is the one being computed.
3. Else ``unattributed``.

A stall is decided ``tol`` after its end (a culprit's first token may arrive
just after S's token). A request's ``PrefillRecord`` is final once its first
token is ``tol`` old, no stall is pending, and every open stream has had a
token since (no later stall can overlap its window); or, at the latest,
``stall_max_delay`` after its first token.

Memory is bounded: streams and open windows by the requests in flight; closed
windows and pending stalls by time (``max_delay``). Per gap the work is O(1)
amortised; deciding a stall costs O(windows closed within a few ms).

A window counts the distinct streams it stalled without remembering them: a
stream's stalls are decided in order, and the windows named for them come in
runs that never return (a window is the oldest open one until its first token,
then an ender once at most, then never again), so a stream remembers only the
last window the oldest-open rule named for it. A set of stream ids per window
held a pair per (window, stalled stream): with a thousand streams opening at
once on a warm backend, 20 KiB per stream.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Mapping

from proxy.core.records import (
    Backend,
    PrefillRecord,
    RequestLabels,
    Sink,
    StallCause,
    StallRecord,
    split_stream_id,
)
from proxy.core.stall_detector import StallDetector, StallSettings

log = logging.getLogger("tokenstamp.stalls")

_MAX_DESCRIBED = 4096
_MAX_PENDING = 65536
_RECENT_CULPRITS = 64
_NEVER = 1 << 62  # later than any stamp (nanoseconds: 146 years)
_RECHECK = -_NEVER  # a due time every "now" is past: examine the closed windows again


class _Window:
    """One request's prefill window and what has been pinned on it."""

    __slots__ = (
        "cost_ns",
        "first_token_ns",
        "forwarded_ns",
        "labels",
        "prompt_tokens_hint",
        "request_id",
        "stalled_streams",
        "stalls",
    )

    def __init__(
        self, request_id: str, forwarded_ns: int, labels: RequestLabels | None, hint: int | None
    ) -> None:
        self.request_id = request_id
        self.forwarded_ns = forwarded_ns  # 0 until forwarded (a described request's window)
        self.first_token_ns: int | None = None
        self.labels = labels
        self.prompt_tokens_hint = hint
        self.stalls = 0
        self.stalled_streams = 0
        self.cost_ns = 0.0


def _tenant_of(window: _Window) -> str:
    return window.labels.tenant if window.labels is not None else ""


_UNSTREAMED = _Window("", 0, None, None)
"""What ``describe`` keeps for a request described as not streamed (it gets no window)."""


class _Pending:
    """A gap waiting for its verdict (no baseline yet) or for its culprits."""

    __slots__ = ("baseline_ns", "end_ns", "gap_ns", "request_id", "start_ns", "threshold_ns")

    def __init__(self, request_id: str, start_ns: int, end_ns: int) -> None:
        self.request_id = request_id
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.gap_ns = end_ns - start_ns
        self.baseline_ns: int | None = None
        self.threshold_ns = 0


class BackendView:
    """Stall detection and prefill attribution for one upstream (a ``StreamWatcher``)."""

    def __init__(self, backend: Backend, sink: Sink, settings: StallSettings | None = None) -> None:
        """An empty view reporting to ``sink``; ``settings`` default to ``StallSettings()``."""
        self.backend = backend
        """The upstream this view watches (labels of its stall metrics)."""
        self.settings = settings if settings is not None else StallSettings()
        """Detection and attribution knobs."""
        self._sink = sink
        self._detector = StallDetector(self.settings)
        self._tol_ns = self.settings.tolerance_ns
        self._delay_ns = self.settings.max_delay_ns
        self._now_ns: int | None = None
        # request -> its window made by ``describe`` (labels and hint; opened by ``forwarded``)
        self._described: OrderedDict[str, _Window] = OrderedDict()
        self._open: OrderedDict[str, _Window] = OrderedDict()  # forwarded order
        self._closed: deque[_Window] = deque()  # first-token order, not yet reported
        # The head of ``_closed`` cannot be final while "now" is at or before this: its
        # first token plus the shorter of tol and max_delay (``_NEVER`` when none is closed).
        # Per token ``_settle_windows`` is then one comparison, not a call.
        self._closed_wait_ns = min(self._tol_ns, self._delay_ns)
        self._closed_due_ns = _NEVER
        # While the head waits on silent streams (their gaps started inside the window), the
        # due time is the head's last chance (``max_delay``) and this is the last of them in
        # ``_active``'s order: only its next token or its end can release the head sooner,
        # and either sets the due time back (``_RECHECK``), so the usual token costs one
        # string comparison, and the head is looked at again once, not once per silent one.
        self._blocker: str | None = None
        # The head waits on pending stalls: re-examined when the last one is decided.
        self._blocked_by_pending = False
        self._active: OrderedDict[str, int] = OrderedDict()  # stream -> last token, oldest first
        # stream -> last window the oldest-open rule named for it (None: none yet); a
        # finished stream's entry stays until the stalls pending at its end are decided
        self._named: dict[str, _Window | None] = {}
        self._retiring: deque[tuple[int, str]] = deque()  # (gaps appended by then, stream)
        # stream -> its tenant, from forwarding until it is forgotten (only when labelled)
        self._tenants: dict[str, str] = {}
        self._appended = 0  # gaps ever appended to _pending
        self._pending: deque[_Pending] = deque()
        self._unlabelled = RequestLabels("", "", backend)
        self._recent: deque[PrefillRecord] = deque(maxlen=_RECENT_CULPRITS)

    # -- what the app tells ----------------------------------------------------------

    def describe(
        self,
        request_id: str,
        labels: RequestLabels,
        *,
        prompt_tokens_hint: int | None = None,
        streamed: bool = True,
    ) -> None:
        """Before ``forwarded``: the request's labels, prompt size estimate, stream flag.

        A request described as not streamed has no visible first token, so it
        gets no prefill window (it can never be named, nor block the FIFO rule).
        """
        self._described[request_id] = (
            _Window(request_id, 0, labels, prompt_tokens_hint) if streamed else _UNSTREAMED
        )
        if len(self._described) > _MAX_DESCRIBED:
            self._described.popitem(last=False)

    # -- StreamWatcher ---------------------------------------------------------------

    def forwarded(self, request_id: str, forwarded_ns: int) -> None:
        """The request went upstream: its prefill window opens."""
        try:
            self._advance(forwarded_ns)
            window = self._open.get(request_id)
            if window is not None:  # sent again (a retry): the window restarts
                window.forwarded_ns = forwarded_ns
                self._open.move_to_end(request_id)
                return
            window = self._described.pop(request_id, None)
            if window is None:
                window = _Window(request_id, forwarded_ns, None, None)
            elif window is _UNSTREAMED:
                return
            else:
                window.forwarded_ns = forwarded_ns
                labels = window.labels
                if labels is not None and labels.tenant:
                    self._tenants[request_id] = labels.tenant
            self._open[request_id] = window
        except Exception:  # telemetry never breaks traffic
            log.exception("stall view: forwarded failed")

    def first_token(self, request_id: str, first_token_ns: int) -> None:
        """The request's first output event: its window closes, its stream starts."""
        try:
            self._advance(first_token_ns)
            window = self._open.pop(request_id, None)
            if window is not None:
                window.first_token_ns = first_token_ns
                if not self._closed:
                    self._closed_due_ns = first_token_ns + self._closed_wait_ns
                self._closed.append(window)
            active = self._active
            if request_id == self._blocker or request_id in active:
                # The silent stream spoke, or a stream already seen (a gap before its first
                # token) is set in place, not moved behind the blocker: look again.
                self._closed_due_ns = _RECHECK
            active[request_id] = first_token_ns
        except Exception:
            log.exception("stall view: first_token failed")

    def gap(self, request_id: str, start_ns: int, end_ns: int) -> None:
        """A gap of one stream ended: judge it; a stall waits ``tol`` for its culprits."""
        try:
            now = self._now_ns
            if now is None or end_ns > now:
                now = self._now_ns = end_ns
            if self._pending or now > self._closed_due_ns:  # ``_advance``'s tests, inlined
                self._advance(end_ns)
            active = self._active
            active[request_id] = end_ns
            active.move_to_end(request_id)
            if request_id == self._blocker:  # the silent stream spoke: the head may go
                self._closed_due_ns = _RECHECK
            if end_ns <= start_ns:
                return  # two events of one read: not a gap anyone could see
            gap_ns = end_ns - start_ns
            if self._detector.learn_quiet(request_id, gap_ns):
                return  # under the floor: never a stall (the usual token)
            verdict = self._detector.observe(request_id, gap_ns)
            if verdict.baseline_ns is None or verdict.stall:
                pending = _Pending(request_id, start_ns, end_ns)
                if verdict.threshold_ns is not None:
                    pending.baseline_ns = verdict.baseline_ns
                    pending.threshold_ns = verdict.threshold_ns
                self._pending.append(pending)
                self._appended += 1
                if len(self._pending) > _MAX_PENDING:
                    self._pending.popleft()
        except Exception:
            log.exception("stall view: gap failed")

    def finished(self, request_id: str, end_ns: int) -> None:
        """The stream ended; a request that never produced output loses its window."""
        try:
            self._advance(end_ns)
            self._described.pop(request_id, None)
            self._open.pop(request_id, None)
            self._active.pop(request_id, None)
            if request_id == self._blocker:  # the silent stream ended: the head may go
                self._closed_due_ns = _RECHECK
            if self._pending:  # a stall of it may still be decided
                self._named.setdefault(request_id, None)
                self._retiring.append((self._appended, request_id))
            else:
                self._named.pop(request_id, None)
                self._tenants.pop(request_id, None)
            self._detector.close(request_id)
            self._advance(end_ns)  # it may have been the oldest stream holding a record back
        except Exception:
            log.exception("stall view: finished failed")

    def flush(self, now_ns: int) -> None:
        """Move "now" to ``now_ns`` and report whatever became final (idle backend, tests)."""
        try:
            self._advance(now_ns)
        except Exception:
            log.exception("stall view: flush failed")

    # -- introspection ----------------------------------------------------------------

    @property
    def open_streams(self) -> int:
        """Streams past their first token and not finished."""
        return len(self._active)

    @property
    def recent_culprits(self) -> tuple[PrefillRecord, ...]:
        """The last 64 requests whose prefill stalled at least one stream, oldest first."""
        return tuple(self._recent)

    @property
    def tracked(self) -> Mapping[str, int]:
        """Sizes of every internal collection (to check that memory stays bounded)."""
        return {
            "described": len(self._described),
            "open_windows": len(self._open),
            "closed_windows": len(self._closed),
            "active_streams": len(self._active),
            "named_streams": len(self._named),
            "retiring_streams": len(self._retiring),
            "tenants": len(self._tenants),
            "pending_gaps": len(self._pending),
            "baselines": len(self._detector),
        }

    # -- internals --------------------------------------------------------------------

    def _advance(self, stamp_ns: int) -> None:
        now = self._now_ns
        if now is None or stamp_ns > now:
            now = self._now_ns = stamp_ns
        # Called for every stream event: skip the calls when nothing waits.
        if self._pending:
            self._settle_gaps(now)
            if self._blocked_by_pending and not self._pending:
                self._closed_due_ns = _RECHECK
        if now > self._closed_due_ns:
            self._settle_windows(now)

    def _settle_gaps(self, now: int) -> None:
        pending = self._pending
        while pending:
            head = pending[0]
            if head.baseline_ns is None:
                verdict = self._detector.judge_late(head.gap_ns)
                if verdict.baseline_ns is None:
                    if now - head.end_ns <= self._delay_ns:
                        break
                    pending.popleft()  # never judged: too early to tell, dropped
                    continue
                if not verdict.stall:
                    pending.popleft()
                    continue
                head.baseline_ns = verdict.baseline_ns
                head.threshold_ns = verdict.threshold_ns or 0
            if now - head.end_ns <= self._tol(head.baseline_ns):
                break
            pending.popleft()
            self._decide(head, head.baseline_ns)
        if self._retiring:
            self._retire()

    def _retire(self) -> None:
        """Forget finished streams once every gap pending at their end is decided."""
        retiring = self._retiring
        decided = self._appended - len(self._pending)
        while retiring and retiring[0][0] <= decided:
            request_id = retiring.popleft()[1]
            self._named.pop(request_id, None)
            self._tenants.pop(request_id, None)

    def _tol(self, baseline_ns: int) -> int:
        return min(self._tol_ns, baseline_ns // 2)

    def _decide(self, stall: _Pending, baseline_ns: int) -> None:
        culprits, oldest_rule = self._culprits(stall, self._tol(baseline_ns))
        request_id, choice = split_stream_id(stall.request_id)
        record = StallRecord(
            request_id=request_id,
            backend=self.backend,
            start_ns=stall.start_ns,
            end_ns=stall.end_ns,
            baseline_ns=baseline_ns,
            threshold_ns=stall.threshold_ns,
            cause=StallCause.PREFILL if culprits else StallCause.UNATTRIBUTED,
            culprits=tuple(w.request_id for w in culprits),
            tenant=self._tenants.get(request_id, ""),
            culprit_tenant=_tenant_of(culprits[0]) if culprits else "",
            choice=choice,
        )
        excess_ns = max(0, stall.gap_ns - baseline_ns)
        named = self._named.get(stall.request_id)
        for window, share in zip(culprits, _shares(culprits), strict=True):
            window.cost_ns += excess_ns * share
            window.stalls += 1
            if window is not named:  # else it stalled this stream before: counted then
                window.stalled_streams += 1
        if oldest_rule and (stall.request_id in self._active or stall.request_id in self._named):
            self._named[stall.request_id] = culprits[0]
        self._report_stall(record)

    def _culprits(self, stall: _Pending, tol: int) -> tuple[list[_Window], bool]:
        """The windows to blame, and whether the oldest-open rule (not the enders) chose them."""
        start, end = stall.start_ns, stall.end_ns
        enders: list[_Window] = []
        oldest: _Window | None = None  # earliest forwarded window still open at end + tol
        for window in reversed(self._closed):
            t1 = window.first_token_ns
            assert t1 is not None
            if t1 > end + tol:
                if window.forwarded_ns <= start + tol and (
                    oldest is None or window.forwarded_ns < oldest.forwarded_ns
                ):
                    oldest = window
                continue
            if t1 <= start + tol:
                break
            if window.request_id != stall.request_id and window.forwarded_ns < end:
                enders.append(window)
        if enders:
            return enders, False
        head = next(iter(self._open.values()), None)
        if (
            head is not None
            and head.forwarded_ns <= start + tol
            and (oldest is None or head.forwarded_ns < oldest.forwarded_ns)
        ):
            oldest = head
        return ([], False) if oldest is None else ([oldest], True)

    def _settle_windows(self, now: int) -> None:
        """Report the closed windows that became final, oldest first; for the first that
        is not, set when (or on which event) to look again.

        The head waits while "now" is within ``tol`` of its first token, while stalls
        are pending, or while the stream silent the longest (its own left out) has had
        no token since ``t1 + tol``; never past ``max_delay``. The streams silent since
        then lead ``_active`` (a stream moves to the end on each token, new ones join at
        the end: nothing passes them), and the last of that run is the last of them to
        leave it: the head cannot go before it speaks or ends, so it is remembered
        (``_blocker``) and the head looked at again then, not on every event, nor each
        time the one in front speaks (64 streams: about 8 looks a window became 1).
        """
        closed = self._closed
        tol = self._tol_ns
        self._blocker = None
        self._blocked_by_pending = False
        while closed:
            window = closed[0]
            t1 = window.first_token_ns
            assert t1 is not None
            if now - t1 <= self._delay_ns:
                if now - t1 <= tol:
                    self._closed_due_ns = t1 + self._closed_wait_ns
                    return
                last_chance_ns = t1 + self._delay_ns
                if self._pending:
                    self._closed_due_ns = last_chance_ns
                    self._blocked_by_pending = True
                    return
                silent = self._last_silent(window.request_id, t1 + tol)
                if silent is not None:
                    # streams' gaps started inside the window and have not ended
                    self._closed_due_ns = last_chance_ns
                    self._blocker = silent
                    return
            closed.popleft()
            self._report_prefill(window, t1)
        self._closed_due_ns = _NEVER

    def _last_silent(self, request_id: str, since_ns: int) -> str | None:
        """The last of the streams leading ``_active`` that have had no token after
        ``since_ns``, ``request_id``'s own left out; ``None`` when the first other one has.

        Oldest first, up to the first that spoke since: one step per silent stream.
        """
        last = None
        for rid, last_ns in self._active.items():
            if rid == request_id:
                continue
            if last_ns > since_ns:
                break
            last = rid
        return last

    def _report_stall(self, record: StallRecord) -> None:
        try:
            self._sink.stall(record)
        except Exception:  # an exporter failure never breaks traffic
            log.exception("stall view: sink.stall failed")

    def _report_prefill(self, window: _Window, first_token_ns: int) -> None:
        record = PrefillRecord(
            request_id=window.request_id,
            labels=window.labels if window.labels is not None else self._unlabelled,
            forwarded_ns=window.forwarded_ns,
            first_token_ns=first_token_ns,
            prompt_tokens_hint=window.prompt_tokens_hint,
            stalls=window.stalls,
            stalled_streams=window.stalled_streams,
            stutter_cost_s=window.cost_ns / 1e9,
        )
        if record.stalled_streams:
            self._recent.append(record)
            log.info(
                "prefill stutter: request_id=%s prompt_tokens_est=%s "
                "streams_stalled=%d stalls=%d stutter_cost_s=%.3f prefill_window_s=%.3f "
                "backend=%s",
                record.request_id,
                "-" if record.prompt_tokens_hint is None else record.prompt_tokens_hint,
                record.stalled_streams,
                record.stalls,
                record.stutter_cost_s,
                record.window_s,
                self.backend.address,
            )
        try:
            self._sink.prefill_done(record)
        except Exception:
            log.exception("stall view: sink.prefill_done failed")


def _shares(culprits: list[_Window]) -> list[float]:
    """How a stall's cost is split: by estimated prompt size when all are known, else evenly."""
    if not culprits:
        return []
    hints = [w.prompt_tokens_hint for w in culprits]
    known = [h for h in hints if h is not None and h > 0]
    if len(known) == len(hints) and known:
        total = sum(known)
        return [h / total for h in known]
    return [1 / len(culprits)] * len(culprits)
