"""What the ``/timeline`` page shows: recent streams, stalls and prefill windows, bounded.

``TimelineBuffer`` is a ``StreamWatcher`` (token stamps of every stream) and a
subscriber of the proxy's fan-out (stall and prefill records, live phases, and
each finished request's metadata). It keeps, for one backend, the streams
open now or finished within the last ``window_s`` seconds, each with its
token stamps of that window, plus the stalls and prefill windows of that
window, and turns them into JSON-ready feed messages: a full snapshot for a
new reader, then deltas holding only what changed since that reader's last
message (``TimelineCursor``).

A reasoning model's stream has two phases, thinking then answering, which the
page colours apart. Where they meet is learnt live, when the fan-out's ``phase``
reports the first answer event (at the tick just stamped) and the reasoning
before it; a finished request's record then gives the exact stamps (its first
reasoning and first answer events; also for a request that only reasoned).

Memory is bounded by count whatever the traffic (``TimelineSettings``: streams,
stamps per stream, stalls, prefills) and trimmed by time whenever a stream
starts or a feed message is built. Only metadata is kept: request id, model,
prompt size, times. Never prompt or completion text, never a header.

Pure: no framework imports, no clock (stamps and ``now_ns`` come in).
Times in feed messages are integer microseconds since ``origin_ns``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, ClassVar

from proxy.core.records import (
    Backend,
    Phase,
    PrefillRecord,
    RequestLabels,
    RequestRecord,
    StallRecord,
)

_MAX_MODEL_CHARS = 128
_PRUNE_EVERY_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class TimelineSettings:
    """How much a ``TimelineBuffer`` keeps."""

    window_s: float = 30.0
    """Seconds of history kept and shown (``--timeline-window``)."""
    max_streams: int = 512
    """Streams kept at most (open ones first; the oldest finished ones go)."""
    max_ticks: int = 2048
    """Token stamps kept per stream (the newest)."""
    max_stalls: int = 4096
    """Stall records kept."""
    max_prefills: int = 1024
    """Prefill records kept."""

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError(f"timeline window_s: must be > 0, got {self.window_s!r}")
        for name in ("max_streams", "max_ticks", "max_stalls", "max_prefills"):
            if getattr(self, name) < 1:
                raise ValueError(f"timeline {name}: must be >= 1")

    @property
    def window_ns(self) -> int:
        """``window_s`` in nanoseconds."""
        return int(self.window_s * 1e9)


class _Stream:
    """One stream's stamps and metadata."""

    __slots__ = (
        "answer_ns",
        "answer_ttft_ns",
        "end_ns",
        "first_token_ns",
        "forwarded_ns",
        "last_ns",
        "model",
        "outcome",
        "prefill",
        "prompt_estimated",
        "prompt_tokens",
        "reasoning_ns",
        "reasoning_s",
        "reasoning_tokens",
        "request_id",
        "stalls",
        "ticks",
        "total",
        "ttft_ns",
        "version",
        "worst_gap_ns",
    )

    def __init__(self, request_id: str, forwarded_ns: int, max_ticks: int) -> None:
        self.request_id = request_id
        self.forwarded_ns = forwarded_ns
        self.first_token_ns: int | None = None
        self.end_ns: int | None = None
        self.last_ns: int | None = None
        self.ticks: deque[int] = deque(maxlen=max_ticks)
        self.total = 0  # stamps ever appended: ``total - len(ticks)`` were dropped
        self.worst_gap_ns = 0
        self.model = ""
        self.prompt_tokens: int | None = None
        self.prompt_estimated = False
        self.ttft_ns: int | None = None
        self.outcome = ""
        self.stalls = 0  # stalls this stream suffered
        self.prefill: PrefillRecord | None = None
        self.reasoning_ns: int | None = None  # first reasoning event
        self.answer_ns: int | None = None  # first answer event
        self.answer_ttft_ns: int | None = None
        self.reasoning_s: float | None = None
        self.reasoning_tokens: int | None = None
        self.version = 0  # bumped on every metadata change


