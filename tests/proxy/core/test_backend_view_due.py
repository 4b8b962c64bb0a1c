"""The backend view's due times against the algorithm they replace (kept here as reference).

``BackendView`` remembers why the oldest closed window waits (the silent stream that
blocks it, or the pending stalls) and looks again only when that changes. The
reference looked again on every event while any window waited: the same records must
come out, in the same order, for any sequence of events.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from proxy.core import backend_view
from proxy.core.backend_view import BackendView
from proxy.core.records import Backend, RequestLabels, choice_stream_id
from proxy.core.stall_detector import StallSettings
from tests.stallkit import StallRecorder

MS = 1_000_000
BACKEND = Backend("vllm", "gpu-0")
LABELS = RequestLabels("chat", "m", BACKEND, "team-a")


def _from_source() -> ModuleType:
    """``proxy/core/backend_view.py`` run from its source, as a module of its own.

    In the compiled build ``BackendView`` is a native class an interpreted one cannot
    subclass; the reference subclasses this pure-Python copy (there it is then also
    compared with the compiled view).
    """
    path = Path(backend_view.__file__ or "").with_name("backend_view.py")
    spec = importlib.util.spec_from_file_location("backend_view_from_source", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SOURCE = _from_source()
_NEVER = _SOURCE._NEVER


class ReferenceView(_SOURCE.BackendView):  # type: ignore[misc,name-defined]
    """The view as it was: every event past the head's due time rescans for the blocker."""

    def _advance(self, stamp_ns: int) -> None:
        now = self._now_ns
        if now is None or stamp_ns > now:
            now = self._now_ns = stamp_ns
        if self._pending:
            self._settle_gaps(now)
        if now > self._closed_due_ns:
            self._settle_windows(now)

    def _settle_windows(self, now: int) -> None:
        closed = self._closed
        tol = self._tol_ns
        while closed:
            window = closed[0]
            t1 = window.first_token_ns
            assert t1 is not None
            self._closed_due_ns = t1 + self._closed_wait_ns
            if now - t1 <= self._delay_ns:
                if now - t1 <= tol or self._pending:
                    return
                if self._oldest_other_token_ns(window.request_id) <= t1 + tol:
                    return
            closed.popleft()
            self._report_prefill(window, t1)
        self._closed_due_ns = _NEVER

    def _oldest_other_token_ns(self, request_id: str) -> int:
        for rid, last_ns in self._active.items():
            if rid != request_id:
                return last_ns
        return _NEVER


SETTINGS = [
    StallSettings(),
    # young baselines, a short last chance: stalls, pending gaps and late windows early on
    StallSettings(floor_s=0.01, stream_min_gaps=1, backend_min_gaps=2, max_delay_s=0.15),
    StallSettings(floor_s=0.0, tolerance_s=0.05, stream_min_gaps=2, max_delay_s=0.04),
]
STEPS_NS = [0, 1 * MS, 5 * MS, 20 * MS, 25 * MS, 30 * MS, 60 * MS, 150 * MS, 400 * MS, 2500 * MS]


class SameRecords(RuleBasedStateMachine):
    """Random events to the view and to the reference; their records must stay equal."""

    requests = Bundle("requests")
    streaming = Bundle("streaming")

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000 * MS
        self.serial = 0
        self.last: dict[str, int] = {}

    @initialize(which=st.integers(0, len(SETTINGS) - 1))
    def views(self, which: int) -> None:
        self.ours, self.ours_sink = self._view(BackendView, which)
        self.ref, self.ref_sink = self._view(ReferenceView, which)

    @staticmethod
    def _view(kind: type[BackendView], which: int) -> tuple[BackendView, StallRecorder]:
        sink = StallRecorder()
        return kind(BACKEND, sink, SETTINGS[which]), sink  # type: ignore[arg-type]

    def _both(self, method: str, *args: object, **kwargs: object) -> None:
        getattr(self.ours, method)(*args, **kwargs)
        getattr(self.ref, method)(*args, **kwargs)

    def _tick(self, step: int, late: int) -> int:
        """Move time on by ``STEPS_NS[step]``; the stamp may lag "now" by ``late`` ms."""
        self.now += STEPS_NS[step]
        return self.now - late * MS

    @rule(target=requests, hint=st.none() | st.integers(1, 8000), labelled=st.booleans())
    def forwarded(self, hint: int | None, labelled: bool) -> str:
        self.serial += 1
        rid = f"r{self.serial}"
        if labelled:
            self._both("describe", rid, LABELS, prompt_tokens_hint=hint)
        self._both("forwarded", rid, self._tick(1, 0))
        return rid

    @rule(target=streaming, rid=consumes(requests), step=st.integers(0, len(STEPS_NS) - 1))
    def first_token(self, rid: str, step: int) -> str:
        at = self._tick(step, 0)
        self._both("first_token", rid, at)
        self.last[rid] = at
        return rid

    @rule(
        rid=streaming,
        step=st.integers(0, len(STEPS_NS) - 1),
        late=st.integers(0, 2),
        choice=st.sampled_from([0, 0, 0, 1]),
    )
    def gap(self, rid: str, step: int, late: int, choice: int) -> None:
        stream = rid if choice == 0 else choice_stream_id(rid, choice)
        at = self._tick(step, late)
        start = self.last.get(stream, at)
        self._both("gap", stream, start, at)
        self.last[stream] = at

    @rule(rid=requests, step=st.integers(0, len(STEPS_NS) - 1))
    def gap_before_first_token(self, rid: str, step: int) -> None:
        """Not what a timer sends; the view takes it (a stream it had not seen start)."""
        at = self._tick(step, 0)
        self._both("gap", rid, self.last.get(rid, at), at)
        self.last[rid] = at

    @rule(rid=consumes(streaming), step=st.integers(0, len(STEPS_NS) - 1))
    def finished(self, rid: str, step: int) -> None:
        at = self._tick(step, 0)
        self._both("finished", rid, at)
        if choice_stream_id(rid, 1) in self.last:
            self._both("finished", choice_stream_id(rid, 1), at)

    @rule(rid=consumes(requests), step=st.integers(0, len(STEPS_NS) - 1))
    def gave_up(self, rid: str, step: int) -> None:
        self._both("finished", rid, self._tick(step, 0))

    @rule(step=st.integers(0, len(STEPS_NS) - 1))
    def flush(self, step: int) -> None:
        self._both("flush", self._tick(step, 0))

    @invariant()
    def same_records(self) -> None:
        assert self.ours_sink.stalls == self.ref_sink.stalls
        assert self.ours_sink.prefills == self.ref_sink.prefills
        assert self.ours.recent_culprits == self.ref.recent_culprits
        assert self.ours.tracked == self.ref.tracked


