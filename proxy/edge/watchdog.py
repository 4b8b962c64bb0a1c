"""A backstop for the upstream read timeout: a body that stops arriving is cut.

aiohttp's client enforces ``sock_read`` itself, but after some protocol errors
(bad chunked framing mid-body) it drops that timer and the body just never
ends. ``BodyWatchdog`` looks at the body once per ``--read-timeout`` from a
timer of its own, so the hot path pays nothing per read. A look that finds
bytes arrived since the last one, or nobody waiting for them (a slow client:
the relay waits on the client's socket and reading is paused on purpose),
starts the count again; the second look in a row that finds the relay still
waiting for upstream bytes expires the timeout at once, and the relay gets
``TimeoutError``: outcome ``timeout``, the client's stream is cut. A silence
is cut between 2x and 3x the read timeout after the last byte.

One timer per open stream (the look's), not two: the timeout holds no
deadline until it fires, where pushing a deadline ahead cost a timer handle
per look (memory per open stream).
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Protocol

import aiohttp

_UNKNOWN = object()


def waiting_for_data(body: aiohttp.StreamReader) -> bool:
    """Someone is blocked reading ``body`` for bytes that have not arrived.

    aiohttp keeps the pending read's future in ``_waiter`` (not public API; a
    test pins it). Were it ever gone, every body counts as waited on: the
    watchdog then cuts a long silence whatever its cause, never misses one.
    """
    return getattr(body, "_waiter", _UNKNOWN) is not None


class Progress(Protocol):
    """What the watchdog reads of a body being relayed."""

    @property
    def received_bytes(self) -> int:
        """Body bytes arrived so far."""

    @property
    def waiting_for_data(self) -> bool:
        """The relay is blocked on the upstream right now (not on the client, not done)."""


class ReaderProgress:
    """``Progress`` of a body read from aiohttp's client (``aiohttp.StreamReader``)."""

    __slots__ = ("_body",)

    def __init__(self, body: aiohttp.StreamReader) -> None:
        self._body = body

    @property
    def received_bytes(self) -> int:
        """Bytes the reader has taken in."""
        return self._body.total_bytes

    @property
    def waiting_for_data(self) -> bool:
        """A read is pending."""
        return waiting_for_data(self._body)


class BodyWatchdog:
    """Expires a silence timeout (an ``asyncio.Timeout``) once a body stops making progress.

    An async context manager around the relay, entered inside the timeout it
    watches: the periodic check starts on entry and stops on exit. ``body``
    says how many bytes arrived so far and whether the relay is blocked on the
    upstream right now (not on the client). It is read, not wrapped: no
    closure per stream (memory per open stream).
    """

    __slots__ = (
        "_body",
        "_handle",
        "_loop",
        "_period_s",
        "_quiet",
        "_seen",
        "_timeout",
    )

    def __init__(self, body: Progress, timeout: asyncio.Timeout, period_s: float) -> None:
        self._body = body
        self._timeout = timeout
        self._period_s = period_s
        self._loop = asyncio.get_running_loop()
        self._seen = -1
        self._quiet = 0  # looks in a row that found the relay waiting and no new bytes
        self._handle: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> BodyWatchdog:
        self._check()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        if self._timeout.expired():
            return  # it fired: the relay is being cancelled
        body = self._body
        total = body.received_bytes
        now = self._loop.time()
        if total != self._seen or not body.waiting_for_data:
            self._seen = total
            self._quiet = 0
        else:
            self._quiet += 1
            if self._quiet >= 2:
                self._handle = None
                self._timeout.reschedule(now)  # due now: the relay gets TimeoutError
                return
        self._handle = self._loop.call_at(now + self._period_s, self._check)
