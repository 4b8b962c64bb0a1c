"""Stall detection: is this gap far above what the stream usually sees?

Pure: integers of nanoseconds in, verdicts out; no clock, no framework.

A *stall* is a gap longer than ``max(stall_ratio x baseline, stall_floor)``.
The baseline is the lower median of the stream's last ``stream_window`` gaps,
or, while the stream has fewer than ``stream_min_gaps`` of its own, the lower
median of the backend's recent non-stall gaps. With neither, the gap cannot be
judged yet (``Verdict.baseline_ns is None``) and the caller may ask again later.

Cost: each window keeps its values in insertion order, in a machine-integer
array (8 bytes a value: no int object per gap, no deque block of 64 slots), so
adding a gap is an append plus a bounded memmove; an order statistic sorts a
copy once and keeps only its result until the next add. Memory per stream is
about ``8 x stream_window`` bytes plus the array's header; per backend
``8 x backend_window``.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import NamedTuple

NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class StallSettings:
    """Knobs of stall detection and attribution. Validated on construction."""

    ratio: float = 3.0
    """A gap is a stall above ``ratio x baseline`` (``--stall-ratio``).

    3 flags the seed's unchunked prefill (168 ms against 25 ms: 6.7x) and
    leaves its chunked one alone (43 ms against 25 ms: 1.7x)."""
    floor_s: float = 0.05
    """...and above this many seconds (``--stall-floor``): below it nobody sees a stutter,
    and a fast backend's few-millisecond gaps would otherwise flag network jitter."""
    tolerance_s: float = 0.025
    """Slack when matching a culprit's first token to a stall's end (``--stall-tolerance``);
    capped at half the stall's baseline so the next step's first tokens never match."""
    stream_window: int = 16
    """Recent gaps of one stream kept for its baseline."""
    stream_min_gaps: int = 4
    """Own gaps a stream needs before its own baseline is used."""
    backend_window: int = 128
    """Recent non-stall gaps of the whole backend kept (baseline of young streams)."""
    backend_min_gaps: int = 8
    """Backend gaps needed before the backend baseline is used."""
    max_delay_s: float = 2.0
    """Longest wait for attribution to become final; also how long an unjudged gap waits."""
    baseline_quantile: float = 0.5
    """Which order statistic of the window is the baseline (0.5: the lower median)."""
    new_pace_after: int = 32
    """Stalls are kept out of a stream's window, except from this many in a row on: the
    stream's pace really changed (0: stalls always enter the window)."""

    def __post_init__(self) -> None:
        for key in ("ratio", "floor_s", "tolerance_s", "max_delay_s"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"stall {key}: expected a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"stall {key}: expected a finite number >= 0, got {value!r}")
        if self.ratio <= 1:
            raise ValueError(f"stall ratio: must be > 1, got {self.ratio!r}")
        for key in ("stream_window", "stream_min_gaps", "backend_window", "backend_min_gaps"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"stall {key}: expected an integer >= 1, got {value!r}")
        if self.stream_min_gaps > self.stream_window:
            raise ValueError("stall stream_min_gaps: must not exceed stream_window")
        if self.backend_min_gaps > self.backend_window:
            raise ValueError("stall backend_min_gaps: must not exceed backend_window")

    @property
    def floor_ns(self) -> int:
        """``floor_s`` in nanoseconds."""
        return round(self.floor_s * NS_PER_S)

    @property
    def tolerance_ns(self) -> int:
        """``tolerance_s`` in nanoseconds."""
        return round(self.tolerance_s * NS_PER_S)

    @property
    def max_delay_ns(self) -> int:
        """``max_delay_s`` in nanoseconds."""
        return round(self.max_delay_s * NS_PER_S)

    def threshold_ns(self, baseline_ns: int) -> int:
        """``max(ratio x baseline, floor)``: a longer gap is a stall."""
        return max(round(self.ratio * baseline_ns), self.floor_ns)


class MedianWindow:
    """The last ``size`` values (signed 64-bit integers) and their order statistics.

    Adding is an append (and, when full, dropping the oldest: a memmove of at
    most ``size`` machine words); a sorted copy is made only when an order
    statistic is asked for, and only the statistic is kept until the next add.
    The detector asks only for gaps that could be stalls, so per token the
    window costs one append.
    """

    __slots__ = ("_cached", "_cached_q", "_order", "size")

    def __init__(self, size: int) -> None:
        """An empty window of at most ``size`` >= 1 values."""
        if size < 1:
            raise ValueError(f"MedianWindow: size must be >= 1, got {size}")
        self.size = size
        """Most values kept; the oldest leaves when a new one comes."""
        self._order = array("q")
        self._cached_q = -1.0  # the q of ``_cached`` (-1: none)
        self._cached: int | None = None

    def add(self, value: int) -> None:
        """Add ``value``, dropping the oldest when full."""
        order = self._order
        if len(order) >= self.size:
            del order[0]
        order.append(value)
        self._cached_q = -1.0

    def median(self) -> int | None:
        """The lower median (robust to up to half the window being stalls); None when empty."""
        return self.quantile(0.5)

    def quantile(self, q: float) -> int | None:
        """The order statistic at ``floor(q x (n - 1))``; None when empty."""
        if q == self._cached_q:
            return self._cached
        order = self._order
        value = sorted(order)[int(q * (len(order) - 1))] if order else None
        self._cached_q, self._cached = q, value
        return value

    def __len__(self) -> int:
        """Values in the window."""
        return len(self._order)


class Verdict(NamedTuple):
    """How one gap was judged (a named tuple: one is built per gap)."""

    gap_ns: int
    """The gap."""
    baseline_ns: int | None
    """Baseline it was judged against; None when there was none yet (not judged)."""
    threshold_ns: int | None
    """``max(ratio x baseline, floor)``; None when not judged."""

    @property
    def stall(self) -> bool:
        """The gap is a stall."""
        return self.threshold_ns is not None and self.gap_ns > self.threshold_ns


_new_tuple = tuple.__new__


def _verdict(gap_ns: int, baseline_ns: int | None, threshold_ns: int | None) -> Verdict:
    """A ``Verdict`` made without the named tuple's Python-level ``__new__``."""
    return _new_tuple(Verdict, (gap_ns, baseline_ns, threshold_ns))


class _Stream:
    """Baseline state of one stream."""

    __slots__ = ("run", "window")

    def __init__(self, size: int) -> None:
        self.window = MedianWindow(size)
        self.run = 0  # stalls in a row


class StallDetector:
    """Baselines of every open stream of one backend, and the judgement of their gaps."""

    __slots__ = (
        "_backend",
        "_backend_tick",
        "_floor_ns",
        "_q",
        "_ratio",
        "_settings",
        "_stream_min",
        "_streams",
    )

    def __init__(self, settings: StallSettings) -> None:
        """No streams yet."""
        self._settings = settings
        self._streams: dict[str, _Stream] = {}
        self._backend = MedianWindow(settings.backend_window)
        self._backend_tick = 0
        # Copies of the settings the per-gap path reads (attribute lookups are its cost).
        self._ratio = settings.ratio
        self._floor_ns = settings.floor_ns
        self._q = settings.baseline_quantile
        self._stream_min = settings.stream_min_gaps

    def __len__(self) -> int:
        """Streams tracked."""
        return len(self._streams)

    def backend_baseline_ns(self) -> int | None:
        """Median of the backend's recent non-stall gaps, once there are enough."""
        if len(self._backend) < self._settings.backend_min_gaps:
            return None
        return self._backend.quantile(self._settings.baseline_quantile)

    def baseline_ns(self, stream_id: str) -> int | None:
        """The stream's baseline: its own median, else the backend's, else None."""
        own = self._streams.get(stream_id)
        if own is not None and len(own.window) >= self._settings.stream_min_gaps:
            return own.window.quantile(self._settings.baseline_quantile)
        return self.backend_baseline_ns()

    def observe(self, stream_id: str, gap_ns: int) -> Verdict:
        """Judge one gap of a stream and learn from it.

        Judged non-stall gaps join the stream's window and the backend's. Stalls
        stay out of both, so a run of stalls (a long prompt prefilled in chunks,
        a burst of long prompts) does not become the baseline; from
        ``new_pace_after`` stalls in a row on, they join the stream's window, so a
        stream whose pace truly changed adapts. A gap with no baseline to judge it
        by joins the stream's window (bootstrap) and is returned unjudged.
        """
        own = self._streams.get(stream_id)
        if own is None:
            own = self._streams[stream_id] = _Stream(self._settings.stream_window)
        window = own.window
        if len(window) >= self._stream_min:
            baseline = window.quantile(self._q)
        else:
            baseline = self.backend_baseline_ns()
        if baseline is None:
            window.add(gap_ns)
            return _verdict(gap_ns, None, None)
        threshold = max(round(self._ratio * baseline), self._floor_ns)
        if gap_ns > threshold:
            own.run += 1
            after = self._settings.new_pace_after
            if after and own.run >= after:
                window.add(gap_ns)
        else:
            self._learn(own, gap_ns)
        return _verdict(gap_ns, baseline, threshold)

    def learn_quiet(self, stream_id: str, gap_ns: int) -> bool:
        """Learn a gap at or under the floor without judging it, when there is a baseline.

        Such a gap is never a stall (the threshold is at least the floor), so
        ``observe`` would find it quiet and learn it exactly so; this skips
        computing the baseline, which is the cost of ``observe``. ``False``
        (nothing done) for a larger gap or before any baseline: call ``observe``.
        """
        if gap_ns > self._floor_ns:
            return False
        own = self._streams.get(stream_id)
        backend = self._backend
        # ``_learn`` and the windows' ``add`` and ``len``, inlined: this runs once per token.
        backend_short = len(backend._order) < self._settings.backend_min_gaps
        if own is None or len(own.window._order) < self._stream_min:
            if backend_short:
                return False
            if own is None:
                own = self._streams[stream_id] = _Stream(self._settings.stream_window)
        own.run = 0
        window = own.window
        order = window._order  # ``window.add(gap_ns)``, inlined
        if len(order) >= window.size:
            del order[0]
        order.append(gap_ns)
        window._cached_q = -1.0
        self._backend_tick += 1
        if self._backend_tick & 3 == 0 or backend_short:
            backend.add(gap_ns)
        return True

    def _learn(self, own: _Stream, gap_ns: int) -> None:
        """A judged quiet gap joins the stream's window and, sampled, the backend's."""
        own.run = 0
        own.window.add(gap_ns)
        # The backend's pace needs a sample, not every gap of every stream:
        # one in four keeps it as recent at a quarter of the cost.
        self._backend_tick += 1
        if self._backend_tick & 3 == 0 or len(self._backend) < self._settings.backend_min_gaps:
            self._backend.add(gap_ns)

    def judge_late(self, gap_ns: int) -> Verdict:
        """Judge a gap kept from before any baseline existed, against the backend's."""
        baseline = self.backend_baseline_ns()
        if baseline is None:
            return _verdict(gap_ns, None, None)
        verdict = _verdict(gap_ns, baseline, self._settings.threshold_ns(baseline))
        if not verdict.stall:
            self._backend.add(gap_ns)
        return verdict

    def close(self, stream_id: str) -> None:
        """Forget a finished stream."""
        self._streams.pop(stream_id, None)