SameRecords.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_same_records_as_the_reference = SameRecords.TestCase


def test_a_silent_stream_holds_the_window_until_it_speaks() -> None:
    """``a`` is silent across ``c``'s window while ``b`` decodes: ``a``'s token releases it."""
    seen = []
    for cls in (BackendView, ReferenceView):
        sink = StallRecorder()
        view = cls(BACKEND, sink, StallSettings(floor_s=0.1))
        view.forwarded("b", 0)
        view.first_token("b", 1 * MS)
        for t in range(1, 101, 10):  # a baseline of b's 10 ms steps
            view.gap("b", t * MS, (t + 10) * MS)
        view.forwarded("a", 100 * MS)
        view.first_token("a", 105 * MS)
        view.forwarded("c", 110 * MS)
        view.first_token("c", 120 * MS)  # the window [110, 120] ms: final after 145 ms
        held = []
        for t in range(111, 161, 10):  # b and c decode, a is silent since 105 ms
            view.gap("b", (t - 10) * MS, t * MS)
            view.gap("c", max(120, t - 9) * MS, (t + 1) * MS)
            held.append([p.request_id for p in sink.prefills])
        view.gap("a", 105 * MS, 162 * MS)  # a speaks (under the floor: no stall)
        view.gap("b", 161 * MS, 171 * MS)  # the next event finds c's window final
        seen.append((held, [p.request_id for p in sink.prefills], sink.stalls))
    b, a = ["b"], ["b", "a"]
    assert seen[0] == seen[1] == ([[], b, b, a, a], ["b", "a", "c"], [])


def test_a_first_token_after_a_gap_releases_the_window_too() -> None:
    """A stream the view saw by a gap first: its first token moves its last token in place."""
    seen = []
    for cls in (BackendView, ReferenceView):
        sink = StallRecorder()
        view = cls(BACKEND, sink, StallSettings())
        view.forwarded("s", 0)
        view.gap("s", 5 * MS, 5 * MS)  # before its first token (the view takes it as it comes)
        view.forwarded("w", 10 * MS)
        view.first_token("w", 20 * MS)  # w's window: final after 45 ms, s silent since 5 ms
        view.flush(60 * MS)
        held = len(sink.prefills)
        view.first_token("s", 70 * MS)
        view.flush(80 * MS)
        seen.append((held, [p.request_id for p in sink.prefills]))
    assert seen[0] == seen[1] == (0, ["w"])


def test_a_first_token_in_place_in_front_of_the_last_silent_stream() -> None:
    """Two streams silent across a window, the first seen by a gap before its first token:
    the view waits on the last of them, and the first one's first token (set in place, in
    front of it) makes it look again, as the reference does on every event."""
    seen = []
    for cls in (BackendView, ReferenceView):
        sink = StallRecorder()
        view = cls(BACKEND, sink, StallSettings())
        view.gap("s", 5 * MS, 5 * MS)  # before its first token: first in line, silent
        view.gap("u", 6 * MS, 6 * MS)  # behind it, silent too: the last silent one
        view.forwarded("w", 10 * MS)
        view.first_token("w", 20 * MS)  # w's window: final after 45 ms
        view.flush(60 * MS)
        held = len(sink.prefills)
        view.first_token("s", 70 * MS)  # in place: s is still first in line, now spoken
        view.flush(80 * MS)
        seen.append((held, [p.request_id for p in sink.prefills]))
    assert seen[0] == seen[1] == (0, ["w"])
