"""The fan-out: the core's one ``Sink``, in front of the subscribers that take each event.

Built once per proxy. A subscriber names the events it takes in ``takes``
(``proxy.core.records.EVENTS``) and has only their methods, with the
``Sink``'s signatures. Per event the fan-out holds the subscribers that take
it, bound once: an event nobody takes is a no-op, an event one subscriber
takes calls that subscriber's method directly (inside a ``try``), and the
rest loop over a tuple.

An exception from one subscriber is swallowed (the others still get the
event, and the caller, the token path, never sees it), counted, and logged
through ``ErrorLog``: at most one line per interval, carrying how many
failures happened since the last line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from proxy.core.ratelog import RateLimitedLog
from proxy.core.records import EVENTS, GapRecorder, RequestLabels

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


_Call = tuple[object, Callable[..., None]]
"""A subscriber and its method for one event."""
_MakeRecorder = Callable[[RequestLabels, str], GapRecorder]
"""A subscriber's ``gap_recorder``."""


def _nobody(*args: object) -> None:
    """An event no subscriber takes."""


def _events_of(subscriber: object) -> tuple[str, ...]:
    """The events ``subscriber`` takes (its ``takes``), checked: each is an event of the
    ``Sink`` and the subscriber has its method. Misuse raises ``TypeError``, naming it."""
    name = type(subscriber).__name__
    events = getattr(subscriber, "takes", None)
    if not isinstance(events, tuple) or not events:
        raise TypeError(f"{name}: a subscriber names the events it takes in a tuple `takes`")
    for event in events:
        if event not in EVENTS:
            raise TypeError(f"{name}.takes: {event!r} is not one of {', '.join(EVENTS)}")
        if not callable(getattr(subscriber, event, None)):
            raise TypeError(f"{name} takes {event!r} but has no method of that name")
    return events


class Fanout:
    """The ``Sink`` of a proxy: each event calls, in order, the subscribers that take it.

    Every event of ``proxy.core.records.Sink`` is an attribute holding the call
    made for it once, at construction. Nested fan-outs are flattened.
    """

    __slots__ = (*EVENTS, "_gap_takers", "errors", "subscribers")

    request_started: Callable[..., None]
    first_token: Callable[..., None]
    phase: Callable[..., None]
    gap: Callable[..., None]
    request_finished: Callable[..., None]
    decoder_error: Callable[..., None]
    unobserved: Callable[..., None]
    stall: Callable[..., None]
    prefill_done: Callable[..., None]

    def __init__(self, *subscribers: object, errors: ErrorLog | None = None) -> None:
        flat: list[object] = []
        for sub in subscribers:
            flat.extend(sub.subscribers if isinstance(sub, Fanout) else (sub,))
        self.subscribers: tuple[object, ...] = tuple(flat)
        """The subscribers, called in this order."""
        self.errors = errors if errors is not None else ErrorLog()
        """Where failures are counted and logged."""
        taken: dict[str, list[_Call]] = {event: [] for event in EVENTS}
        for sub in flat:
            for event in _events_of(sub):
                taken[event].append((sub, getattr(sub, event)))
        for event, calls in taken.items():
            setattr(self, event, self._dispatch(event, tuple(calls)))
        self._gap_takers: tuple[tuple[object, Callable[..., None], _MakeRecorder | None], ...]
        self._gap_takers = tuple(
            (sub, gap, getattr(sub, "gap_recorder", None)) for sub, gap in taken["gap"]
        )

    def _failed(self, sub: object, event: str, exc: Exception) -> None:
        self.errors.record(f"{type(sub).__name__}.{event} raised {type(exc).__name__}", exc)

    def _dispatch(self, event: str, pairs: tuple[_Call, ...]) -> Callable[..., None]:
        """What the fan-out does for ``event``: nothing, one guarded call, or a loop."""
        failed = self._failed
        if not pairs:
            return _nobody
        if len(pairs) == 1:
            ((sub, call),) = pairs

            def one(*args: object) -> None:
                try:
                    call(*args)
                except Exception as exc:
                    failed(sub, event, exc)

            return one

        def each(*args: object) -> None:
            for sub, call in pairs:
                try:
                    call(*args)
                except Exception as exc:
                    failed(sub, event, exc)

        return each

    def gap_recorder(self, labels: RequestLabels, request_id: str) -> GapRecorder:
        """One request's gaps to every subscriber taking them: its own recorder when it has
        one (``Sink``), else its ``gap`` with the request's labels.

        With a single gap-taking subscriber whose recorder exists, that recorder is
        returned as it is (it never raises), so a token costs one call. Otherwise each
        is called in turn, failures counted as for ``gap``.
        """
        takers = self._gap_takers
        recorders: list[tuple[object, GapRecorder]] = []
        for sub, gap, make in takers:
            recorder = None
            if make is not None:
                try:
                    recorder = make(labels, request_id)
                except Exception as exc:
                    self._failed(sub, "gap_recorder", exc)
            if recorder is not None and len(takers) == 1:
                return recorder  # it never raises: a token costs one call
            recorders.append((sub, recorder or _via_gap(gap, labels, request_id)))
        if not recorders:
            return _nobody
        failed = self._failed

        def record(gap_s: float) -> None:
            for sub, rec in recorders:
                try:
                    rec(gap_s)
                except Exception as exc:
                    failed(sub, "gap", exc)

        return record


def _via_gap(gap: Callable[..., None], labels: RequestLabels, request_id: str) -> GapRecorder:
    """A recorder for a subscriber without one of its own: its ``gap`` with the request's labels."""

    def record(gap_s: float) -> None:
        gap(labels, gap_s, request_id)

    return record