@dataclass(slots=True)
class TimelineCursor:
    """What one feed reader has already been sent (one per connection)."""

    seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per stream: (stamps sent, metadata version sent)."""
    stall_seq: int = 0
    """Sequence number of the last stall sent."""
    prefill_seq: int = 0
    """Sequence number of the last prefill record sent."""
    started: bool = False
    """A snapshot was sent; the next messages are deltas."""


class TimelineBuffer:
    """Recent streams, stalls and prefill windows of one backend (a ``StreamWatcher``, and a
    subscriber of the fan-out)."""

    takes: ClassVar[tuple[str, ...]] = ("request_finished", "phase", "stall", "prefill_done")
    """The ``Sink`` events it takes; its ``first_token`` and ``gap`` are the watcher's, which
    carry the stamps."""

    def __init__(
        self, backend: Backend, settings: TimelineSettings | None = None, *, origin_ns: int = 0
    ) -> None:
        """An empty buffer; feed times are microseconds since ``origin_ns`` (monotonic)."""
        self.backend = backend
        """The upstream whose streams this buffer keeps."""
        self.settings = settings if settings is not None else TimelineSettings()
        """What is kept."""
        self.origin_ns = origin_ns
        """Monotonic time that feed messages count from."""
        self._streams: OrderedDict[str, _Stream] = OrderedDict()  # forwarded order
        self._stalls: deque[tuple[int, StallRecord]] = deque(maxlen=self.settings.max_stalls)
        self._prefills: deque[tuple[int, PrefillRecord]] = deque(maxlen=self.settings.max_prefills)
        self._stall_seq = 0
        self._prefill_seq = 0
        self._pruned_ns: int | None = None
        self.untracked = 0
        """Streams not kept because ``max_streams`` streams were open."""

    # -- StreamWatcher ---------------------------------------------------------------

    def forwarded(self, request_id: str, forwarded_ns: int) -> None:
        """A request went upstream: its row starts with its prefill window."""
        s = self._streams.get(request_id)
        if s is not None:  # sent again (a retry): the window restarts
            s.forwarded_ns = forwarded_ns
            s.version += 1
            return
        if self._pruned_ns is None or forwarded_ns - self._pruned_ns >= _PRUNE_EVERY_NS:
            self.prune(forwarded_ns)
        if len(self._streams) >= self.settings.max_streams and not self._evict_finished():
            self.untracked += 1
            return
        self._streams[request_id] = _Stream(request_id, forwarded_ns, self.settings.max_ticks)

    def first_token(self, request_id: str, first_token_ns: int) -> None:
        """The first output event: the prefill window closes, the first tick."""
        s = self._streams.get(request_id)
        if s is None:
            return
        s.first_token_ns = first_token_ns
        s.version += 1
        s.ticks.append(first_token_ns)
        s.total += 1
        s.last_ns = first_token_ns

    def gap(self, request_id: str, start_ns: int, end_ns: int) -> None:
        """One more output event (a tick at ``end_ns``)."""
        s = self._streams.get(request_id)
        if s is None:
            return
        s.ticks.append(end_ns)
        s.total += 1
        s.last_ns = end_ns
        s.worst_gap_ns = max(s.worst_gap_ns, end_ns - start_ns)

    def finished(self, request_id: str, end_ns: int) -> None:
        """The stream ended: its row stops growing."""
        s = self._streams.get(request_id)
        if s is not None:
            s.end_ns = end_ns
            s.version += 1

    # -- subscriber: records and phases -----------------------------------------------

    def request_finished(self, record: RequestRecord) -> None:
        """Take a finished request's metadata (model, usage prompt tokens, TTFT, outcome, and
        where its reasoning and its answer began)."""
        s = self._streams.get(record.request_id)
        if s is None:
            return
        if not record.streamed and s.first_token_ns is None:
            del self._streams[record.request_id]  # no tokens to draw
            return
        s.model = (record.request_model or record.labels.model)[:_MAX_MODEL_CHARS]
        if record.prompt_tokens is not None:
            s.prompt_tokens, s.prompt_estimated = record.prompt_tokens, False
        if record.first_token_ns is not None:
            s.ttft_ns = record.first_token_ns - record.arrival_ns
        s.reasoning_ns = record.first_reasoning_ns
        s.answer_ns = record.first_answer_ns
        if record.first_answer_ns is not None:
            s.answer_ttft_ns = record.first_answer_ns - record.arrival_ns
        s.reasoning_s = record.reasoning_s
        s.reasoning_tokens = record.reasoning_tokens
        s.outcome = record.outcome.value
        s.worst_gap_ns = max(s.worst_gap_ns, record.max_gap_ns)
        s.version += 1

    def phase(
        self,
        labels: RequestLabels,
        phase: Phase,
        seconds: float,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """A live stream's first answer event (``Phase.ANSWER``, reported as that event's
        tick is stamped: the row's newest tick), then the reasoning before it
        (``Phase.REASONING``: that many seconds before the answer)."""
        s = self._streams.get(request_id)
        if s is None or s.last_ns is None or s.end_ns is not None:
            return
        if phase is Phase.ANSWER and s.answer_ns is None:
            s.answer_ns = s.last_ns
            s.answer_ttft_ns = round(seconds * 1e9)
            s.version += 1
        elif phase is Phase.REASONING and s.answer_ns is not None and s.reasoning_ns is None:
            s.reasoning_ns = s.answer_ns - round(seconds * 1e9)
            s.reasoning_s = seconds
            s.version += 1

    def stall(self, record: StallRecord) -> None:
        """Keep a stall record; the stalled stream counts it."""
        self._stall_seq += 1
        self._stalls.append((self._stall_seq, record))
        s = self._streams.get(record.request_id)
        if s is not None:
            s.stalls += 1
            s.version += 1

    def prefill_done(self, record: PrefillRecord) -> None:
        """Keep a prefill record; its stream learns its model and estimated prompt size."""
        self._prefill_seq += 1
        self._prefills.append((self._prefill_seq, record))
        s = self._streams.get(record.request_id)
        if s is None:
            return
        s.prefill = record
        if not s.model and record.labels.model:
            s.model = record.labels.model[:_MAX_MODEL_CHARS]
        if s.prompt_tokens is None and record.prompt_tokens_hint is not None:
            s.prompt_tokens, s.prompt_estimated = record.prompt_tokens_hint, True
        s.version += 1

    # -- bounds -----------------------------------------------------------------------

    def _evict_finished(self) -> bool:
        """Drop the oldest finished stream; False when every kept stream is open."""
        for rid, s in self._streams.items():
            if s.end_ns is not None:
                del self._streams[rid]
                return True
        return False

    def prune(self, now_ns: int) -> None:
        """Drop what ended before ``now_ns - window``: streams, stamps, stalls, prefills."""
        self._pruned_ns = now_ns
        cutoff = now_ns - self.settings.window_ns
        gone = [
            rid for rid, s in self._streams.items() if s.end_ns is not None and s.end_ns < cutoff
        ]
        for rid in gone:
            del self._streams[rid]
        for s in self._streams.values():
            ticks = s.ticks
            while ticks and ticks[0] < cutoff:
                ticks.popleft()
        while self._stalls and self._stalls[0][1].end_ns < cutoff:
            self._stalls.popleft()
        while self._prefills and self._prefills[0][1].first_token_ns < cutoff:
            self._prefills.popleft()

    @property
    def tracked(self) -> dict[str, int]:
        """Sizes of every collection (to check that memory stays bounded)."""
        return {
            "streams": len(self._streams),
            "ticks": sum(len(s.ticks) for s in self._streams.values()),
            "stalls": len(self._stalls),
            "prefills": len(self._prefills),
        }

    # -- feed -------------------------------------------------------------------------

    def snapshot(self, now_ns: int) -> dict[str, Any]:
        """Everything in the window as one JSON-ready message."""
        return self.feed(TimelineCursor(), now_ns)

    def feed(self, cursor: TimelineCursor, now_ns: int) -> dict[str, Any]:
        """The next message for the reader of ``cursor``: a snapshot first, then deltas.

        A delta lists the streams whose stamps or metadata changed (with only
        the new stamps) and the stalls and prefill records not sent yet.
        """
        self.prune(now_ns)
        kind = "delta" if cursor.started else "snapshot"
        seen = cursor.seen if cursor.started else {}
        streams: list[dict[str, Any]] = []
        for rid, s in self._streams.items():
            sent_total, sent_version = seen.get(rid, (0, -1))
            if sent_total == s.total and sent_version == s.version:
                continue
            streams.append(self._stream_json(s, sent_total))
        cursor.seen = {rid: (s.total, s.version) for rid, s in self._streams.items()}
        stall_seq = cursor.stall_seq if cursor.started else 0
        prefill_seq = cursor.prefill_seq if cursor.started else 0
        stalls = [self._stall_json(n, r) for n, r in self._stalls if n > stall_seq]
        prefills = [self._prefill_json(r) for n, r in self._prefills if n > prefill_seq]
        cursor.stall_seq, cursor.prefill_seq = self._stall_seq, self._prefill_seq
        cursor.started = True
        return {
            "type": kind,
            "backend": {"name": self.backend.address, "provider": self.backend.provider},
            "now_us": self._us(now_ns),
            "window_s": self.settings.window_s,
            "streams": streams,
            "stalls": stalls,
            "prefills": prefills,
            "untracked": self.untracked,
        }

    def _us(self, ns: int) -> int:
        return (ns - self.origin_ns) // 1000

    def _opt_us(self, ns: int | None) -> int | None:
        return None if ns is None else (ns - self.origin_ns) // 1000

    def _stream_json(self, s: _Stream, sent_total: int) -> dict[str, Any]:
        new = min(s.total - sent_total, len(s.ticks)) if s.total > sent_total else 0
        ticks = list(islice(s.ticks, len(s.ticks) - new, None)) if new else []
        origin = self.origin_ns
        p = s.prefill
        upstream_ttft_ns = None if s.first_token_ns is None else s.first_token_ns - s.forwarded_ns
        return {
            "id": s.request_id,
            "forwarded_us": self._us(s.forwarded_ns),
            "first_token_us": self._opt_us(s.first_token_ns),
            "end_us": self._opt_us(s.end_ns),
            "tick_index": s.total - new,
            "ticks_us": [(t - origin) // 1000 for t in ticks],
            "tokens": s.total,
            "model": s.model,
            "prompt_tokens": s.prompt_tokens,
            "prompt_estimated": s.prompt_estimated,
            "ttft_ms": _ms(s.ttft_ns),
            "upstream_ttft_ms": _ms(upstream_ttft_ns),
            "reasoning_us": self._opt_us(s.reasoning_ns),
            "answer_us": self._opt_us(s.answer_ns),
            "answer_ttft_ms": _ms(s.answer_ttft_ns),
            "reasoning_ms": None if s.reasoning_s is None else round(s.reasoning_s * 1000, 3),
            "reasoning_tokens": s.reasoning_tokens,
            "worst_gap_ms": _ms(s.worst_gap_ns),
            "outcome": s.outcome,
            "stalls": s.stalls,
            "stalled_streams": 0 if p is None else p.stalled_streams,
            "stutter_cost_s": 0.0 if p is None else round(p.stutter_cost_s, 4),
        }

    def _stall_json(self, seq: int, r: StallRecord) -> dict[str, Any]:
        return {
            "seq": seq,
            "stream": r.request_id,
            "start_us": self._us(r.start_ns),
            "end_us": self._us(r.end_ns),
            "baseline_us": r.baseline_ns // 1000,
            "threshold_us": r.threshold_ns // 1000,
            "cause": r.cause.value,
            "culprits": list(r.culprits),
        }

    def _prefill_json(self, r: PrefillRecord) -> dict[str, Any]:
        return {
            "request_id": r.request_id,
            "forwarded_us": self._us(r.forwarded_ns),
            "first_token_us": self._us(r.first_token_ns),
            "prompt_tokens_hint": r.prompt_tokens_hint,
            "stalls": r.stalls,
            "stalled_streams": r.stalled_streams,
            "stutter_cost_s": round(r.stutter_cost_s, 4),
        }


def _ms(ns: int | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)
