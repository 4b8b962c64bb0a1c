"""The upstream read timeout: a body that stops arriving is cut.

The proxy's own upstream client (``proxy.edge.upstream``) has no read timer of
its own: a timer per read would cost every token. So every body
being relayed is looked at once per ``--read-timeout`` by one timer shared by
all of them (``Watchdogs``), and the hot path pays nothing per read. A look
that finds bytes arrived since the last one, or nobody waiting for them (a
slow client: the relay waits on the client's socket and reading is paused on
purpose), marks the body alive. A look that finds the relay still waiting for
upstream bytes two periods or more after that mark expires the body (its
``expire``) at once, and the relay gets ``TimeoutError``: outcome ``timeout``,
the client's stream is cut. A silence is cut between 2x and 3x the read
timeout after the last byte.

One timer for all streams, not one each: a timer handle per open stream was
half a KiB (memory per open stream). And no timeout scope per stream either:
the body itself is expired (a scope cost every request its entry and exit).
The timer runs while some body is watched and at most one period after the
last one left (it is not cancelled per request, only not armed again).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger("tokenstamp.proxy")


class Progress(Protocol):
    """What the watchdog reads of a body being relayed."""

    @property
    def received_bytes(self) -> int:
        """Body bytes arrived so far."""

    @property
    def waiting_for_data(self) -> bool:
        """The relay is blocked on the upstream right now (not on the client, not done)."""

    @property
    def expired(self) -> bool:
        """The body was expired already (``expire``)."""

    def expire(self) -> None:
        """The body fell silent: the relay waiting for it gets ``TimeoutError``."""


class Watchdogs:
    """The one timer that looks at every body being relayed, once per ``period_s``.

    Owned by one application; it runs only while some body is watched.
    """

    __slots__ = ("_handle", "_loop", "_period_s", "_watched")

    def __init__(self, period_s: float) -> None:
        self._period_s = period_s
        self._watched: dict[BodyWatchdog, None] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the app's, known at first watch

    def watch(self, body: Progress) -> BodyWatchdog:
        """Watch ``body`` until ``unwatch``: it is expired once it stops making progress."""
        loop = self._loop
        if loop is None:  # once: on Python 3.11 each lookup is a getpid() system call
            loop = self._loop = asyncio.get_running_loop()
        now = loop.time()
        dog = BodyWatchdog(body, now)
        self._watched[dog] = None
        if self._handle is None:
            self._handle = loop.call_at(now + self._period_s, self._look)
        return dog

    def unwatch(self, dog: BodyWatchdog) -> None:
        """Stop watching (the body ended, either way). The timer is left to run out: its
        next look finds nothing watched and stops it, unless a body came meanwhile (a
        timer cancelled with the last body and armed again with the next was two timer
        operations per request whenever requests do not overlap)."""
        self._watched.pop(dog, None)

    def __len__(self) -> int:
        """Bodies watched right now."""
        return len(self._watched)

    def _look(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        silence = 2 * self._period_s
        for dog in list(self._watched):
            try:
                if dog.silent_for(now) >= silence:
                    self._watched.pop(dog, None)
                    dog.expire(now)
            except Exception:  # one body's look must not end the watch over the others
                log.exception("read watchdog: looking at a body failed")
        self._handle = loop.call_at(now + self._period_s, self._look) if self._watched else None


class BodyWatchdog:
    """One watched body: when a look last found it alive, and its bytes then.

    ``body`` says how many bytes arrived so far and whether the relay is
    blocked on the upstream right now (not on the client). It is read, not
    wrapped: no closure per stream (memory per open stream).
    """

    __slots__ = ("_body", "_mark", "_seen")

    def __init__(self, body: Progress, now: float) -> None:
        self._body = body
        self._seen = body.received_bytes
        self._mark = now  # when a look last found the body alive

    def silent_for(self, now: float) -> float:
        """One look: seconds since a look last found the body alive (0 when this one does)."""
        body = self._body
        total = body.received_bytes
        if total != self._seen or not body.waiting_for_data or body.expired:
            self._seen = total
            self._mark = now
        return now - self._mark

    def expire(self, now: float) -> None:
        """The body fell silent: the relay gets ``TimeoutError``."""
        self._body.expire()
